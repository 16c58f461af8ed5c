"""One tree build (or one top-K) on a fixed draft, launched between ``cuda.profile_start`` and
``cuda.profile_stop`` after a warm-up, for Nsight Compute's source counters on that kernel alone:

    DDTREE_LINEINFO=1 DDTREE_CACHE=0 ncu --profile-from-start off --section SourceCounters \\
        --import-source yes --page source --print-source cuda --csv \\
        python tools/profile_build.py levels 163840 64 > src.csv
    python tools/ncu_lines.py src.csv

STAGE is ``levels`` (the level build), ``heap`` (the heap build) or ``topk`` (top-K at k = budget);
the draft is ``benchmarks/tree_build.py``'s synthetic one (``drafter_logits``, seed 0, L 15).
"""

import argparse
import sys
from pathlib import Path

import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from tree_build import drafter_logits  # noqa: E402

from ddtree_numba import kernels as kn  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", nargs="?", default="levels", choices=("levels", "heap", "topk"))
    ap.add_argument("V", type=int, nargs="?", default=163840, help="vocabulary (default 163840)")
    ap.add_argument("budget", type=int, nargs="?", default=64, help="tree budget (default 64)")
    args = ap.parse_args()
    stage, V, budget = args.stage, args.V, args.budget
    L = 15
    d_x = cuda.to_device(drafter_logits(np.random.default_rng(0), L, V))
    k = min(budget, V)
    lp, ids = cuda.device_array((L, k), np.float32), cuda.device_array((L, k), np.int32)
    scratch = kn.TopKScratch.allocate(L, V, k)
    bufs, lsc = kn.TreeBuffers.allocate(budget), kn.LevelScratch.allocate(L, budget)

    def launch():
        if stage == "topk":
            kn.topk_logprobs(d_x, k, out=(lp, ids), scratch=scratch)
        elif stage == "levels":
            kn.build_tree_levels(lp, ids, budget, out=bufs, scratch=lsc)
        else:
            kn.build_tree(lp, ids, budget, out=bufs)

    kn.topk_logprobs(d_x, k, out=(lp, ids), scratch=scratch)
    launch()                    # compiles
    cuda.synchronize()
    getattr(cuda, "profile_start", lambda: None)()   # (the simulator has none)
    launch()
    cuda.synchronize()
    getattr(cuda, "profile_stop", lambda: None)()
    print(stage, V, budget, "nodes", bufs.to_tree().num_nodes)


if __name__ == "__main__":
    main()
