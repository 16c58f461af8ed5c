"""Acceptance statistics: a budget sweep of DDTree against the DFlash chain, kept as plain JSON.

``acceptance_sweep`` decodes every prompt greedily with ``ar`` (the reference tokens), the DFlash
chain (``dflash``) and ``ddtree`` at each budget, checks that every method's tokens equal ``ar``'s
(greedy speculative decoding is exact), and records each run's per-round statistics plus a few
traced rounds (tree + accepted path) for drawing. ``ddtree-numba sweep`` writes the result to a
file; ``ddtree-numba plot`` and ``ddtree_numba.plots`` read it back. The derived tables
(``summary_rows``, ``depth_survival``, ``acceptance_histogram``) are plain numpy, so a notebook
can recompute every figure from the JSON.

Vocabulary used throughout (per verify round):
  acceptance length   tokens accepted by one verify forward, the round's bonus (root) included:
                      1 + drafted tokens accepted (``GenerationResult.acceptance_lengths``; a last
                      round cut by max_new_tokens still counts all it accepted)
  accepted depth      drafted tokens accepted = acceptance length - 1
  tokens per forward  generated tokens / target forwards, the prefill included (what a user
                      gets; slightly below the mean acceptance length on short runs)
"""

from __future__ import annotations

import datetime
import platform
import time

import numpy as np

from ._checks import check_flag, check_int
from .decode import METHODS, check_graph, check_prompt_ids, generate, generate_batch
from .model.loader import device_name

SCHEMA = 1
DEFAULT_BUDGETS = (16, 32, 64, 128, 256, 512, 1024)


def _run_record(res, budget, prompt_index, equals_ar) -> dict:
    return dict(method=res.method, budget=budget, prompt=prompt_index, **res.record(), equals_ar=bool(equals_ar))


def _example_records(res, budget, prompt_index, rounds) -> list[dict]:
    out = []
    for r, tr in enumerate(res.traces or ()):
        if r >= rounds:
            break
        t = tr.tree
        out.append(dict(budget=budget, prompt=prompt_index, round=r + 1, start=int(tr.start), bonus=int(tr.bonus),
                        tokens=t.tokens.astype(int).tolist(), depths=t.depths.astype(int).tolist(),
                        parents=t.parents.astype(int).tolist(), ranks=t.ranks.astype(int).tolist(),
                        scores=[float(s) for s in t.scores], post=np.asarray(tr.post).astype(int).tolist(),
                        keep=np.asarray(tr.keep).astype(int).tolist()))
    return out


def _distinct_counts(name: str, values, allow_empty: bool = False) -> list:
    """``values`` as an ascending list of distinct integers >= 1, or a ``ValueError`` naming it."""
    values = list(values)
    if (not values and not allow_empty) or any(not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_))
                                               or v < 1 for v in values):
        raise ValueError(f"{name} must be a {'' if allow_empty else 'non-empty '}list of integers >= 1, "
                         f"got {values}")
    if len(set(values)) != len(values):
        raise ValueError(f"{name} must be distinct, got {values}")
    return sorted(int(v) for v in values)


def _prompt_ids(prompts, vocab: int, who: str) -> tuple[list[dict], list[np.ndarray]]:
    """A sweep's ``prompts`` (1-D token-id sequences, or dicts with ``"ids"``), every one checked
    before any decoding (a ``ValueError`` naming the prompt): (the prompts as dicts, their ids as
    int32 arrays)."""
    if isinstance(prompts, (str, bytes, dict)) or not hasattr(prompts, "__iter__"):
        raise ValueError(f"{who}: prompts must be a list of prompts, got {type(prompts).__name__}")
    items = [p if isinstance(p, dict) else {"ids": p} for p in prompts]
    if not items:
        raise ValueError(f"{who} needs at least one prompt")
    ids = []
    for i, p in enumerate(items):
        if "ids" not in p:
            raise ValueError(f"{who}: prompt {i} is a dict without 'ids'")
        if np.ndim(p["ids"]) == 0 and not isinstance(p["ids"], (str, bytes)):
            raise ValueError(f"{who}: prompt {i} is a single id: prompts is a list of prompts, each a sequence of ids")
        try:
            ids.append(check_prompt_ids(p["ids"], vocab))           # generate's check of one prompt
        except ValueError as err:
            raise ValueError(f"{who}: prompt {i}: {err}") from None
    return items, ids


def launches_label(stats: dict) -> str:
    """How a cuda sweep's rounds were launched, from its header's ``graph`` (``acceptance_sweep``),
    for captions: "eager launches", "one CUDA graph a stage, the stages timed apart" or "one CUDA
    graph a round"."""
    return {False: "eager launches", "stages": "one CUDA graph a stage, the stages timed apart"}.get(
        stats.get("graph"), "one CUDA graph a round")


def acceptance_sweep(target, drafter, prompts, max_new_tokens: int = 128, budgets=DEFAULT_BUDGETS,
                     example_budget: int | None = 64, example_rounds: int = 4, stop_token_ids=(),
                     graph: bool | str | None = None, progress: bool | None = None, info: dict | None = None,
                     warmup: bool | None = None) -> dict:
    """Greedy ``ar``, ``dflash`` and ``ddtree`` at every budget on every prompt.

    prompts           list of 1-D int sequences (token ids), or of dicts with ``"ids"`` (and
                      optionally ``"module"``), as ``demo_metadata()["prompts"]`` holds them
    budgets           ddtree node budgets, distinct integers >= 1 (recorded in ascending order)
    example_budget    also trace the first prompt at this budget (host loop) and keep its first
                      ``example_rounds`` rounds (tree, target choices, accepted path); None: none
    graph             ``generate``'s: None (a graph a round where it can), False (eager), "stages"
                      (a graph a stage, each stage timed: the verify time the cost figure draws)
    progress          a tqdm bar over the runs (None: only when stderr is a terminal)
    warmup            first decode the first prompt with every configuration, so
                      the timed runs do not include kernel compilation (None: on the cuda backend)
    info              extra keys for the JSON's header (say, which checkpoints)

    Returns a JSON-ready dict: ``runs`` (one record per method x budget x prompt, the per-round
    ``acceptance_lengths`` and ``tree_sizes``, forwards, stage times, ``equals_ar``), ``examples``
    and the header (backend, device, budgets, prompts, tokens). Raises ``ValueError`` on an empty
    prompt list or a bad budget; an ``equals_ar`` False is recorded, not raised (see ``check``).
    """
    budgets = _distinct_counts("budgets", budgets)
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
    if example_budget is not None:
        example_budget = check_int("example_budget", example_budget, 1)
    example_rounds = check_int("example_rounds", example_rounds, 1)
    check_flag("progress", progress, allow_none=True)
    check_flag("warmup", warmup, allow_none=True)
    check_graph(graph)
    items, ids = _prompt_ids(prompts, target.config.vocab_size, "acceptance_sweep")

    from tqdm import tqdm        # the plain bar: tqdm.auto warns in notebooks without ipywidgets
    plan = [("ar", None), ("dflash", None)] + [("ddtree", b) for b in budgets]
    total = len(plan) * len(ids) + (1 if example_budget else 0)
    runs, examples = [], []
    if warmup if warmup is not None else getattr(target, "backend", "numpy") == "cuda":
        for method, budget in plan:
            # all the new tokens: the same cache size, so the cuda backend's round graph is the
            # one the timed runs replay (decode.device.rounds_for)
            generate(target, None if method == "ar" else drafter, ids[0], max_new_tokens, method=method,
                     budget=budget or 1, graph=graph)
    t0 = time.perf_counter()
    # tqdm's disable=None: a bar only when stderr is a terminal
    with tqdm(total=total, unit="run", desc="sweep", disable=None if progress is None else not progress,
              leave=False) as bar:
        for i, p in enumerate(ids):
            ar_tokens = None
            for method, budget in plan:
                bar.set_postfix_str(f"prompt {i} {method}{'' if budget is None else f' {budget}'}")
                res = generate(target, None if method == "ar" else drafter, p, max_new_tokens, method=method,
                               budget=budget or 1, stop_token_ids=stop_token_ids, graph=graph)
                if method == "ar":
                    ar_tokens = res.tokens
                runs.append(_run_record(res, budget, i, np.array_equal(res.tokens, ar_tokens)))
                bar.update(1)
        if example_budget:
            res = generate(target, drafter, ids[0], max_new_tokens, method="ddtree", budget=example_budget,
                           stop_token_ids=stop_token_ids, trace=True)
            examples = _example_records(res, example_budget, 0, example_rounds)
            bar.update(1)
    header = dict(
        schema=SCHEMA, date=datetime.date.today().isoformat(), backend=getattr(target, "backend", "numpy"),
        device=device_name(getattr(target, "backend", "numpy")), python=platform.python_version(), max_new_tokens=int(max_new_tokens),
        budgets=budgets, graph="auto" if graph is None else graph if graph == "stages" else bool(graph), vocab_size=int(target.config.vocab_size),
        block_size=int(getattr(drafter, "block_size", 0)),
        prompts=[dict(module=p.get("module"), num_ids=int(len(q))) for p, q in zip(items, ids)],
        seconds=round(time.perf_counter() - t0, 1))
    header.update(info or {})
    return dict(header, runs=runs, examples=examples)


def batch_sweep(target, drafter, prompts, batches=(1, 4, 16, 64), max_new_tokens: int = 64, budgets=(16, 64),
                progress: bool | None = None, info: dict | None = None, warmup: bool | None = None,
                repeats: int | None = None) -> dict:
    """Greedy ``ar`` and ``ddtree`` at each budget with ``generate_batch``, at each batch size:
    how throughput and the experts a verify forward reads grow with the number of sequences in
    flight (issue 17).

    prompts   list of 1-D token-id sequences or dicts with ``"ids"`` (as ``acceptance_sweep``). At
              batch B every prompt is decoded: ceil(P / B) calls of B sequences, consecutive
              prompts, cycling through the list to fill the last call (and a batch larger than
              the list), so every batch size decodes the same prompts
    batches   batch sizes, distinct integers >= 1
    warmup    run each (batch, method, budget)'s pass twice untimed first (None: on the cuda
              backend): the first compiles the kernels and captures the round graph, the
              second each prompt layout's prefill graph (``generate_batch`` captures it on a
              layout's second call), so every timed pass replays
    repeats   timed passes over the prompts; ``tokens_per_s`` is their median (None: 3 on the
              cuda backend, where one pass of a small model lasts well under a second and the
              host's jitter shows, else 1)

    Returns a JSON-ready dict, ``kind`` 'batch_sweep', with ``rows``: one per batch x method x
    budget: ``batch``, ``method``, ``budget``, ``tokens_per_s`` (every sequence's tokens over the
    calls' wall time on this backend, the median pass; ``tokens_per_s_runs`` each pass's),
    ``calls`` (a pass's), and over the first pass's calls (the prompts that fill the last call
    counted again): ``mean_acceptance``, ``rows_per_round`` (verify rows),
    ``unique_experts`` (distinct routed experts the router picked per MoE layer and round, mean;
    None without a batched forward), ``rounds``; and ``equal_ar`` (every sequence of every pass
    equal to its own ar at batch 1).
    """
    batches = _distinct_counts("batches", batches)
    budgets = _distinct_counts("budgets", budgets, allow_empty=True)
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
    check_flag("progress", progress, allow_none=True)
    check_flag("warmup", warmup, allow_none=True)
    _, ids = _prompt_ids(prompts, target.config.vocab_size, "batch_sweep")
    moe = [i for i in range(target.config.num_hidden_layers) if target.config.is_moe_layer(i)]
    cuda = getattr(target, "backend", "numpy") == "cuda"
    warmup = cuda if warmup is None else bool(warmup)
    repeats = (3 if cuda else 1) if repeats is None else int(repeats)
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    from tqdm import tqdm
    plan = [("ar", None)] + [("ddtree", b) for b in budgets]
    P = len(ids)
    reference = [generate(target, None, p, max_new_tokens, method="ar").tokens for p in ids]
    rows = []
    t0 = time.perf_counter()
    with tqdm(total=len(plan) * len(batches) * repeats, unit="pass", desc="batch sweep",
              disable=None if progress is None else not progress, leave=False) as bar:
        for B in batches:
            # the calls of a pass: prompt numbers [c B, (c + 1) B) mod P, until every prompt is in one
            calls = [[(c * B + i) % P for i in range(B)] for c in range(-(-P // B))]
            for method, budget in plan:
                def run(numbers):
                    return generate_batch(target, None if method == "ar" else drafter, [ids[i] for i in numbers],
                                          max_new_tokens, method=method, budget=budget or 1)
                for _ in range(2 if warmup else 0):
                    for numbers in calls:
                        run(numbers)
                passes = []
                for _ in range(repeats):
                    passes.append([run(numbers) for numbers in calls])
                    bar.update(1)
                speeds = [sum(len(r.tokens) for res in ps for r in res) / sum(res.elapsed_s for res in ps)
                          for ps in passes]
                first = passes[0]
                rounds = [r for res in first for r in res.rounds]
                lengths = np.concatenate([r.acceptance_lengths for res in first for r in res])
                unique = [r.unique_experts for r in rounds if r.unique_experts is not None]
                rows.append(dict(
                    batch=B, method=method, budget=budget, tokens_per_s=float(np.median(speeds)),
                    tokens_per_s_runs=[float(v) for v in speeds], calls=len(calls),
                    mean_acceptance=float(lengths.mean()) if lengths.size else float("nan"),
                    rows_per_round=float(np.mean([r.rows for r in rounds])) if rounds else 0.0,
                    unique_experts=float(np.mean([u[moe] for u in unique])) if unique and moe else None,
                    rounds=len(rounds),
                    equal_ar=all(np.array_equal(r.tokens, reference[i])
                                 for ps in passes for res, numbers in zip(ps, calls)
                                 for r, i in zip(res, numbers))))
    return dict(kind="batch_sweep", schema=SCHEMA, backend=getattr(target, "backend", "numpy"),
                device=device_name(getattr(target, "backend", "numpy")),
                date=datetime.date.today().isoformat(), platform=platform.platform(),
                max_new_tokens=int(max_new_tokens), batches=batches, budgets=budgets, prompts=len(ids), warmup=warmup,
                repeats=repeats,
                n_routed_experts=int(target.config.n_routed_experts or 0),
                seconds=time.perf_counter() - t0, rows=rows, **(info or {}))


def batch_sweep_from_benchmark(bench: dict, n_routed_experts: int | None = None) -> dict:
    """A ``benchmarks/batch.py`` results record (``benchmarks/results/batch.json``: whole batched
    rounds at the Moonlight-16B-A3B shape, random weights, a ddtree round credited with the demo
    pair's measured mean acceptance) in the form ``batch_sweep`` returns, for ``plots.
    plot_batch_sweep`` and ``ddtree-numba plot``. ``n_routed_experts``: the routed experts of a
    layer (the record's own if it has one; drawn as the ceiling of the experts curve)."""
    kind = bench.get("benchmark") if isinstance(bench, dict) else type(bench).__name__
    if kind not in ("batch", "batch_verify") or not bench.get("rows"):
        raise ValueError("batch_sweep_from_benchmark needs a benchmarks/batch.py record (results/batch.json): "
                         f"a dict with benchmark 'batch' and rows, got {kind!r}")
    rows = bench["rows"]
    missing = {"batch", "method", "budget", "tokens_per_s", "unique_experts"} - set(rows[0])
    if missing:
        raise ValueError(f"batch_sweep_from_benchmark: its rows lack {sorted(missing)}")
    experts = n_routed_experts if n_routed_experts is not None else bench.get("n_routed_experts")
    # (benchmarks/batch.py builds the Moonlight shape only; its records name it from 2026-12-05 on)
    return dict(kind="batch_sweep", source="benchmarks/batch.py", shape=bench.get("shape", "Moonlight-16B-A3B"),
                backend="cuda",
                device=bench["device"], date=bench.get("date"), commit=bench.get("commit"), command=bench.get("command"),
                batches=sorted({int(r["batch"]) for r in rows}),
                budgets=sorted({int(r["budget"]) for r in rows if r["method"] != "ar"}),
                n_routed_experts=int(experts) if experts else None,
                rows=[dict(r, budget=None if r["method"] == "ar" else int(r["budget"])) for r in rows])


def format_batch_table(stats: dict) -> str:
    """A ``batch_sweep`` as a plain-text table."""
    head = f"{'batch':>5} {'method':>7} {'budget':>6} {'tokens/s':>9} {'accept':>6} {'rows/round':>10} " \
           f"{'experts':>7} {'== ar':>5}"
    lines = [head]
    for r in stats["rows"]:
        ue = "-" if r["unique_experts"] is None else f"{r['unique_experts']:.1f}"
        lines.append(f"{r['batch']:>5} {r['method']:>7} {r['budget'] or '-':>6} {r['tokens_per_s']:>9.1f} "
                     f"{r['mean_acceptance']:>6.2f} {r['rows_per_round']:>10.1f} {ue:>7} "
                     f"{'yes' if r['equal_ar'] else 'NO':>5}")
    return "\n".join(lines)


def check(stats: dict) -> None:
    """Raise ``ValueError`` naming the runs whose tokens differ from ``ar``'s (greedy exactness)."""
    bad = [f"{r['method']}{'' if r['budget'] is None else ' ' + str(r['budget'])} on prompt {r['prompt']}"
           for r in stats["runs"] if not r["equals_ar"]]
    if bad:
        raise ValueError("tokens differ from greedy ar for: " + ", ".join(bad))


def _runs(stats, method, budget=None):
    return [r for r in stats["runs"] if r["method"] == method and (budget is None or r["budget"] == budget)]


def _configs(stats):
    """(label, method, budget) for every configuration in the sweep: dflash, then ddtree by budget."""
    out = [("DFlash chain", "dflash", None)] if _runs(stats, "dflash") else []
    return out + [(f"DDTree {b}", "ddtree", b) for b in stats["budgets"]]


def pooled_lengths(stats: dict, method: str, budget: int | None = None) -> np.ndarray:
    """Acceptance lengths of every round of every prompt for one configuration, [R] int.
    ``method`` "ddtree" needs its ``budget`` (one of ``stats["budgets"]``)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method == "ddtree" and budget not in stats["budgets"]:
        raise ValueError(f"ddtree needs one of the sweep's budgets {stats['budgets']}, got {budget}")
    if method != "ddtree" and budget is not None:
        raise ValueError(f"a budget is for ddtree only; {method} takes budget None, got {budget}")
    runs = _runs(stats, method, budget)
    if not runs:
        raise ValueError(f"the statistics hold no {method} runs")
    return np.asarray([a for r in runs for a in r["acceptance_lengths"]], np.int64)


def summary_rows(stats: dict) -> list[dict]:
    """One row per configuration (ar, dflash, ddtree at each budget):

    mean_acceptance     mean acceptance length over all rounds of all prompts (bonus included)
    prompt_min/max      the lowest and highest per-prompt mean acceptance length
    tokens_per_forward  generated tokens / target forwards (prefill included), all prompts pooled
    forwards, tokens    totals; rounds: verify rounds
    verify_ms           mean verify time per round (the backend's stage timer)
    round_ms            mean time per round of all stages but the prefill
    tokens_per_s        generated tokens / elapsed wall clock, all prompts pooled
    all_equal_ar        every run's tokens equal greedy ar's
    """
    rows = []
    for label, method, budget in [("AR", "ar", None)] + _configs(stats):
        runs = _runs(stats, method, budget)
        if not runs:
            continue
        lengths = pooled_lengths(stats, method, budget)
        per_prompt = [np.mean(r["acceptance_lengths"]) for r in runs if r["acceptance_lengths"]]
        rounds = int(lengths.size)
        stage = {k: sum(r["stage_times_s"].get(k, 0.0) for r in runs) for k in runs[0]["stage_times_s"]}
        tokens = sum(r["num_tokens"] for r in runs)
        forwards = sum(r["target_forwards"] for r in runs)
        elapsed = sum(r["elapsed_s"] for r in runs)
        rows.append(dict(
            label=label, method=method, budget=budget, prompts=len(runs), rounds=rounds, tokens=tokens,
            forwards=forwards, mean_acceptance=float(lengths.mean()) if rounds else 0.0,
            prompt_min=float(min(per_prompt)) if per_prompt else 0.0,
            prompt_max=float(max(per_prompt)) if per_prompt else 0.0,
            tokens_per_forward=tokens / max(forwards, 1),
            verify_ms=1e3 * stage.get("verify", 0.0) / max(rounds, 1),
            round_ms=1e3 * sum(v for k, v in stage.items() if k != "prefill") / max(rounds, 1),
            tokens_per_s=tokens / elapsed if elapsed > 0 else 0.0,
            all_equal_ar=all(r["equals_ar"] for r in runs)))
    return rows


def best_row(stats: dict) -> dict:
    """The ddtree row with the highest mean acceptance length (the smallest budget on a tie)."""
    rows = [r for r in summary_rows(stats) if r["method"] == "ddtree"]
    if not rows:
        raise ValueError("the statistics hold no ddtree runs")
    return max(rows, key=lambda r: (round(r["mean_acceptance"], 9), -r["budget"]))


def depth_survival(stats: dict, method: str, budget: int | None = None, depths: int | None = None):
    """Per drafted depth d = 1..D: the fraction of rounds that accepted at least d drafted tokens
    (``reached`` [D]) and the rate at depth d given depth d-1 was accepted (``conditional`` [D],
    NaN where no round reached d-1)."""
    acc = pooled_lengths(stats, method, budget) - 1                     # accepted depths [R]
    if depths is not None:
        depths = check_int("depths", depths, 1)
    depths = depths or max(int(stats.get("block_size", 0)) - 1, int(acc.max(initial=0)), 1)
    d = np.arange(1, depths + 1)
    reached = np.array([(acc >= k).mean() if acc.size else 0.0 for k in d])
    prev = np.concatenate([[1.0], reached[:-1]])
    with np.errstate(invalid="ignore", divide="ignore"):
        conditional = np.where(prev > 0, reached / np.where(prev > 0, prev, 1.0), np.nan)
    return d, reached, conditional


def acceptance_histogram(stats: dict, method: str, budget: int | None = None, max_length: int | None = None):
    """(lengths [1..Lmax], fraction of rounds with each acceptance length)."""
    lengths = pooled_lengths(stats, method, budget)
    if max_length is not None:
        max_length = check_int("max_length", max_length, 1)
    top = max_length or max(int(stats.get("block_size", 0)), int(lengths.max(initial=1)))
    edges = np.arange(1, top + 1)
    counts = np.array([(lengths == k).sum() for k in edges], np.float64)
    return edges, counts / max(lengths.size, 1)


def format_table(stats: dict) -> str:
    """A plain-text table of ``summary_rows``."""
    head = f"{'config':<14}{'rounds':>7}{'mean acc':>10}{'min-max prompt':>16}{'tok/fwd':>9}{'verify ms':>11}{'tok/s':>9}  ==ar"
    lines = [head, "-" * len(head)]
    for r in summary_rows(stats):
        lines.append(f"{r['label']:<14}{r['rounds']:>7}{r['mean_acceptance']:>10.2f}"
                     f"{r['prompt_min']:>8.2f}-{r['prompt_max']:<7.2f}{r['tokens_per_forward']:>9.2f}"
                     f"{r['verify_ms']:>11.2f}{r['tokens_per_s']:>9.1f}  {'yes' if r['all_equal_ar'] else 'NO'}")
    return "\n".join(lines)


def check_stats(stats, what: str = "statistics") -> dict:
    """``stats`` if it is a sweep's statistics (the keys the tables and figures read), else a
    ``ValueError`` naming what is missing."""
    if not isinstance(stats, dict):
        raise ValueError(f"{what}: not a sweep's statistics (a JSON object), got {type(stats).__name__}")
    missing = [k for k in ("runs", "budgets", "prompts", "backend", "device", "date", "max_new_tokens")
               if k not in stats]
    if missing:
        raise ValueError(f"{what}: not a sweep's statistics (no {', '.join(missing)}; make it with `ddtree-numba sweep`)")
    if not isinstance(stats["runs"], list) or not all(isinstance(r, dict) for r in stats["runs"]):
        raise ValueError(f"{what}: 'runs' must be a list of run records (objects)")
    if not isinstance(stats["budgets"], list) or not all(isinstance(b, int) and not isinstance(b, bool)
                                                          for b in stats["budgets"]):
        raise ValueError(f"{what}: 'budgets' must be a list of integers, got {stats['budgets']!r}")
    for r in stats["runs"]:
        absent = [k for k in ("method", "budget", "prompt", "acceptance_lengths", "num_tokens", "target_forwards",
                              "stage_times_s", "elapsed_s", "equals_ar") if k not in r]
        if absent:
            raise ValueError(f"{what}: a run record lacks {', '.join(absent)}")
    return stats


def projected_tokens_per_s(stats: dict, verify_bench: dict) -> tuple[np.ndarray, np.ndarray]:
    """(budgets [P], projected tokens/s [P]) of a larger target from its verify-forward times
    (``verify_bench``: ``nodes`` = rows verified, root included, so budget = nodes - 1; ``ms`` per
    forward) and a sweep's ddtree rows: mean acceptance length / (verify ms + the sweep's other
    per-round ms), the sweep's figures interpolated in log2(budget), held constant outside."""
    rows = [r for r in summary_rows(stats) if r["method"] == "ddtree"]
    try:
        nodes = np.asarray(verify_bench["nodes"], np.float64)
        ms = np.asarray(verify_bench["ms"], np.float64)
    except (KeyError, TypeError, ValueError):
        raise ValueError("verify_bench needs 'nodes' and 'ms' lists (benchmarks/verify_forward.py --json)") from None
    if (nodes.ndim != 1 or nodes.shape != ms.shape or nodes.size == 0 or (nodes < 2).any()
            or (nodes != np.round(nodes)).any() or not (np.isfinite(ms) & (ms > 0)).all()):
        raise ValueError(f"verify_bench: 'nodes' (whole numbers >= 2) and 'ms' (finite, > 0) must be equal-length "
                         f"lists, got {nodes.tolist()} and {ms.tolist()}")
    if not rows:
        raise ValueError("the statistics hold no ddtree runs")
    budgets = nodes - 1
    lb = np.log2([r["budget"] for r in rows])
    acc = np.interp(np.log2(budgets), lb, [r["mean_acceptance"] for r in rows])
    other = np.interp(np.log2(budgets), lb, [r["round_ms"] - r["verify_ms"] for r in rows])
    return budgets, acc / (1e-3 * (ms + other))
