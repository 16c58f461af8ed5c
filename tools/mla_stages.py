"""Time the MLA attention's launches one by one at the Moonlight and demo shapes, on a GPU.

Usage (a GPU machine): python tools/mla_stages.py [--shape moonlight demo] [--cases 1 16 64 256 1024 16x1 16x17]
                       [--prefix 1024] [--repeat 20]

A case ``t`` is one sequence with a random tree of t new rows after ``--prefix`` cached rows; a
case ``SxT`` is S sequences of one cache pool, each a random tree of T rows (one launch set,
``seqs``). Each launch of ``kernels.mla.mla_launches`` (and the whole attention) is repeated
``--repeat`` times in one captured CUDA graph (``tune_tiles.timed``); the table gives µs a launch,
the launch gap inside a graph included. The inputs are random: the timings stand, the values do
not matter. Prints a markdown table; appends nothing.
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


def random_parents(rng, n):
    parents = np.full(n, -1, np.int32)
    for i in range(1, n):
        parents[i] = rng.integers(max(0, i - 8), i)
    return parents


def case_inputs(rng, heads, latent, rope, prefix, n_seq, t, batched):
    """Device arrays for ``mla_launches``: n_seq sequences of t tree rows after ``prefix``."""
    from numba import cuda
    from ddtree_numba.kernels.mla import MLAScratch
    from ddtree_numba.reference.visibility import visibility_bits
    cap = prefix + t
    rows = n_seq * t
    f = lambda *s: cuda.to_device(rng.standard_normal(s).astype(np.float32))
    bits = np.concatenate([visibility_bits(random_parents(rng, t)) for _ in range(n_seq)])
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
    args = ap.parse_args()
    from tune_tiles import timed
    from ddtree_numba.kernels.mla import mla_launches

    rng = np.random.default_rng(0)
    for shape in args.shape:
        heads, latent, rope = SHAPES[shape]
        prefix = args.prefix if shape == "moonlight" else 330
        names, table = None, []
        for case in args.cases:
            n_seq, t = (int(v) for v in case.split("x")) if "x" in case else (1, int(case))
            a, kw = case_inputs(rng, heads, latent, rope, prefix, n_seq, t, "x" in case)
            launches = lambda s: mla_launches(**a, **kw, stream=s)
            names = [n for n, _ in launches(0)]
            us = [timed(lambda s, i=i: launches(s)[i][1](), args.repeat) for i in range(len(names))]
            whole = timed(lambda s: [go() for _, go in launches(s)], args.repeat)
            table.append((case, us, whole))
        print(f"\nMLA attention, {shape} shape (H {heads}, C {latent}, R {rope}), {prefix} cached rows, µs a launch")
        print("| case | " + " | ".join(names) + " | whole |")
        print("|---" * (len(names) + 2) + "|")
        for case, us, whole in table:
            print(f"| {case} | " + " | ".join(f"{u:.1f}" for u in us) + f" | {whole:.1f} |")


if __name__ == "__main__":
    main()
