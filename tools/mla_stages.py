"""Time the MLA attention's launches one by one at the Moonlight and demo shapes, on a GPU.

Usage (a GPU machine): python tools/mla_stages.py [--shape moonlight demo] [--cases 1 16 64 256 1024 16x1 16x17]
                       [--prefix 1024] [--repeat 20]

A case ``t`` is one sequence with a random tree of t new rows after ``--prefix`` cached rows; a
case ``SxT`` is S sequences of one cache pool, each a random tree of T rows (one launch set,
``seqs``). Each launch of ``kernels.mla._mla_launches`` (and the whole attention) is repeated
``--repeat`` times in one captured CUDA graph (``tune_tiles.timed``); the table gives µs a launch,
the launch gap inside a graph included. The inputs are random: the timings stand, the values do
not matter. Prints a markdown table; appends nothing.

``--tune``: also time the scores and p @ c_kv launches under each of ``CANDIDATES`` (tiles never
change the bits), and print each case's best against the tile ``kernels.mla._tiles`` picks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = {  # heads, latent C, rope R
    "moonlight": (16, 512, 64),
    "demo": (8, 64, 16),
}


# (bm, bn, bk, tm, tn) candidates for both the scores and the p @ c_kv kernels
CANDIDATES = [(16, 16, 32, 1, 1), (16, 16, 32, 2, 2), (16, 32, 16, 2, 2), (16, 32, 32, 2, 2), (16, 64, 16, 2, 4),
              (32, 32, 16, 2, 2), (32, 64, 16, 4, 4), (64, 64, 16, 4, 4), (64, 128, 16, 4, 8),
              (128, 128, 16, 8, 8),
              # few-row candidates with longer steps (fewer barriers a chunk): the narrow latent's p @ c_kv
              (8, 16, 32, 1, 1), (8, 16, 64, 1, 1), (8, 16, 128, 1, 1), (16, 16, 64, 1, 1), (16, 16, 128, 1, 1),
              (8, 8, 64, 1, 1), (16, 8, 64, 1, 1)]


def random_parents(rng, n, tree="deep"):
    """A tree of n nodes: ``verify_forward``'s ``TREES[tree]`` ("deep": each parent one of the 8
    nodes before, ~n / 4.5 deep; "ddtree": a best-first DDTree build, at most 15 deep)."""
    bench = str(Path(__file__).resolve().parents[1] / "benchmarks")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    from verify_forward import TREES
    return TREES[tree](rng, n)[0]


def case_inputs(rng, heads, latent, rope, prefix, n_seq, t, batched, tree="deep"):
    """Device arrays for ``_mla_launches``: n_seq sequences of t tree rows after ``prefix``."""
    from numba import cuda
    from ddtree_numba.kernels.mla import MLAScratch
    from ddtree_numba.reference.visibility import visibility_bits
    cap = prefix + t
    rows = n_seq * t
    f = lambda *s: cuda.to_device(rng.standard_normal(s).astype(np.float32))
    bits = np.concatenate([visibility_bits(random_parents(rng, t, tree)) for _ in range(n_seq)])
    args = dict(q_lat=f(rows, heads * latent), q_pe=f(rows, heads * rope),
                out_lat=cuda.device_array((rows, heads * latent), np.float32))
    kw = dict(vis_bits=cuda.to_device(bits), meta=cuda.to_device(np.array([prefix, t], np.int32)),
              scale=0.07, scratch=MLAScratch(rows, heads, cap, latent))
    if batched:
        args.update(c_kv=f(n_seq, cap, latent), k_pe=f(n_seq, cap, rope))
        seqs = np.array([(prefix, t, z * t, z) for z in range(n_seq)], np.int32)
        kw.update(seqs=cuda.to_device(seqs), max_rows=t)
    else:
        args.update(c_kv=f(cap, latent), k_pe=f(cap, rope))
    return args, kw


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), nargs="+", default=["moonlight", "demo"])
    ap.add_argument("--cases", nargs="+", default=["1", "16", "64", "256", "1024", "16x1", "16x17"])
    ap.add_argument("--prefix", type=int, default=1024, help="cached rows before each tree (demo: 330)")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--tune", action="store_true", help="time the candidate tiles too")
    ap.add_argument("--tree", choices=["deep", "ddtree"], default="deep",
                    help="deep: random, ~n / 4.5 deep (the runs' tree so far); ddtree: a DDTree build, at most 15 deep")
    ap.add_argument("--fp32-scores", action="store_true",
                    help="MLA's scores in float32 chains (kernels.mla.MMA_SCORES off; on by default)")
    ap.add_argument("--fp32-pv", action="store_true",
                    help="MLA's p @ c_kv in float32 chains (kernels.mla.MMA_PV off; on by default)")
    ap.add_argument("--mma-pv-tile", help="warps,mt,hb: the tensor-core p @ c_kv kernel's tile (kernels.mla._MMA_PV_TILE)")
    ap.add_argument("--mma-pv-tokens", type=int,
                    help="tokens a block over the prefix chunks (kernels.mla._MMA_PV_TOKENS)")
    ap.add_argument("--softmax", help="lanes,threads: the softmax kernel's lanes a head and threads a block "
                                      "(kernels.mla.SOFTMAX_LANES, overriding its table, and THREADS)")
    ap.add_argument("--mma-step", type=int, help="channels the tensor-core scores kernel stages a step")
    ap.add_argument("--mma-tile", help="wm,wn,mt,nt: the tensor-core scores kernel's tile (overrides kernels.mla._MMA_TILES)")
    args = ap.parse_args()
    import importlib
    mla_module = importlib.import_module("ddtree_numba.kernels.mla")
    if args.mma_tile:
        mla_module._MMA_TILE = tuple(int(v) for v in args.mma_tile.split(","))
    if args.mma_pv_tokens:
        mla_module._MMA_PV_TOKENS = args.mma_pv_tokens
    if args.softmax:
        mla_module.SOFTMAX_LANES, mla_module.THREADS = (int(v) for v in args.softmax.split(","))
    if args.mma_step:
        mla_module._MMA_STEP = args.mma_step
    if args.mma_pv_tile:
        mla_module._MMA_PV_TILE = tuple(int(v) for v in args.mma_pv_tile.split(","))
    mla_module.MMA_SCORES = mla_module.MMA_SCORES and not args.fp32_scores
    mla_module.MMA_PV = mla_module.MMA_PV and not args.fp32_pv
    from tune_tiles import timed
    from ddtree_numba.kernels.mla import _tiles, _mla_launches

    rng = np.random.default_rng(0)
    for shape in args.shape:
        heads, latent, rope = SHAPES[shape]
        prefix = args.prefix if shape == "moonlight" else 330
        names, table = None, []
        for case in args.cases:
            n_seq, t = (int(v) for v in case.split("x")) if "x" in case else (1, int(case))
            a, kw = case_inputs(rng, heads, latent, rope, prefix, n_seq, t, "x" in case, args.tree)
            launches = lambda s: _mla_launches(**a, **kw, stream=s)
            names = [n for n, _ in launches(0)]
            us = [timed(lambda s, i=i: launches(s)[i][1](), args.repeat) for i in range(len(names))]
            whole = timed(lambda s: [go() for _, go in launches(s)], args.repeat)
            table.append((case, us, whole))
            if args.tune:
                picked = _tiles(t * heads, latent, n_seq)
                for which, name in ((0, "scores"), (1, "pv")):
                    if (name == "scores" and mla_module.MMA_SCORES) or (
                            name == "pv" and mla_module.MMA_PV and latent >= mla_module.MMA_PV_LATENT):
                        continue        # the float32 tiles: the tensor-core kernels do not take them
                    times = []
                    for cand in CANDIDATES:
                        tiles = (cand, picked[1]) if which == 0 else (picked[0], cand)
                        go = lambda s, tiles=tiles: dict(_mla_launches(**a, **kw, tiles=tiles, stream=s))[name]()
                        times.append((timed(go, args.repeat), cand))
                    now = dict((c, u) for u, c in times).get(picked[which]) or us[names.index(name)]
                    best = min(times)
                    print(f"{shape} {case} {name}: picked {picked[which]} {now:.1f} µs; best {best[1]} "
                          f"{best[0]:.1f} µs; " + ", ".join(f"{c}: {u:.1f}" for u, c in sorted(times)[:4]))
        print(f"\nMLA attention, {shape} shape (H {heads}, C {latent}, R {rope}), {prefix} cached rows, µs a launch")
        print("| case | " + " | ".join(names) + " | whole |")
        print("|---" * (len(names) + 2) + "|")
        for case, us, whole in table:
            print(f"| {case} | " + " | ".join(f"{u:.1f}" for u in us) + f" | {whole:.1f} |")


if __name__ == "__main__":
    main()
