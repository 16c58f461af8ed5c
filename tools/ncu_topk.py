"""Top-K + level build launched eagerly at budgets 16, 64, 256, 1024 (V 163840, L 15), for
`ncu --clock-control none --metrics gpu__time_duration.sum python3 tools/ncu_topk.py`: each
kernel's own device time, without launch or graph costs. Runs each budget twice (the second is
the warm one)."""

import argparse
import sys
from pathlib import Path

import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from tree_build import drafter_logits  # noqa: E402

from ddtree_numba import kernels as kn  # noqa: E402


def main():
    argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()   # (--help only)
    L, V = 15, 163840
    dx = cuda.to_device(drafter_logits(np.random.default_rng(0), L, V))
    for budget in (16, 64, 256, 1024):
        lpd, idd = cuda.device_array((L, budget), np.float32), cuda.device_array((L, budget), np.int32)
        scr = kn.TopKScratch.allocate(L, V, budget)
        bufs, sc = kn.TreeBuffers.allocate(budget), kn.LevelScratch.allocate(L, budget)
        for _ in range(2):
            print(f"budget {budget}", flush=True)
            kn.topk_logprobs(dx, budget, out=(lpd, idd), scratch=scr)
            kn.build_tree_levels(lpd, idd, budget, out=bufs, scratch=sc)
            cuda.synchronize()


if __name__ == "__main__":
    main()
