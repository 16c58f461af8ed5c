"""The heap build's warp kernel (its arg-max by redux.sync, and by shuffles: ``warp-shfl``) against
its block kernel and the level build, on the GPU: µs a
build (mean of ``--repeat`` copies in one replayed graph, best of 5 replays), alternated over
``--passes``, every tree checked against the heapq twin first.

    python tools/warp_build_ab.py [--budgets 16 32 64] [--passes 2] [--repeat 20]

Drafts: ``synthetic`` (``benchmarks/tree_build.py``'s ``drafter_logits``, V 163840, L 15: the
issue-15 figure's, a tree one or two levels deep), ``random264`` (``tools/heap_threads.py``'s
logits x 3 at V 264) and ``demo`` (the demo drafter's 15 distributions after a held-out prompt,
numpy backend: a deep tree). Then top-K + build in one graph on the synthetic draft (the issue's
figure: ``warp`` against ``levels``), queued behind a sleeping kernel as ``tree_build.py`` times
it.

A third kernel, the frontier kept sorted across the warp (a pop a broadcast and two ballots, no
arg-max; 19d1c48), was measured here in the forty-third session and removed: slower on every draft
(H100, µs at budgets 16 / 32 / 64 on the demo draft: 15.5 / 30.3 / 60.4 against the warp kernel's
10.1 / 18.5 / 37.8).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))


def first_difference(got, want) -> str:
    """Where two trees first differ: the node count, or the first node whose fields differ."""
    if got.num_nodes != want.num_nodes:
        return f"{got.num_nodes} nodes against {want.num_nodes}"
    for i in range(want.num_nodes):
        a = (int(got.tokens[i]), int(got.depths[i]), int(got.parents[i + 1]), int(got.ranks[i]), float(got.scores[i]))
        b = (int(want.tokens[i]), int(want.depths[i]), int(want.parents[i + 1]), int(want.ranks[i]),
             float(want.scores[i]))
        if a != b:
            return f"node {i + 1}: (token, depth, parent, rank, score) {a} against {b}"
    return "the same fields"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    from numba import cuda

    from ddtree_numba import kernels as kn
    from ddtree_numba import reference as ref
    from tree_build import _graph_us, demo_draft_logits, drafter_logits
    from tune_tiles import timed

    L = 15
    drafts = {"synthetic": drafter_logits(np.random.default_rng(0), L, 163840),
              "random264": (np.random.default_rng(0).standard_normal((L, 264)) * 3).astype(np.float32),
              "demo": np.asarray(demo_draft_logits(), np.float32)}
    methods = ("warp", "warp-shfl", "block", "levels")   # warp-shfl: WARP_REDUX off (shuffle rounds)
    tb = kn.tree_build
    cases = []
    for name, logits in drafts.items():
        for budget in args.budgets:
            lp, ids = ref.topk_logprobs(logits, min(budget, logits.shape[1]))
            want = ref.build_tree(lp, ids, budget)
            d_lp, d_ids = cuda.to_device(lp), cuda.to_device(ids)
            bufs = kn.TreeBuffers.allocate(budget)
            scratch = kn.LevelScratch.allocate(L, budget)

            def enqueue(s, m, d_lp=d_lp, d_ids=d_ids, budget=budget, bufs=bufs, scratch=scratch):
                if m == "levels":
                    kn.build_tree_levels(d_lp, d_ids, budget, out=bufs, scratch=scratch, stream=s)
                elif m == "warp-shfl":
                    tb.WARP_REDUX = False
                    try:
                        kn.build_tree(d_lp, d_ids, budget, out=bufs, stream=s, method="warp")
                    finally:
                        tb.WARP_REDUX = True
                else:
                    kn.build_tree(d_lp, d_ids, budget, out=bufs, stream=s, method=m)

            for m in methods:
                enqueue(0, m)
                got = bufs.to_tree()
                if got != want:
                    raise SystemExit(f"{name} budget {budget} {m}: the tree differs from the twin's "
                                     f"({first_difference(got, want)})")
            depth = int(want.depths.max()) if want.num_nodes else 0
            cases.append((name, budget, depth, enqueue))
    times = {}
    for p in range(args.passes):
        order = methods if p % 2 == 0 else methods[::-1]
        for name, budget, depth, enqueue in cases:
            for m in order:
                times.setdefault((name, budget, m), []).append(timed(lambda s, m=m: enqueue(s, m), args.repeat))
    print("| draft | budget | tree depth | " + " | ".join(f"{m} µs" for m in methods) + " |")
    print("|---" * (3 + len(methods)) + "|")
    for name, budget, depth, _ in cases:
        cells = [" / ".join(f"{u:.1f}" for u in times[(name, budget, m)]) for m in methods]
        print(f"| {name} | {budget} | {depth} | " + " | ".join(cells) + " |")

    # the figure: top-K + build, one graph, queued
    x = cuda.to_device(drafts["synthetic"])
    V = x.shape[1]
    print("\ntop-K + build on the synthetic draft (V 163840, L 15), one graph, queued, µs:")
    print("| budget | top-K + warp | top-K + levels | top-K alone |")
    print("|---|---|---|---|")
    for budget in [b for b in args.budgets if b <= kn.tree_build.WARP_BUDGET]:
        lp = cuda.device_array((L, budget), np.float32)
        ids = cuda.device_array((L, budget), np.int32)
        tsc = kn.TopKScratch.allocate(L, V, budget)
        bufs, scratch = kn.TreeBuffers.allocate(budget), kn.LevelScratch.allocate(L, budget)

        def topk(s):
            kn.topk_logprobs(x, budget, out=(lp, ids), scratch=tsc, stream=s)

        def warp(s):
            topk(s)
            kn.build_tree(lp, ids, budget, out=bufs, stream=s, method="warp")

        def levels(s):
            topk(s)
            kn.build_tree_levels(lp, ids, budget, out=bufs, scratch=scratch, stream=s)

        s = cuda.stream()
        keys = ("warp", "levels", "topk")
        fns = {"warp": warp, "levels": levels, "topk": topk}
        row = {k: [] for k in keys}
        for p in range(args.passes):
            for k in (keys if p % 2 == 0 else keys[::-1]):
                row[k].append(_graph_us(s, fns[k]))
        print(f"| {budget} | " + " | ".join(" / ".join(f"{u:.1f}" for u in row[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()
