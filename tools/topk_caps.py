"""The split top-K with capped slice lists against uncapped ones, on a GPU (issue 15, thirty-sixth
session): µs a top-K (a replayed graph, queued: the graph's device time) for each (slices, cap,
threads) at k = 32 .. 1024, every result checked against the twin; then rows whose top k lies
among their first n ids (the interleaved slices share it out; at n = 64, two runs of 32, the merge
falls back to the whole row); then the issue's figure, top-K + the level build in one graph, with
the capped rule (``kernels.topk.CAPPED_FROM``) on and off, alternated.

Usage (a GPU machine): python tools/topk_caps.py [--vocab 163840] [--depths 15] [--ks ...] [--slices ...]
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
    ap.add_argument("--ks", type=int, nargs="+", default=[32, 64, 128, 256, 512, 1024])
    ap.add_argument("--slices", type=int, nargs="+", default=[4, 8, 16])
    args = ap.parse_args()
    from numba import cuda
    from ddtree_numba import kernels as kn
    from ddtree_numba import reference as ref
    from ddtree_numba.kernels import topk as tk

    V, L = args.vocab, args.depths
    stream = cuda.stream()
    x = drafter_logits(np.random.default_rng(0), L, V)
    dx = cuda.to_device(x)
    packed = {}                                          # every row's top k among its first n ids
    for n in (V // 16, 1024, 64):
        packed[n] = x.copy()
        packed[n][:, :n] += 30.0

    def run(d, k, G, cap, threads):
        lp, ids = cuda.device_array((L, k), np.float32), cuda.device_array((L, k), np.int32)
        sc = kn.TopKScratch.allocate(L, V, k, slices=G, cap=cap)
        us = _graph_us(stream, lambda s: kn.topk_logprobs(d, k, out=(lp, ids), stream=s, scratch=sc, slices=G,
                                                          cap=cap, threads=threads))
        return us, lp.copy_to_host(), ids.copy_to_host()

    for k in args.ks:
        want_lp, want_ids = ref.topk_logprobs(x, k)
        G0 = tk._slices(V, k)
        cells = []
        options = [(G0, k, tk._default_threads(k, k))]
        for G in args.slices:
            for cap in (8, 16, 32, 64, 128, 256):
                # lists that hold at least twice k (else the merge falls back on most rows)
                if cap >= k or G * cap < 2 * k or G * tk._pow2_at_least(cap) > tk.MERGE_SLOTS or V // G < cap:
                    continue
                for threads in (256, 512, 1024):
                    options.append((G, cap, threads))
        for G, cap, threads in options:
            us, lp, ids = run(dx, k, G, cap, threads)
            ok = np.array_equal(ids, want_ids) and np.array_equal(lp.view(np.uint32), want_lp.view(np.uint32))
            fused = "fused" if tk._fused_merge(G, cap) else "merge kernel"
            cells.append(f"G {G} cap {cap} {threads}t ({fused}): {us:.1f}{'' if ok else ' WRONG'}")
        print(f"top-K k {k}, V {V}, L {L} (uncapped default first), µs: " + "; ".join(cells), flush=True)
        G, cap = tk._split(V, k)
        if cap < k:
            for n, xp in packed.items():
                p_lp, p_ids = ref.topk_logprobs(xp, k)
                dp = cuda.to_device(xp)
                us, lp, ids = run(dp, k, G, cap, tk._default_threads(k, cap))
                ok = np.array_equal(ids, p_ids) and np.array_equal(lp.view(np.uint32), p_lp.view(np.uint32))
                us0, _, _ = run(dp, k, G0, k, tk._default_threads(k, k))
                print(f"  every row's top k among its first {n} ids: capped rule (G {G}, cap {cap}) {us:.1f} µs"
                      f"{'' if ok else ' WRONG'}, uncapped {us0:.1f} µs", flush=True)

    # the figure: top-K + level build as one graph, the rule on (A) and off (B), alternated
    for budget in args.ks:
        want = ref.build_tree(*ref.topk_logprobs(x, budget), budget)
        sides = {}
        for rep in range(3):
            for side, rule in (("capped", tk.CAPPED_FROM), ("uncapped", None)):
                saved = tk.CAPPED_FROM
                tk.CAPPED_FROM = rule
                try:
                    lp, ids = cuda.device_array((L, budget), np.float32), cuda.device_array((L, budget), np.int32)
                    sc = kn.TopKScratch.allocate(L, V, budget)
                    bufs, lsc = kn.TreeBuffers.allocate(budget), kn.LevelScratch.allocate(L, budget)

                    def both(s):
                        kn.topk_logprobs(dx, budget, out=(lp, ids), stream=s, scratch=sc)
                        kn.build_tree_levels(lp, ids, budget, out=bufs, scratch=lsc, stream=s)
                    us = (_graph_us(stream, both, queued=False), _graph_us(stream, both))
                    assert bufs.to_tree() == want, "tree differs from the twin"
                finally:
                    tk.CAPPED_FROM = saved
                sides.setdefault(side, []).append(us)
        print(f"top-K + level build, budget {budget}, one graph, µs replayed / queued (3 alternated passes): "
              + "; ".join(f"{s} {', '.join(f'{a:.1f} / {q:.1f}' for a, q in v)}" for s, v in sides.items()),
              flush=True)


if __name__ == "__main__":
    main()
