"""A same-process A/B of the demo pair's whole rounds on the GPU: side A as the package is, side B with
module-level knobs set, their passes alternated, so that the machine's drift cancels and a change of a
few µs a round shows (thirty-fifth session: old and new in separate processes, one run a side, could
not resolve the ~7 µs the drafter's GQA warp kernel takes off a draft; tools/draft_ab.py could).

Usage (a GPU machine): python tools/round_ab.py --knob MODULE.ATTR=VALUE [--knob ...] [--a-knob ...] [--method ddtree]
    [--budget 16] [--prompts 8] [--new 128] [--passes 5] [--batch S]

e.g. ``--knob ddtree_numba.kernels.gqa.WARP_FROM_SEQUENCES=1`` (the drafter's attention on the warp kernel)
or ``--knob ddtree_numba.decode.device.LEVEL_BUILD_FROM=16``. VALUE is a Python literal (``ast.literal_eval``).
Each side loads its own demo pair (so each keeps its own captured round graphs); B's knobs are set
around each of B's calls (its captures and its host-side choices) and restored after; ``--a-knob``
sets knobs on side A the same way. The passes run A, B then B, A in turn. The sides themselves
differ by a few µs a round (thirty-sixth session, H100: side B ~4 µs slower whatever it held), so
run a change both ways, ``--knob X`` then ``--a-knob X``: half the difference of the two runs' B - A
is the change, half their sum the sides' bias. ``--batch S`` times batched rounds (``generate_batch``
over S prompts at a time) instead. A pass is
``generate`` over the held-out prompts with one CUDA graph a round; a warm-up pass a side first
(compiles, captures). Prints µs a round (the rounds' device time over their count) and tokens/s
(tokens over the rounds' device time: no prefill, so above ``benchmarks/demo_pair.py``'s) per pass and side, the medians, and whether B's tokens equal A's (a knob that changes bits says so).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib

import numpy as np


def parse_knob(text: str):
    """``MODULE.ATTR=VALUE`` -> (module, attribute, value); a ValueError that names what is wrong."""
    name, sep, value = text.partition("=")
    module, dot, attr = name.strip().rpartition(".")
    if not sep or not dot or not attr:
        raise ValueError(f"a knob is MODULE.ATTR=VALUE, got {text!r}")
    try:
        parsed = ast.literal_eval(value.strip())
    except (ValueError, SyntaxError) as exc:
        raise ValueError(f"knob {text!r}: VALUE must be a Python literal ({exc})") from None
    mod = importlib.import_module(module)
    if not hasattr(mod, attr):
        raise ValueError(f"knob {text!r}: {module} has no {attr}")
    return mod, attr, parsed


@contextlib.contextmanager
def knobs_set(knobs):
    """Each (module, attr, value) set for the block, then restored."""
    saved = [(mod, attr, getattr(mod, attr)) for mod, attr, _ in knobs]
    try:
        for mod, attr, value in knobs:
            setattr(mod, attr, value)
        yield
    finally:
        for mod, attr, value in saved:
            setattr(mod, attr, value)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--knob", action="append", default=[], help="MODULE.ATTR=VALUE, set on side B")
    ap.add_argument("--a-knob", action="append", default=[],
                    help="MODULE.ATTR=VALUE, set on side A (the same change on the other side: the sides' own bias "
                         "cancels in the two runs' difference)")
    ap.add_argument("--method", choices=("ddtree", "dflash", "ar"), default="ddtree")
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--batch", type=int, default=0,
                    help="S > 0: the prompts in batches of S through generate_batch (batched rounds), not generate")
    args = ap.parse_args()
    if not args.knob and not args.a_knob:
        ap.error("give a --knob (side B) or an --a-knob (side A)")
    knobs = {"A": [parse_knob(k) for k in args.a_knob], "B": [parse_knob(k) for k in args.knob]}
    import ddtree_numba as dd
    from ddtree_numba.demo import demo_metadata
    t_dir, d_dir = dd.demo_pair()
    prompts = [np.asarray(p["ids"], np.int32) for p in demo_metadata()["prompts"][:args.prompts]]
    sides = {}
    for label in ("A", "B"):
        target = dd.load_target(t_dir, backend="cuda", progress=False)
        sides[label] = (target, None if args.method == "ar" else dd.load_drafter(d_dir, target))

    def run(label):
        target, drafter = sides[label]
        tokens, rounds, seconds, n = [], 0, 0.0, 0
        with knobs_set(knobs[label]):
            if args.batch:
                for i in range(0, len(prompts), args.batch):
                    res = dd.generate_batch(target, drafter, prompts[i:i + args.batch], args.new, method=args.method,
                                            budget=args.budget, graph=True)
                    tokens += [r.tokens for r in res]
                    rounds += len(res.rounds)
                    seconds += res[0].stage_times["round"]      # the batch's rounds, one clock
                    n += sum(len(r.tokens) for r in res)
            else:
                for p in prompts:
                    res = dd.generate(target, drafter, p, args.new, method=args.method, budget=args.budget,
                                      graph=True)
                    tokens.append(res.tokens)
                    rounds += len(res.acceptance_lengths)
                    seconds += res.stage_times["round"]
                    n += len(res.tokens)
        return tokens, 1e6 * seconds / max(rounds, 1), n / max(seconds, 1e-12)

    want = {label: run(label)[0] for label in sides}          # warm-up: compiles, captures
    same = all(np.array_equal(a, b) for a, b in zip(want["A"], want["B"]))
    table = {label: [] for label in sides}
    for i in range(args.passes):
        for label in (("A", "B") if i % 2 == 0 else ("B", "A")):   # ABBA: a side's place in a pass
            _, us, tps = run(label)                                # alternates, so a bias of going
            table[label].append((us, tps))                         # first or second cancels
    print(f"demo pair, {args.method}" + (f" budget {args.budget}" if args.method == "ddtree" else "")
          + f", {len(prompts)} prompts x {args.new} tokens"
          + (f" in batches of {args.batch} (generate_batch)" if args.batch else "")
          + f", one CUDA graph a round; A: {', '.join(args.a_knob) or '-'}; "
          f"B: {', '.join(args.knob) or '-'}")
    print(f"B's tokens equal A's: {same}")
    print("| side | " + " | ".join(f"pass {i + 1}" for i in range(args.passes)) + " | median µs a round | median tokens/s of the rounds |")
    print("|---|" + "---|" * (args.passes + 2))
    for label, rows in table.items():
        print(f"| {label} | " + " | ".join(f"{us:.1f}" for us, _ in rows)
              + f" | {np.median([u for u, _ in rows]):.1f} | {np.median([t for _, t in rows]):,.0f} |")


if __name__ == "__main__":
    main()
