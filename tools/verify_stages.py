"""Where the demo target's tree-verify forward spends its time, stage by stage, at several tree sizes.

Usage (a GPU machine): python tools/verify_stages.py [--rows 17 33 65] [--keys 330] [--repeat 20]

A random tree of each size after ``--keys`` cached rows. Each stage of each decoder layer
(``CudaTarget.layer_stages``) is launched ``--repeat`` times inside one captured CUDA graph and
replayed (``tune_tiles.timed``: the launch gaps inside a graph included, as in a round); the table
gives its µs summed over the layers. Repeating a stage leaves its inputs as they were, except the
residual stream, which only grows: the timings stand, the values do not matter. Then the launches
outside the layers (the visibility bits, the embedding, the final norm + lm_head), their sum with
the layers', and the whole forward repeated in one graph: what the stages' sum leaves out (the
gaps between different kernels, which a stage repeated alone does not have). Shows which stage
grows when a verify goes from 17 rows (budget 16) to 33 or 65, or from 1 (ar) to 17.
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

    from ddtree_numba import kernels as kn
    target = dd.load_target(dd.demo_pair()[0], backend="cuda", progress=False)
    eps = target.config.rms_norm_eps
    rng = np.random.default_rng(0)
    stream = cuda.stream()
    table, whole = {}, {}
    for t in args.rows:
        cache = prefilled_cache(target, args.keys, 1 << (args.keys + t).bit_length(), rng)
        ws = tree_workspace(target, t, args.keys, rng)
        target.forward_device(ws, cache, (), graph=False, stream=stream)        # compiles, sizes the scratch
        stream.synchronize()
        us = table[t] = {}
        for layer in range(target.config.num_hidden_layers):
            for name, enqueue in target.layer_stages(ws, cache, layer):
                us[name] = us.get(name, 0.0) + timed(enqueue, args.repeat)
        outside = {
            "(outside) visibility bits": lambda s: kn.enqueue_visibility_bits(ws.parents, ws.vis_bits, stream=s),
            "(outside) embedding": lambda s: kn.enqueue_embedding(ws.ids, target.embed_tokens, ws.x, ws.n_rows,
                                                                  stream=s),
            "(outside) final norm + lm_head": lambda s: (
                kn.enqueue_rms_norm(ws.x, target.norm, eps, ws.normed, ws.n_rows, stream=s),
                kn.enqueue_linear(ws.normed, target.lm_head, ws.logits, ws.n_rows, **target.gemm_args, stream=s)),
        }
        for name, enqueue in outside.items():
            us[name] = timed(enqueue, args.repeat)
        whole[t] = timed(lambda s: target.forward_device(ws, cache, (), graph=False, stream=s), args.repeat)
    names = list(table[args.rows[0]])
    print(f"{'stage (µs, all layers)':44s}" + "".join(f"{t:>9d}" for t in args.rows))
    for name in names:
        print(f"{name:44s}" + "".join(f"{table[t].get(name, 0.0):9.1f}" for t in args.rows))
    print(f"{'sum of the stages':44s}" + "".join(f"{sum(table[t].values()):9.1f}" for t in args.rows))
    print(f"{'the whole forward, repeated in one graph':44s}" + "".join(f"{whole[t]:9.1f}" for t in args.rows))


if __name__ == "__main__":
    main()
