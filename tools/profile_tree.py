"""Launch the split top-K, the level build and the heap build twice per budget (the first pass
compiles), for Nsight Compute; four launches a pass (top-K partial, merge, level build, heap build):

    ncu -k regex:kernel --launch-skip 4 --launch-count 4 python tools/profile_tree.py [V] [budget ...]
"""

import argparse

import numpy as np
from numba import cuda

from ddtree_numba import kernels as kn


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("V", type=int, nargs="?", default=163840, help="vocabulary (default 163840)")
    ap.add_argument("budgets", type=int, nargs="*", default=[16, 1024], help="tree budgets (default 16 1024)")
    args = ap.parse_args()
    V, budgets = args.V, args.budgets
    L = 15
    rng = np.random.default_rng(0)
    x = rng.standard_normal((L, V)).astype(np.float32) * 2
    for d in range(L):
        x[d, rng.choice(V, 8, replace=False)] += np.linspace(9, 4, 8, dtype=np.float32)
    d_x = cuda.to_device(x)
    for budget in budgets:
        lp, ids = (cuda.device_array((L, budget), np.float32), cuda.device_array((L, budget), np.int32))
        sc = kn.TopKScratch.allocate(L, V, budget)
        bufs, lsc = kn.TreeBuffers.allocate(budget), kn.LevelScratch.allocate(L, budget)
        hbufs = kn.TreeBuffers.allocate(budget)
        for _ in range(2):      # the first compiles; ncu sees both
            kn.topk_logprobs(d_x, budget, out=(lp, ids), scratch=sc)
            kn.build_tree_levels(lp, ids, budget, out=bufs, scratch=lsc)
            kn.build_tree(lp, ids, budget, out=hbufs)
        cuda.synchronize()
        print(budget, bufs.to_tree().num_nodes)


if __name__ == "__main__":
    main()
