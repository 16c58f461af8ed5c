"""The level build's few-ties path against its preorder path, on a GPU (thirty-seventh session;
NOTES Next 000000): µs a build (a replayed graph, queued: the graph's device time) with each
``--slots`` value of ``tie_slots`` (default: the launcher's default ``few_ties_limit(budget)``,
``TIE_SLOTS`` and 0), alternated, on a draft whose depth-1 log-probs hold an exact
tie (``drafter_logits(default_rng(0))`` at V 163840, the draft ``benchmarks/tree_build.py
--kernels`` builds on) and on one with many ties (logits rounded to 1/8); every tree checked
against the heap twin's.

Usage (a GPU machine): python tools/level_ties_ab.py [--budgets 256 1024] [--passes 2]
[--slots default 256 0]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from tree_build import _graph_us, drafter_logits  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--slots", nargs="+", default=["default", "256", "0"],
                    help="tie_slots values to alternate ('default': the launcher's, few_ties_limit(budget))")
    args = ap.parse_args()
    from numba import cuda
    from ddtree_numba import kernels as kn
    from ddtree_numba import reference as ref
    from ddtree_numba.reference.tree_build import few_ties_limit

    L, V = 15, 163840
    stream = cuda.stream()
    one_tie = drafter_logits(np.random.default_rng(0), L, V)
    many = np.round(one_tie * 8) / 8
    for name, x in (("one tie", one_tie), ("logits in 1/8 steps", many)):
        for budget in args.budgets:
            lp_h, ids_h = ref.topk_logprobs(x, budget)
            want = ref.build_tree(lp_h, ids_h, budget)
            lp, ids = cuda.to_device(lp_h), cuda.to_device(ids_h)
            bufs, sc = kn.TreeBuffers.allocate(budget), kn.LevelScratch.allocate(L, budget)
            cells = []
            for _ in range(args.passes):
                for name_ts in args.slots:
                    ts = None if name_ts == "default" else int(name_ts)
                    us = _graph_us(stream, lambda s: kn.build_tree_levels(lp, ids, budget, out=bufs, scratch=sc,
                                                                         stream=s, tie_slots=ts))
                    ok = bufs.to_tree() == want
                    label = f"default ({few_ties_limit(budget)})" if ts is None else ts
                    cells.append(f"tie_slots {label}: {us:.1f}{'' if ok else ' DIFFERS FROM THE TWIN'}")
            print(f"level build, {name}, budget {budget}, µs: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
