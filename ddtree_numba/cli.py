"""Command line: ``ddtree-numba demo | generate | sweep | plot | round``.

``demo`` loads the trained demo pair (``ddtree_numba.demo_pair()``), generates from held-out code
prompts with ``ddtree`` and ``ar`` on the best backend present, prints the text with the drafted
tokens the target accepted marked, and the mean acceptance length, target forwards saved and wall
time of each method.

``sweep`` decodes prompts with ar, the DFlash chain and ddtree at every budget
(``ddtree_numba.stats.acceptance_sweep``), prints the table and writes the statistics JSON;
``plot`` turns that JSON into the PNG figures and their captions (``ddtree_numba.plots``).

``round`` runs one DDTree round's tree stages on synthetic drafter logits: top-K, best-first
build, visibility, a target that agrees with the drafter for a while, acceptance and cache
compaction; it prints the tree and the accepted path and checks the chosen backend against the
numpy twins.

``generate`` loads a target (and a DFlash drafter, except for ``--method ar``), runs
``ddtree_numba.generate`` with a progress bar on stderr, prints the generated ids and the
result's summary, and with ``--json FILE`` writes every statistic of the run for plotting.
Bad input exits with status 2 and a one-line message, no traceback. This module parses and
formats only: the work is ``demo``'s, ``stats``'s, ``plots``'s and ``model.loader``'s (which also
chooses the backend).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np


def print_round(rnd, args) -> int:
    """``ddtree-numba round``: a ``demo.SyntheticRound`` as text; 0 when it matched the twins."""
    lp, ids, tree, keep, start = rnd.lp, rnd.ids, rnd.tree, rnd.keep, rnd.start
    depths = lp.shape[0]
    print(f"backend: {rnd.backend}   depths L={depths}  vocab V={args.vocab}  budget={args.budget}  seed={args.seed}")
    print(f"\ntop-K log-probs per depth (first 4 of K={lp.shape[1]}):")
    for d in range(depths):
        row = "  ".join(f"{int(ids[d, r]):>5d}:{lp[d, r]:6.2f}" for r in range(min(4, lp.shape[1])))
        print(f"  depth {d + 1:2d}  {row}")
    print(f"\ntree: {tree.num_nodes} nodes, max depth {int(tree.depths.max(initial=0))}; "
          f"visibility {rnd.vis.shape}, {int(rnd.vis.sum())} visible pairs")
    print(tree.format(root_label="<bonus b>", accepted=keep))
    print(f"\naccepted path (node ids): {keep.tolist()}  -> tokens "
          f"{[int(tree.tokens[k - 1]) for k in keep[1:]]}, new bonus {rnd.bonus}")
    print(f"cache rows {start}..{start + len(keep) - 1} after compaction: "
          f"{rnd.rows[start:start + len(keep), 0].astype(int).tolist()} (were rows start + keep)")
    print(f"\n{rnd.backend} stages {'match' if rnd.matches_twins else 'DO NOT MATCH'} the numpy twins; "
          f"{rnd.seconds * 1e3:.1f} ms")
    return 0 if rnd.matches_twins else 1


class _CliError(Exception):
    """Bad input to a command: printed as one line, exit status 2."""


def _check_writable(flag: str, path: str, work: str) -> None:
    """Refuse an output file that cannot be written before the ``work`` starts, not after it."""
    where = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(where) or not os.access(where, os.W_OK) or os.path.isdir(path) or \
            (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise _CliError(f"{flag} {path}: cannot write a file there (checked before the {work} starts)")


def _parse_ids(what: str, words) -> list[int]:
    """Token ids from ``words`` (argparse's list): ``1,2,3``, ``1 2 3``, or one file of ids
    (separated by commas and/or whitespace, or a JSON list)."""
    if len(words) == 1 and os.path.isfile(words[0]):
        with open(words[0]) as f:
            text = f.read()
        if text.lstrip().startswith("["):
            try:
                items = json.loads(text)
            except json.JSONDecodeError as e:
                raise _CliError(f"{what}: {words[0]} is not a JSON list of ids ({e})") from None
            if not isinstance(items, list):
                raise _CliError(f"{what}: {words[0]} is not a JSON list of ids")
            items = [str(x) for x in items]
        else:
            items = text.replace(",", " ").split()
        source = f" in {words[0]}"
    else:
        items = [t for w in words for t in w.replace(",", " ").split()]
        source = ""
    ids = []
    for item in items:
        try:
            value = int(item, 10)
        except ValueError:
            nor = " (nor a file of ids)" if len(words) == 1 and not source else ""
            raise _CliError(f"{what}: {item!r}{source} is not an integer token id{nor}") from None
        if value < 0:
            raise _CliError(f"{what}: {value}{source} is negative")
        ids.append(value)
    return ids


def _load_pair(target_dir, drafter_dir, backend: str, no_progress: bool, names=("--target", "--drafter"),
               precision=None):
    """``model.loader.load_pair`` with its errors named as ``names`` name the two checkpoints."""
    from .model.loader import PairLoadError, load_pair
    try:
        return load_pair(target_dir, drafter_dir, backend=backend, progress=False if no_progress else None,
                         precision=precision)
    except PairLoadError as e:
        where = (f"{names[0]} {e.path}" if e.role == "target"
                 else f"{names[1]} {e.path} (for {names[0]} {target_dir})")
        raise _CliError(f"{where}: {e}") from None


def _precision(target) -> str:
    """The target's GEMM arithmetic: a cuda target's ``precision``; numpy computes in float32."""
    return getattr(target, "precision", "float32")


def _result_json(args, res, prompt, stops, backend, load_s, precision) -> dict:
    """Every statistic of ``res`` and the run's settings, as plain JSON types."""
    n = int(res.tokens.shape[0])
    return {
        "method": res.method,
        "backend": backend,
        "precision": precision,
        "target": os.path.abspath(args.target),
        "drafter": os.path.abspath(args.drafter) if args.method != "ar" else None,
        "budget": args.budget,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
        "stop_ids": sorted(stops),
        "prompt_ids": prompt,
        "prompt_len": res.prompt_len,
        "tokens": res.tokens.tolist(),
        **res.record(),
        "stopped": bool(res.stopped),
        "rounds": int(res.acceptance_lengths.shape[0]),
        "accepted_depths": res.accepted_depths.tolist(),
        "mean_acceptance_length": res.mean_acceptance_length,
        "forwards_saved": res.forwards_saved,
        "tokens_per_forward": n / max(res.target_forwards, 1),
        "tokens_per_s": n / res.elapsed_s if res.elapsed_s > 0 else None,
        "load_s": load_s,
        "summary": res.summary(file=None),
    }


def run_generate(args) -> int:
    from .decode import generate

    if args.method != "ar" and args.drafter is None:
        raise _CliError(f"--method {args.method} needs --drafter DIR (only --method ar runs without one)")
    if not os.path.isdir(args.target):
        raise _CliError(f"--target {args.target}: no such directory")
    if args.method != "ar" and not os.path.isdir(args.drafter):
        raise _CliError(f"--drafter {args.drafter}: no such directory")
    for flag, value, low in (("--max-new-tokens", args.max_new_tokens, 0), ("--budget", args.budget, 1)):
        if value < low:
            raise _CliError(f"{flag} must be >= {low}, got {value}")
    if args.json:
        _check_writable("--json", args.json, "run")
    if args.method == "ar" and args.drafter is not None:
        print("note: --method ar does not use the drafter; --drafter is ignored", file=sys.stderr)
    prompt = _parse_ids("--prompt-ids", args.prompt_ids)
    if not prompt:
        raise _CliError("--prompt-ids: no ids given (generation needs at least one prompt token)")
    stops = set(_parse_ids("--stop-ids", args.stop_ids or []))

    pair = _load_pair(args.target, None if args.method == "ar" else args.drafter, args.backend, args.no_progress,
                      precision=args.precision)
    target, drafter, backend = pair.target, pair.drafter, pair.backend
    load_s = {"target": pair.target_s, "drafter": pair.drafter_s}
    vocab = target.config.vocab_size
    for what, ids in (("--prompt-ids", prompt), ("--stop-ids", sorted(stops))):
        bad = [i for i in ids if i >= vocab]
        if bad:
            raise _CliError(f"{what}: token id {bad[0]} is out of the target's vocab [0, {vocab})")

    from tqdm.auto import tqdm
    with tqdm(total=args.max_new_tokens, unit="tok", desc=f"{args.method} ({backend})",
              file=sys.stderr, disable=args.no_progress, leave=False) as bar:
        def progress(n):
            bar.update(n - bar.n)
        res = generate(target, drafter, np.asarray(prompt, np.int32), args.max_new_tokens,
                       method=args.method, budget=args.budget, temperature=args.temperature,
                       seed=args.seed, stop_token_ids=sorted(stops), progress=progress,
                       allow_long_context=args.allow_long_context)

    print(f"prompt ({len(prompt)}): {','.join(map(str, prompt))}")
    ended = f", ended at stop id {int(res.tokens[-1])}" if res.stopped else ""
    print(f"generated ({res.tokens.shape[0]}{ended}): {','.join(map(str, res.tokens.tolist()))}")
    res.summary(file=sys.stdout)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(_result_json(args, res, prompt, stops, backend, load_s, _precision(target)), f, indent=1)
            f.write("\n")
        print(f"statistics written to {args.json}", file=sys.stderr)
    return 0


def _add_generate_parser(sub) -> None:
    g = sub.add_parser("generate", help="generate with a target (and a DFlash drafter): ddtree, dflash or ar",
                       description="Generate after --prompt-ids with ddtree, the dflash chain, or "
                                   "autoregressive decoding; print the ids and a summary.")
    g.add_argument("--target", required=True, metavar="DIR", help="HF-format target checkpoint directory")
    g.add_argument("--drafter", metavar="DIR", help="DFlash drafter directory (not needed for --method ar)")
    g.add_argument("--prompt-ids", required=True, nargs="+", metavar="IDS",
                   help="prompt token ids: 1,2,3 or 1 2 3, or a file of ids (commas/whitespace or a JSON list)")
    g.add_argument("--method", choices=["ddtree", "dflash", "ar"], default="ddtree")
    g.add_argument("--budget", type=int, default=64, help="ddtree: tree nodes per round (default 64)")
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    g.add_argument("--seed", type=int, default=0, help="sampling seed (temperature > 0)")
    g.add_argument("--stop-ids", nargs="+", metavar="IDS", help="stop token ids (kept in the output)")
    g.add_argument("--backend", choices=["auto", "numpy", "cuda"], default="auto",
                   help="auto: cuda when a GPU is present and the cuda backend is provided, else numpy")
    _add_precision(g)
    g.add_argument("--json", metavar="FILE", help="write every statistic of the run to FILE as JSON")
    g.add_argument("--allow-long-context", action="store_true",
                   help="run past the target's max_position_embeddings (with a warning) instead of refusing")
    g.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")

def run_demo(args) -> int:
    from tqdm.auto import tqdm

    from .demo import (DEMO_METHODS, MethodTotals, byte_text, demo_budget, demo_metadata, demo_pair, marked_text,
                       run_demo_prompts, warm_up)

    meta = demo_metadata(args.pair)
    prompts = meta["prompts"][:args.prompts]
    if args.prompts < 1:
        raise _CliError(f"--prompts must be >= 1, got {args.prompts}")
    if args.max_new_tokens < 1:
        raise _CliError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.budget is not None and args.budget < 1:
        raise _CliError(f"--budget must be >= 1, got {args.budget}")
    t0 = time.perf_counter()
    pair = _load_pair(*demo_pair(args.pair), args.backend, no_progress=True,
                      names=("the demo target", "the demo drafter"), precision=args.precision)
    target, drafter, backend = pair.target, pair.drafter, pair.backend
    note = f"cuda ({pair.device}; {_precision(target)} GEMMs)" if backend == "cuda" else (
        f"numpy ({pair.reason})" if args.backend == "auto" else "numpy")
    budget = args.budget or demo_budget(meta, backend)
    colour = {"always": True, "never": False}.get(args.colour, sys.stdout.isatty())
    print(f"ddtree-numba demo: the trained demo pair ({meta['target']['params'] / 1e6:.1f} M-parameter byte-level "
          f"DeepSeek-V3-architecture target, {meta['drafter']['params'] / 1e6:.1f} M DFlash drafter), "
          f"backend {note}, loaded in {time.perf_counter() - t0:.1f} s")
    print(f"{len(prompts)} prompts from modules held out of training, {args.max_new_tokens} greedy tokens each; "
          f"ddtree budget {budget}. Drafted tokens the target accepted are "
          + ("on green." if colour else "between \u00ab and \u00bb.") + "\n")
    if backend == "cuda":        # compile every kernel first, so the wall times below are the decode's
        seconds = warm_up(target, drafter, prompts[0]["ids"], budget)
        print(f"(kernels compiled and warmed up in {seconds:.1f} s; not counted below)\n")
    totals = {m: MethodTotals() for m in DEMO_METHODS}
    with tqdm(total=len(DEMO_METHODS) * len(prompts), unit="run", desc=f"demo ({backend})", file=sys.stderr,
              disable=args.no_progress, leave=False) as bar:
        runs = run_demo_prompts(target, drafter, prompts, args.max_new_tokens, budget, on_run=lambda: bar.update(1))
        for run in runs:
            for method, res in run.results.items():
                totals[method].add(res)
            tree, ar = run.results["ddtree"], run.results["ar"]
            tail = byte_text(run.ids).rsplit("\n", 4)[-4:]
            bar.clear()
            print(f"--- prompt {run.index + 1}: {run.module or '?'} (last lines of {len(run.ids)} bytes) ---")
            print("\n".join(tail), end="")
            print(marked_text(tree.tokens.tolist(), tree.acceptance_lengths.tolist(), colour))
            print(f"--- ddtree: {tree.tokens.shape[0]} tokens in {tree.target_forwards} target forwards, mean "
                  f"acceptance length {tree.mean_acceptance_length:.2f}, {tree.elapsed_s:.2f} s; ar: "
                  f"{ar.target_forwards} forwards, {ar.elapsed_s:.2f} s; tokens equal: "
                  f"{'yes' if run.same_tokens else 'NO'}\n")
            if not run.same_tokens:
                print("ddtree-numba demo: ddtree's tokens differ from greedy ar's; this is a bug", file=sys.stderr)
                return 1
    print(f"{'method':<8}{'tokens':>8}{'target forwards':>17}{'forwards saved':>16}{'mean acceptance':>17}{'wall s':>9}")
    for method, t in totals.items():
        print(f"{method:<8}{t.tokens:>8}{t.forwards:>17}{t.tokens - t.forwards:>16}{t.mean_acceptance:>17.2f}"
              f"{t.seconds:>9.2f}")
    d, a = totals["ddtree"], totals["ar"]
    print(f"\nddtree (budget {budget}) used {d.forwards} target forwards where ar used {a.forwards} "
          f"({a.forwards / max(d.forwards, 1):.2f}x fewer), on backend {backend}. Acceptance across budgets: "
          f"`ddtree-numba sweep` and `ddtree-numba plot`; figures/README.md.")
    if backend == "numpy" and d.seconds > a.seconds:
        print("On the numpy backend a verify forward over N tree nodes costs many single-token forwards' worth of "
              "arithmetic (the CPU is compute-bound), so fewer forwards do not mean less wall time here. On a GPU a small "
              "model's forward costs nearly the same for 1 or 1024 rows, and the saved forwards are saved time "
              "(figures/cost_vs_budget.png).")
    return 0


def run_round(args) -> int:
    from .demo import synthetic_round
    from .model.loader import resolve_backend
    return print_round(synthetic_round(resolve_backend(args.backend).backend, args.depths, args.vocab, args.budget,
                                       args.seed), args)


def _pair_paths(args):
    """--target/--drafter, defaulting to the demo pair (--pair, or the package's)."""
    if args.target is None and args.drafter is None:
        from .demo import demo_pair
        return demo_pair(args.pair)
    if args.target is None or args.drafter is None:
        raise _CliError("give both --target and --drafter, or neither (the demo pair)")
    return args.target, args.drafter


def run_sweep(args) -> int:
    from .stats import acceptance_sweep, batch_sweep, format_batch_table, format_table

    target_dir, drafter_dir = _pair_paths(args)
    _check_writable("--out", args.out, "sweep")
    if len(set(args.budgets)) != len(args.budgets):
        raise _CliError(f"--budgets must be distinct, got {args.budgets}")
    if args.max_new_tokens < 1:
        raise _CliError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if any(b < 1 for b in args.budgets):
        raise _CliError(f"--budgets must all be >= 1, got {args.budgets}")
    if args.prompt_ids:
        prompts = [{"ids": _parse_ids("--prompt-ids", args.prompt_ids), "module": None}]
    else:
        from .demo import DEMO_DIR, demo_metadata
        if os.path.abspath(target_dir) != os.path.abspath(os.path.join(args.pair or DEMO_DIR, "target")):
            raise _CliError("--prompt-ids is needed with a --target other than the demo pair's")
        prompts = demo_metadata(args.pair)["prompts"]
    if args.prompts is not None:
        if args.prompts < 1:
            raise _CliError(f"--prompts must be >= 1, got {args.prompts}")
        prompts = prompts[:args.prompts]
    pair = _load_pair(target_dir, drafter_dir, args.backend, no_progress=True, precision=args.precision)
    target, drafter, backend = pair.target, pair.drafter, pair.backend
    launches = "--eager" if args.eager else "--stage-graphs" if args.stage_graphs else None
    if launches and backend != "cuda":
        raise _CliError(f"{launches} says how a cuda backend launches its rounds; this sweep runs on the {backend} "
                        f"backend")
    if launches and args.batch:
        raise _CliError(f"{launches} is for the acceptance sweep; --batch replays every batched round as one CUDA graph")
    if args.batch:
        if len(set(args.batch)) != len(args.batch) or min(args.batch) < 1:
            raise _CliError(f"--batch must be distinct integers >= 1, got {args.batch}")
        stats = batch_sweep(target, drafter, [p["ids"] for p in prompts], args.batch, args.max_new_tokens,
                            args.budgets, progress=False if args.no_progress else None,
                            info=dict(command="ddtree-numba " + " ".join(args.argv)))
        _write_stats(stats, format_batch_table(stats), args.out, "batch statistics", backend)
        return 0 if all(r["equal_ar"] for r in stats["rows"]) else 1
    stats = acceptance_sweep(target, drafter, prompts, args.max_new_tokens, args.budgets,
                             graph=False if args.eager else "stages" if args.stage_graphs else None, progress=False if args.no_progress else None,
                             info=dict(target=os.path.abspath(target_dir), drafter=os.path.abspath(drafter_dir),
                                       command="ddtree-numba " + " ".join(args.argv)))
    _write_stats(stats, format_table(stats), args.out, "statistics", backend)
    return 0 if all(r["equals_ar"] for r in stats["runs"]) else 1


def _write_stats(stats: dict, table: str, path: str, what: str, backend: str) -> None:
    """A sweep's table on stdout, its JSON to ``path``, and where it went on stderr."""
    print(table)
    with open(path, "w") as f:
        json.dump(stats, f, indent=1)
        f.write("\n")
    print(f"{what} written to {path} ({stats['seconds']:.0f} s, backend {backend})", file=sys.stderr)


def run_plot(args) -> int:
    from .plots import write_figures

    def read(path, what):
        if path is None:
            return None
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise _CliError(f"{what} {path}: {e}") from None

    from .stats import check_stats
    raw = read(args.stats, "STATS")
    if isinstance(raw, dict) and raw.get("kind") == "batch_sweep":
        return _plot_batch(raw, args, "batch_sweep.png")
    if isinstance(raw, dict) and raw.get("benchmark") in ("batch", "batch_verify"):
        from .stats import batch_sweep_from_benchmark
        try:
            bench = batch_sweep_from_benchmark(raw)
        except (ValueError, KeyError, TypeError) as e:
            raise _CliError(f"STATS {args.stats}: {e}") from None
        return _plot_batch(bench, args, f"{raw['benchmark']}_benchmark.png")
    stats = check_stats(raw, f"STATS {args.stats}")
    if args.verify_bench and not args.cost:
        raise _CliError("--verify-bench is drawn in the cost figure: give --cost (a sweep run with --backend cuda) too")
    cost = read(args.cost, "--cost")
    if cost is not None:
        check_stats(cost, f"--cost {args.cost}")
    bench = read(args.verify_bench, "--verify-bench")
    if bench is not None and not isinstance(bench, dict):
        raise _CliError(f"--verify-bench {args.verify_bench}: not a JSON object of nodes and ms")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise _CliError(f"--out {args.out} is a file, not a directory: give a directory for the figures")
    if os.path.isdir(args.out) and os.listdir(args.out) and not args.overwrite:
        raise _CliError(f"--out {args.out} is not empty (the committed figures/ is made this way): give "
                        "another directory, or --overwrite")
    written = write_figures(stats, args.out, cost_stats=cost, verify_bench=bench,
                            command="ddtree-numba " + " ".join(args.argv))
    for name, _ in written:
        print(os.path.join(args.out, name))
    print(f"captions in {os.path.join(args.out, 'README.md')}", file=sys.stderr)
    return 0


def _plot_batch(stats, args, name: str) -> int:
    """``ddtree-numba plot`` of a ``sweep --batch`` JSON, or of a ``benchmarks/batch.py`` record:
    one figure, ``name`` in --out, its caption in --out's README.md (other figures' kept)."""
    import matplotlib
    matplotlib.use("Agg")
    from .plots import write_batch_figure
    path = os.path.join(args.out, name)
    if os.path.exists(path) and not args.overwrite:
        raise _CliError(f"{path} exists: give another --out, or --overwrite")
    write_batch_figure(stats, args.out, name, command="ddtree-numba " + " ".join(args.argv))
    print(path)
    print(f"caption in {os.path.join(args.out, 'README.md')}", file=sys.stderr)
    return 0


def _add_pair_dir(parser) -> None:
    parser.add_argument("--pair", metavar="DIR",
                        help="a demo-pair directory (target/, drafter/, demo.json: what tools/train_demo.py --out "
                             "writes); default the package's trained pair")


def _add_precision(parser) -> None:
    parser.add_argument("--precision", choices=["bf16", "fp32"], default=None,
                        help="cuda: the tensor-core GEMMs' arithmetic, bf16 (default) or fp32 (faithful); "
                             "numpy is always float32")


def _add_pair_commands(sub) -> None:
    d = sub.add_parser("demo", help="the trained demo pair: ddtree vs ar on held-out code, accepted spans marked",
                       description="Generate from held-out code prompts with the trained demo pair, ddtree and "
                                   "ar, and show the text with the accepted drafted spans marked.")
    d.add_argument("--backend", choices=["auto", "numpy", "cuda"], default="auto",
                   help="auto: cuda when a GPU is present, else numpy")
    _add_precision(d)
    d.add_argument("--prompts", type=int, default=3, help="held-out prompts to run (default 3)")
    d.add_argument("--max-new-tokens", type=int, default=96)
    d.add_argument("--budget", type=int, default=None,
                   help="ddtree budget (default: demo.json's, 64 on numpy, the most tokens/s on cuda)")
    d.add_argument("--colour", "--color", choices=["auto", "always", "never"], default="auto",
                   help="mark accepted spans in colour (auto: when stdout is a terminal)")
    _add_pair_dir(d)
    d.add_argument("--no-progress", action="store_true")
    s = sub.add_parser("sweep", help="acceptance statistics: ar, the DFlash chain and ddtree at every budget",
                       description="Decode prompts (default: the demo pair's held-out prompts) greedily with ar, "
                                   "the DFlash chain and ddtree at each budget; print the table and write the JSON.")
    s.add_argument("--out", required=True, metavar="FILE", help="statistics JSON to write")
    s.add_argument("--target", metavar="DIR", help="target checkpoint (default: the demo pair)")
    s.add_argument("--drafter", metavar="DIR", help="DFlash drafter (default: the demo pair)")
    _add_pair_dir(s)
    s.add_argument("--prompt-ids", nargs="+", metavar="IDS", help="one prompt (default: the demo prompts)")
    s.add_argument("--prompts", type=int, default=None, help="use only the first N demo prompts")
    s.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512, 1024])
    s.add_argument("--max-new-tokens", type=int, default=128)
    s.add_argument("--backend", choices=["auto", "numpy", "cuda"], default="auto")
    _add_precision(s)
    launches = s.add_mutually_exclusive_group()
    launches.add_argument("--eager", action="store_true",
                          help="cuda: launch every stage of a round from Python and time each one (default: "
                               "each round replays as one CUDA graph, timed as a whole)")
    launches.add_argument("--stage-graphs", action="store_true",
                          help="cuda: each stage of a round replays as its own CUDA graph, timed apart (the "
                               "verify time `ddtree-numba plot --cost` draws; a few µs a stage slower)")
    s.add_argument("--batch", type=int, nargs="+", metavar="B",
                   help="batch sizes: run generate_batch (ar and ddtree at --budgets) at each instead, "
                        "and record tokens/s and the experts a verify reads (`ddtree-numba plot` draws it)")
    s.add_argument("--no-progress", action="store_true")
    p = sub.add_parser("plot", help="figures from a sweep's statistics JSON",
                       description="Write the acceptance figures (PNG) and their captions (README.md).")
    p.add_argument("stats", metavar="STATS",
                   help="statistics JSON from `ddtree-numba sweep` (with --batch: batch_sweep.png), or a "
                        "benchmarks/batch.py record (results/batch.json: batch_benchmark.png)")
    p.add_argument("--out", default="ddtree_figures", metavar="DIR",
                   help="output directory, new or empty (default ddtree_figures/)")
    p.add_argument("--overwrite", action="store_true", help="write into a directory that holds files already")
    p.add_argument("--cost", metavar="FILE", help="a sweep run on the GPU: the verify-time and tokens/s figure")
    p.add_argument("--verify-bench", metavar="FILE",
                   help="verify-forward times of a larger target (benchmarks/verify_forward.py --json)")


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error in one line (the full usage is one ``--help`` away)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def main(argv=None) -> int:
    parser = _Parser(prog="ddtree-numba", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_pair_commands(sub)
    rnd = sub.add_parser("round", help="one DDTree round's tree stages on synthetic drafter logits")
    rnd.add_argument("--backend", choices=["auto", "numpy", "cuda"], default="auto",
                     help="auto: cuda when a real GPU is present, else numpy")
    rnd.add_argument("--depths", type=int, default=6)
    rnd.add_argument("--vocab", type=int, default=1000)
    rnd.add_argument("--budget", type=int, default=24)
    rnd.add_argument("--seed", type=int, default=0)
    _add_generate_parser(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:                    # usage errors and --help: a status, not an exit
        return e.code if isinstance(e.code, int) else 2
    args.argv = argv
    run = {"generate": run_generate, "demo": run_demo, "sweep": run_sweep, "plot": run_plot,
           "round": run_round}[args.command]
    from .model.loader import BackendUnavailable
    try:
        return run(args)
    except BackendUnavailable as e:
        print(f"ddtree-numba {args.command}: --backend {args.backend}: {e}", file=sys.stderr)
        return 2
    except (_CliError, ValueError, OSError) as e:
        # bad input: the loaders and generate() raise ValueError naming the problem
        print(f"ddtree-numba {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
