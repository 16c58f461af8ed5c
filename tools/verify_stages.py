"""Where the demo target's tree-verify forward spends its time, stage by stage, at several tree sizes.

Usage (a GPU machine): python tools/verify_stages.py [--rows 17 33 65] [--keys 330] [--repeat 20]

A random tree of each size after ``--keys`` cached rows. Each stage of each decoder layer
(``CudaTarget.layer_stages``) is launched ``--repeat`` times inside one captured CUDA graph and
replayed (``tune_tiles.timed``: the launch gaps inside a graph included, as in a round); the table
gives its µs summed over the layers. Repeating a stage leaves its inputs as they were, except the
residual stream, which only grows: the timings stand, the values do not matter. Embedding, the
final norm and lm_head are not in it. Shows which stage grows when a verify goes from 17 rows
(budget 16) to 33 or 65.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[17, 33, 65])
    ap.add_argument("--keys", type=int, default=330, help="cached rows before the tree")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    import ddtree_numba as dd
    from numba import cuda
    from tune_tiles import timed
    from verify_forward import prefilled_cache, tree_workspace

    target = dd.load_target(dd.demo_pair()[0], backend="cuda", progress=False)
    rng = np.random.default_rng(0)
    stream = cuda.stream()
    table = {}
    for t in args.rows:
        cache = prefilled_cache(target, args.keys, 1 << (args.keys + t).bit_length(), rng)
        ws = tree_workspace(target, t, args.keys, rng)
        target.forward_device(ws, cache, (), graph=False, stream=stream)        # compiles, sizes the scratch
        stream.synchronize()
        us = table[t] = {}
        for layer in range(target.config.num_hidden_layers):
            for name, enqueue in target.layer_stages(ws, cache, layer):
                us[name] = us.get(name, 0.0) + timed(enqueue, args.repeat)
    names = list(table[args.rows[0]])
    print(f"{'stage (µs, all layers)':44s}" + "".join(f"{t:>9d}" for t in args.rows))
    for name in names:
        print(f"{name:44s}" + "".join(f"{table[t].get(name, 0.0):9.1f}" for t in args.rows))
    print(f"{'total':44s}" + "".join(f"{sum(table[t].values()):9.1f}" for t in args.rows))


if __name__ == "__main__":
    main()
