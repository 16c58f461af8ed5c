"""The split top-K by the keys each partial-kernel thread keeps (``keep``), on a GPU: µs a top-K (a
replayed graph, queued: its device time) at V = 163840, L = 15 and k = 16 .. 1024 for keep 1, 2, 4,
8 and the default (``topk._keep_per_thread``), every result checked bit for bit against the twin
first. Since the forty-second session a thread re-reads its entries only when its smallest kept key
is >= tau (it may hold more keys >= tau), so enough kept keys make the second read rare; more kept
keys cost the first read a little (registers: ``topk._kept_put``).

Usage (a GPU machine): python tools/topk_keep.py [--vocab 163840] [--depths 15] [--ks ...] [--keeps ...]
    [--passes 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from tree_build import _graph_us, drafter_logits  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=163840)
    ap.add_argument("--depths", type=int, default=15)
    ap.add_argument("--ks", type=int, nargs="+", default=[16, 32, 64, 256, 1024])
    ap.add_argument("--keeps", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--passes", type=int, default=2)
    args = ap.parse_args()
    from numba import cuda

    from ddtree_numba import kernels as kn
    from ddtree_numba import reference as ref
    from ddtree_numba.kernels import topk as tk
    L, V = args.depths, args.vocab
    x_h = drafter_logits(np.random.default_rng(0), L, V)
    x = cuda.to_device(x_h)
    stream = cuda.stream()
    cols = [str(m) for m in args.keeps] + ["default"]
    print(f"top-K µs (queued graph), V {V}, L {L}; columns: keys kept a thread")
    print("| k | slices, cap, threads | default keep | " + " | ".join(cols) + " |")
    print("|---|---|---|" + "---|" * len(cols))
    for k in args.ks:
        G, cap = tk._split(V, k)
        threads = tk._default_threads(k, cap)
        lp_r, ids_r = ref.topk_logprobs(x_h, k)
        lp, ids = cuda.device_array((L, k), np.float32), cuda.device_array((L, k), np.int32)
        sc = kn.TopKScratch.allocate(L, V, k)
        cells = []
        for keep in args.keeps + [None]:
            kn.topk_logprobs(x, k, out=(lp, ids), scratch=sc, keep=keep)
            ok = np.array_equal(ids.copy_to_host(), ids_r) and np.array_equal(
                lp.copy_to_host().view(np.uint32), lp_r.view(np.uint32))
            if not ok:
                raise SystemExit(f"k {k} keep {keep}: the top-K differs from the twin's")
            us = [_graph_us(stream, lambda s: kn.topk_logprobs(x, k, out=(lp, ids), scratch=sc, keep=keep, stream=s))
                  for _ in range(args.passes)]
            cells.append(" / ".join(f"{u:.1f}" for u in us))
        print(f"| {k} | {G}, {cap}, {threads} | {tk._keep_per_thread(cap, threads)} | " + " | ".join(cells) + " |",
              flush=True)


if __name__ == "__main__":
    main()
