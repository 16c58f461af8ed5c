"""The heap tree build's block size against the budget, on the GPU: µs a build in graph replay
(a batch of one) at the default (``build_tree``'s ``_heap_threads(budget)``) and at each
``--threads``; each tree checked against the heapq twin.

    python tools/heap_threads.py [--vocab 264 32000] [--budgets 16 32 64 128 256 1024] [--threads 32 64 128]

Prints one row a (vocab, budget); ``kernels.tree_build._heap_threads`` is the rule it informs.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, nargs="+", default=[264, 32000])
    ap.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64, 128, 256, 1024])
    ap.add_argument("--threads", type=int, nargs="+", default=[32, 64, 128])
    ap.add_argument("--depths", type=int, default=15)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    from numba import cuda
    from ddtree_numba import kernels as kn
    from ddtree_numba import reference as ref
    from ddtree_numba.kernels.tree_build import TreeBuffers
    from tune_tiles import timed

    rng = np.random.default_rng(0)
    print("| V | budget | default µs | " + " | ".join(f"{t} threads µs" for t in args.threads) + " |")
    print("|---" * (3 + len(args.threads)) + "|")
    for V in args.vocab:
        logits = (rng.standard_normal((args.depths, V)) * 3).astype(np.float32)
        for budget in args.budgets:
            lp, ids = ref.topk_logprobs(logits, min(budget, V))
            want = ref.build_tree(lp, ids, budget)
            d_lp, d_ids = cuda.to_device(lp), cuda.to_device(ids)
            bufs = TreeBuffers.allocate(budget)
            row = []
            for t in [None] + args.threads:
                if kn.build_tree(d_lp, d_ids, budget, threads=t) != want:
                    raise SystemExit(f"V {V} budget {budget} threads {t}: the tree differs from the twin's")
                row.append(timed(lambda s, t=t: kn.build_tree(d_lp, d_ids, budget, out=bufs, stream=s, threads=t),
                                 args.repeat))
            print(f"| {V} | {budget} | " + " | ".join(f"{u:.1f}" for u in row) + " |")


if __name__ == "__main__":
    main()
