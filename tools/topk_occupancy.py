"""The split top-K by slices a row and blocks an SM, on a GPU: µs a top-K (a replayed graph, queued:
its device time) at V = 163840, L = 15, for (G slices, threads a block, blocks an SM that the
launch bounds ask for) at k = 16, 32, 64, each result checked bit for bit against the twin first.

Why (forty-third session): the partial kernel takes 108 registers a thread, so one block of 512
threads fills an SM's register file, and more slices a row (G 16, 240 blocks) ran in two waves
(``topk.CAPPED_SLICES``). Asking the launch bounds for two blocks an SM caps a thread at 64
registers (ptxas: 236 bytes spilled), which lets G 16 run in one wave with half the entries a
thread: the first read's chain (~7 of its 14.6 µs scale with the entries) against spills and a
longer merge.

Usage (a GPU machine): python tools/topk_occupancy.py [--vocab 163840] [--ks 16 32 64] [--passes 2]
    [--configs G,T,B ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from tree_build import _graph_us, drafter_logits  # noqa: E402

# (G, threads, blocks an SM); the first is the default split at k >= 32 (G 8, 512 threads)
CONFIGS = [(8, 512, 1), (8, 512, 2), (16, 512, 1), (16, 512, 2), (16, 256, 2), (16, 256, 3), (32, 256, 3),
           (8, 1024, 1), (16, 1024, 1)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=163840)
    ap.add_argument("--depths", type=int, default=15)
    ap.add_argument("--ks", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--configs", nargs="+", default=None, help="G,threads,blocks triples (default CONFIGS)")
    args = ap.parse_args()
    configs = CONFIGS if args.configs is None else [tuple(int(v) for v in c.split(",")) for c in args.configs]
    from numba import cuda

    from ddtree_numba import kernels as kn
    from ddtree_numba import reference as ref
    from ddtree_numba.kernels import topk as tk
    L, V = args.depths, args.vocab
    x_h = drafter_logits(np.random.default_rng(0), L, V)
    x = cuda.to_device(x_h)
    bits = x.view(np.uint32)
    stream = cuda.stream()
    print(f"top-K µs (queued graph), V {V}, L {L}; columns: (G slices, threads, blocks an SM)")
    print("| k | default | " + " | ".join(f"{g}, {t}, {b}" for g, t, b in configs) + " |")
    print("|---|---|" + "---|" * len(configs))
    for k in args.ks:
        lp_r, ids_r = ref.topk_logprobs(x_h, k)
        lp, ids = cuda.device_array((L, k), np.float32), cuda.device_array((L, k), np.int32)
        sc0 = kn.TopKScratch.allocate(L, V, k)
        cells = [" / ".join(f"{_graph_us(stream, lambda s: kn.topk_logprobs(x, k, out=(lp, ids), scratch=sc0, stream=s)):.1f}"
                            for _ in range(args.passes))]
        for G, T, B in configs:
            cap = (tk._capped_list(k, G) if k >= tk.CAPPED_FROM else None) or k   # topk._split's rule for G
            if not tk._fused_merge(G, cap):
                cells.append("-")
                continue
            sc = kn.TopKScratch.allocate(L, V, k, slices=G, cap=cap)
            keep = tk._keep_per_thread(cap, T)
            kern = tk._topk_partial_kernel(T, keep, 0, True, B)

            def launch(s, kern=kern, sc=sc, cap=cap, G=G, T=T):
                kern[(G, L), T, s](bits, k, cap, sc.part_m, sc.part_s, sc.cand, sc.cnt, sc.arrive, lp, ids)
            launch(0)
            cuda.synchronize()
            if not (np.array_equal(ids.copy_to_host(), ids_r)
                    and np.array_equal(lp.copy_to_host().view(np.uint32), lp_r.view(np.uint32))):
                raise SystemExit(f"k {k} (G {G}, T {T}, B {B}): the top-K differs from the twin's")
            cells.append(" / ".join(f"{_graph_us(stream, launch):.1f}" for _ in range(args.passes)))
        print(f"| {k} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
