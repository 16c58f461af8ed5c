"""Top-K of short rows on a GPU: the warp-a-row kernel against the split kernels, µs a launch in
graph replay (tools/tune_tiles.py's ``timed``), bits checked against each other.

    python tools/topk_short_rows.py [--vocab 264 1024] [--k 1 16 32 64] [--rows 15]

The default rule (``kernels.topk._rows_path``: V <= 320 and k <= 32, or k = 1) comes from
this table.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, nargs="+", default=[264, 1024])
    ap.add_argument("--k", type=int, nargs="+", default=[1, 16, 32, 64])
    ap.add_argument("--rows", type=int, default=15)
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    from numba import cuda
    from tune_tiles import timed
    topk = importlib.import_module("ddtree_numba.kernels.topk")
    rng = np.random.default_rng(0)
    print("| V | k | rows µs | split µs | same bits |")
    print("|---|---|---|---|---|")
    for V in args.vocab:
        x = (rng.standard_normal((args.rows, V)) * 3).astype(np.float32)
        d_x = cuda.to_device(x)
        for k in args.k:
            outs = {m: (cuda.device_array((args.rows, k), np.float32), cuda.device_array((args.rows, k), np.int32))
                    for m in ("rows", "split")}
            sc = topk.TopKScratch.allocate(args.rows, V, k)
            us = {}
            for m in ("rows", "split"):
                if m == "rows" and V > topk.ROWS_MAX_VOCAB:
                    continue
                run = (lambda s, m=m: topk.topk_logprobs(d_x, k, out=outs[m], scratch=sc, stream=s, method=m))
                us[m] = timed(run, args.repeat)
            same = all(np.array_equal(outs["rows"][i].copy_to_host(), outs["split"][i].copy_to_host())
                       for i in (0, 1)) if "rows" in us else "-"
            print(f"| {V} | {k} | {us.get('rows', float('nan')):.2f} | {us['split']:.2f} | {same} |")


if __name__ == "__main__":
    main()
