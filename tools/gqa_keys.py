"""The drafter's GQA attention against the context length, on a GPU: µs a launch (graph replay,
as tools/tune_tiles.py times it) for the warp kernel (the default without a mask,
``method="warp"``) at its default tiles and each of ``--warp-tiles`` (each bit-checked against the
split kernel's fused launch first), the split kernel's fused launch (``method="split"``), the split
kernel and merge launch apart (``fuse=False``), and the merge launch alone, at the demo drafter's
heads (8 query, 4 key/value, head dim 32, 16 block rows). The grid is sized from the keys (a cache of exactly the live rows),
so the slope over keys is the cost of a split.

    python tools/gqa_keys.py [--keys 48 128 256 330 520 1000] [--repeat 20] [--once KEYS]
        [--warp-tiles 1,8 2,12 ...]   (RW,NW: kernels.gqa._WarpTiles)

``--once KEYS``: launch the fused kernel twice at KEYS keys and stop (for Nsight Compute:
``ncu -k regex:gqa --launch-skip 1 --launch-count 1 ...``).
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
    ap.add_argument("--keys", type=int, nargs="+", default=[48, 128, 256, 330, 520, 1000])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--once", type=int, default=None)
    ap.add_argument("--warp-tiles", nargs="+", default=[], help="RW,NW tiles to time beside the default")
    args = ap.parse_args()
    from numba import cuda
    from tune_tiles import timed
    gqa = importlib.import_module("ddtree_numba.kernels.gqa")
    rng = np.random.default_rng(0)
    dev = lambda a: cuda.to_device(np.ascontiguousarray(a))
    Hq, Hkv, DH, T = 8, 4, 32, 16
    tiles = [gqa._warp_tiles(DH, Hkv * T * (Hq // Hkv))] + [gqa._WarpTiles(*map(int, w.split(","))) for w in args.warp_tiles]
    print("| keys | splits | " + " | ".join(f"warp {','.join(map(str, map(int, t)))} µs" for t in tiles)
          + " | split fused µs | split + merge µs | merge alone µs |")
    print("|---|---|" + "---|" * (len(tiles) + 3))
    for S in ([args.once] if args.once else args.keys):
        q = dev(rng.standard_normal((T, Hq * DH), np.float32))
        k_ctx, v_ctx = (dev(rng.standard_normal((S, Hkv * DH), np.float32)) for _ in range(2))
        k_blk, v_blk = (dev(rng.standard_normal((T, Hkv * DH), np.float32)) for _ in range(2))
        out = cuda.device_array((T, Hq * DH), np.float32)
        meta = dev(np.array([S, T], np.int32))
        scratch = gqa.GQAScratch(T, Hq, DH, S + T)
        run = lambda s, fuse=True, method="split", wt=None: gqa.enqueue_gqa_attention(
            q, k_ctx, v_ctx, out, meta=meta, scale=0.1, scratch=scratch, k_blk=k_blk, v_blk=v_blk, fuse=fuse,
            method=method if fuse else "split", warp_tiles=wt, stream=s)
        if args.once:
            run(0, method="warp")
            run(0, method="warp")
            cuda.synchronize()
            return
        run(0)
        want = out.copy_to_host()
        us = []
        for wt in tiles:                      # the split kernel's bits, then the time, every tile
            out.copy_to_device(np.full(want.shape, np.nan, np.float32))
            try:
                run(0, method="warp", wt=wt)
                us.append(timed(lambda s, wt=wt: run(s, method="warp", wt=wt), args.repeat))
            except Exception as exc:          # (a tile past the SM's registers or shared memory)
                print(f"warp tiles {wt}: {type(exc).__name__}: {str(exc)[:60]}")
                us.append(float("nan"))
                continue
            if not np.array_equal(out.copy_to_host().view(np.uint32), want.view(np.uint32)):
                raise SystemExit(f"warp tiles {wt} at {S} keys: not the split kernel's bits")
        split = gqa._tiles(DH).SPLIT
        th = gqa.THREADS
        merge = lambda s: gqa._gqa_combine_kernel[(T * Hq * DH + th - 1) // th, th, s](
            scratch.o, scratch.ml, meta, split, True, out)
        us += [timed(run, args.repeat), timed(lambda s: run(s, False), args.repeat), timed(merge, args.repeat)]
        print(f"| {S} | {(S + T + split - 1) // split} | " + " | ".join(f"{u:.2f}" for u in us) + " |")


if __name__ == "__main__":
    main()
