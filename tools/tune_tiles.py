"""Time the drafter's attention and the GEMMs of a demo-pair round under candidate tiles, on a GPU.

Usage (a GPU machine): python tools/tune_tiles.py [--repeat 20] [--gemm-rows 17 1 33 65] [--only gqa gemm]

(The target's MLA attention: tools/mla_stages.py --tune.) Tiles never change the bits (GQA: every field but KT and SPLIT; GEMMs:
``_Tile``), so they are free to tune. Each candidate is launched ``--repeat`` times inside one
captured CUDA graph, replayed a few times; the table gives the mean µs a launch (the launch gap
inside a graph included) at the demo pair's shapes: the drafter's GQA over 330 context keys + 16 block rows (8 query
heads, 4 kv heads, head dim 32), and the target's and drafter's projections (the stacked ones
too: the drafter's q | k | v, K 256 -> N 512; the target's q_a | kv_a, K 256 -> N 208) at the
``--gemm-rows`` (17 and 1 by default; 33 and 65 are the verify rows of budgets 32 and 64). For
the 256-output shapes at up to 32 rows also staged tiles that hold whole rows in one block (the
question of PLANS §6's norm epilogue: is one block no slower than today's many?).
The tables in kernels/gqa.py (``_gpu_tiles``: the split kernel's; ``_warp_tiles``: the warp
kernel's, the default for the drafter) and kernels/linear.py hold the winners.
"""

from __future__ import annotations

import argparse

import numpy as np


def timed(enqueue, repeat):
    """Mean µs of one ``enqueue(stream)`` inside a graph of ``repeat`` of them."""
    from numba import cuda
    from ddtree_numba._device import capture_graph, replay_graph
    exe = capture_graph(lambda s: [enqueue(s) for _ in range(repeat)])
    stream = cuda.stream()
    replay_graph(exe, stream)
    best = np.inf
    for _ in range(5):
        a, b = cuda.event(), cuda.event()
        a.record(stream)
        replay_graph(exe, stream)
        b.record(stream)
        b.synchronize()
        best = min(best, cuda.event_elapsed_time(a, b) * 1000 / repeat)
    return best


def report(name, results):
    base = results[0][1]
    for tiles, us in sorted(results, key=lambda r: r[1]):
        mark = "  (current)" if tiles == results[0][0] else ""
        print(f"  {name:10s} {str(tiles):44s} {us:7.2f} µs  x{base / us:4.2f}{mark}")


def _shape(text):
    """K,N -> (K, N), positive integers."""
    try:
        k, n = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is K,N (two integers), got {text!r}") from None
    if k <= 0 or n <= 0:
        raise argparse.ArgumentTypeError(f"K and N must be positive, got {text!r}")
    return k, n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--keys", type=int, default=330, help="cached / context keys (the demo's ~330)")
    ap.add_argument("--quick", action="store_true", help="two candidates a kernel, one shape (a smoke run)")
    ap.add_argument("--gemm-rows", type=int, nargs="+", default=[17, 1], help="the GEMMs' live rows")
    ap.add_argument("--gemm-shapes", nargs="+", metavar="K,N", type=_shape,
                    default=[(256, 768), (256, 128), (768, 256), (256, 264), (256, 512), (256, 208)],
                    help="the GEMMs' K,N (default: every demo-pair projection)")
    ap.add_argument("--sequences", type=int, default=1,
                    help="GQA: this many sequences in one launch (the batched round's drafts), each --keys keys")
    ap.add_argument("--only", choices=["gqa", "gemm"], nargs="+", default=["gqa", "gemm"],
                    help="which kernels to time")
    args = ap.parse_args()
    cut = (lambda xs: xs[:2]) if args.quick else (lambda xs: xs)
    from numba import cuda
    import importlib
    gqa, linear = (importlib.import_module(f"ddtree_numba.kernels.{m}") for m in ("gqa", "linear"))
    rng = np.random.default_rng(0)
    dev = lambda a: cuda.to_device(np.ascontiguousarray(a))
    R = args.repeat

    S0 = args.keys
    CAP = 1 << (S0 + 80).bit_length()

    # -- GQA: Hq = 8, Hkv = 4, Dh = 32, 330 context keys + 16 block rows (a sequence)
    Hq, Hkv, DH, S, T, Z = 8, 4, 32, S0, 16, args.sequences
    q = dev(rng.standard_normal((Z * T, Hq * DH), np.float32))
    ctx = (CAP, Hkv * DH) if Z == 1 else (Z, CAP, Hkv * DH)
    k_ctx, v_ctx = (dev(rng.standard_normal(ctx, np.float32)) for _ in range(2))
    k_blk, v_blk = (dev(rng.standard_normal((Z * T, Hkv * DH), np.float32)) for _ in range(2))
    out = cuda.device_array((Z * T, Hq * DH), np.float32)
    meta = dev(np.array([S, T], np.int32) if Z == 1 else np.tile(np.array([[S, T]], np.int32), (Z, 1)))
    scratch = gqa.GQAScratch(Z * T, Hq, DH, CAP + T)
    T0 = gqa._tiles(DH, Z > 1)
    KT, SP = T0.KT, T0.SPLIT
    cands = [T0] + [gqa._Tiles(*c, SP) for c in (
        (16, KT, 1, 4, 128, 32), (8, KT, 1, 2, 128, 32), (8, KT, 1, 4, 64, 32), (16, KT, 2, 2, 128, 32),
        (4, KT, 1, 1, 128, 32), (16, KT, 1, 2, 256, 32), (8, KT, 1, 1, 256, 32), (4, KT, 1, 2, 64, 32),
        (32, KT, 2, 2, 256, 32), (32, KT, 1, 4, 256, 32), (32, KT, 2, 4, 128, 32))]
    print(f"GQA, {Z} sequence(s) of {T} queries, {S} context keys + {T} block keys:")

    def gqa_sweep(name, candidates, knobs, label):
        """Time each candidate (``knobs(cand)``: its launch's method and tiles) and report them; the
        first (the default) once, though the list may hold it again."""
        res = []
        for cand in cut(list(dict.fromkeys(candidates))) if "gqa" in args.only else ():
            try:
                us = timed(lambda s: gqa.enqueue_gqa_attention(q, k_ctx, v_ctx, out, meta=meta, scale=0.1,
                                                               scratch=scratch, k_blk=k_blk, v_blk=v_blk,
                                                               stream=s, **knobs(cand)), R)
                res.append((label(cand), us))
            except Exception as exc:
                print(f"  {cand}: {type(exc).__name__}: {str(exc)[:80]}")
        if res:
            report(name, res)

    gqa_sweep("gqa split", cands, lambda c: dict(tiles=c, method="split"), lambda c: tuple(c[:6]))
    # the warp kernel (the default without a mask): RW rows, NW warps a block
    gqa_sweep("gqa warp", [gqa._warp_tiles(DH, Hkv * T * (Hq // Hkv) * Z)] + [gqa._WarpTiles(rw, nw) for rw, nw in (
        (1, 8), (2, 8), (4, 8), (8, 8), (1, 12), (2, 12), (4, 12), (8, 12), (1, 16), (2, 16), (4, 16), (8, 16))],
        lambda c: dict(warp_tiles=c, method="warp"), tuple)

    # -- GEMMs (bf16 weights): the demo's K x N at --gemm-rows rows
    Tl, St = linear._Tile, linear._Staged
    buf = 1 << (max(args.gemm_rows) - 1).bit_length()        # the workspace's rows, a power of two
    for rows in cut(tuple(args.gemm_rows)) if "gemm" in args.only else ():
        n_rows = dev(np.array([rows], np.int32))
        for k, n in cut(args.gemm_shapes):
            x = dev(rng.standard_normal((buf, k), np.float32))
            w = dev((rng.standard_normal((n, k), np.float32).view(np.uint32) >> 16).astype(np.uint16))
            out = cuda.device_array((buf, n), np.float32)
            res = []
            cands = [None] + [Tl(mt, rt, nw) for mt in (1, 2) for rt in (1, 2, 4) for nw in (1, 2, 4)
                              if 8 * rt < 2 * max(rows, 8) and nw <= max(1, k // 64)]
            if n == 256 and rows <= 32:
                # whole rows in one block (a norm could be its epilogue, PLANS §6): staged tiles of
                # 256 outputs, the rows in n8 tiles, no ring (a ring of 256 rows is past 48 KB)
                cands += [St(wm, 1, 256 // (16 * wm), rt, 0) for wm in (4, 8) for rt in (2, 4)]
            seen = set()
            for cand in cut(cands):
                # the tile the launch takes (a forced tile that does not fit is replaced: time it once)
                cand = linear._plan(x, 0, w.reshape(1, n, k), None, buf, "bf16", cand).tile
                if cand in seen:
                    continue
                seen.add(cand)
                try:
                    us = timed(lambda s: linear.enqueue_linear(x, w, out, n_rows, precision="bf16", tile=cand,
                                                               stream=s), R)
                except Exception as exc:     # a tile that does not fit this shape: say so, go on
                    print(f"  {cand}: {type(exc).__name__}: {str(exc)[:80]}")
                    continue
                res.append((tuple(cand), us))
            print(f"GEMM {rows} rows, K {k} -> N {n}:")
            if res:
                report("linear", res)


if __name__ == "__main__":
    main()
