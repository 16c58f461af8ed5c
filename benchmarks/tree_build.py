"""GPU tree build (and top-K) for budgets 16..1024 against the numpy twin and a plain heapq build.

Usage (on a GPU machine): python benchmarks/tree_build.py [--quick | --kernels | --overhead | --sweep-threads]
Prints a table and appends it to docs/PERFORMANCE.md.

Columns: GPU device time (CUDA events, median) for build alone and top-K + build;
host wall time per call of the GPU pair (launch overhead included, no host copies);
the numpy twin; a plain-Python heapq build over the top-K table as the published DDTree
code runs it on the CPU; the peer's top-K (torch.topk + log_softmax on the same GPU).
The floor of top-K + build is reading the logits once: L*V*4 bytes / 4.2 TB/s.
"""

from __future__ import annotations

import argparse
import heapq
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import COPY_BW, append_rows, time_gpu, time_host  # noqa: E402


def heapq_build(lp: np.ndarray, ids: np.ndarray, budget: int):
    """The CPU build the published DDTree code runs: heapq over (-score, rank path)."""
    L, K = lp.shape
    lp = lp.tolist()
    heap = [(-lp[0][0], (0,), 0)]
    parents, tokens = [-1], []
    while heap and len(tokens) < budget:
        neg, path, parent = heapq.heappop(heap)
        d, r = len(path), path[-1]
        node = len(tokens) + 1
        tokens.append(int(ids[d - 1, r]))
        parents.append(parent)
        if r + 1 < K:
            heapq.heappush(heap, (neg + lp[d - 1][r] - lp[d - 1][r + 1], path[:-1] + (r + 1,), parent))
        if d < L:
            heapq.heappush(heap, (neg - lp[d][0], path + (0,), node))
    return tokens, parents


def drafter_logits(rng, L, V):
    x = rng.standard_normal((L, V)).astype(np.float32) * 2.0
    for d in range(L):
        x[d, rng.choice(V, 8, replace=False)] += np.linspace(9, 4, 8, dtype=np.float32)
    return x


def sweep_threads():
    from numba import cuda
    from ddtree_numba import kernels as kn
    from ddtree_numba import reference as ref
    rng = np.random.default_rng(0)
    stream = cuda.stream()
    logits = drafter_logits(rng, 15, 32000)
    for budget in (64, 256, 1024):
        lp, ids = ref.topk_logprobs(logits, budget)
        lp_d, ids_d = cuda.to_device(lp), cuda.to_device(ids)
        bufs = kn.TreeBuffers.allocate(budget, stream)
        cells = []
        for threads in (32, 64, 128, 256):
            t = time_gpu(lambda: kn.build_tree(lp_d, ids_d, budget, out=bufs, stream=stream,
                                               threads=threads), stream, reps=20)
            cells.append(f"T={threads}: {t:.0f} µs")
        d_logits = cuda.to_device(logits)
        for threads in (128, 256, 512):
            t = time_gpu(lambda: kn.topk_logprobs(d_logits, budget, out=(lp_d, ids_d),
                                                  stream=stream, threads=threads), stream, reps=10)
            cells.append(f"topk T={threads}: {t:.0f} µs")
        print(f"budget {budget}: " + ", ".join(cells), flush=True)


def demo_draft_logits():
    """The demo drafter's 15 distributions after a held-out prompt (numpy backend): the shape of a
    real draft, where more levels select than on the synthetic rows."""
    import ddtree_numba as dd
    from ddtree_numba.demo import demo_metadata
    target_dir, drafter_dir = dd.demo_pair()
    target = dd.load_target(target_dir, progress=False, backend="numpy")
    drafter = dd.load_drafter(drafter_dir, target)
    prompt = np.asarray(demo_metadata()["prompts"][3]["ids"][:141], np.int32)
    pre = target.forward(prompt, np.arange(len(prompt), dtype=np.int32), target.new_cache(256),
                         hidden_layer_ids=drafter.target_layer_ids)
    return drafter.draft(pre.hidden, int(pre.logits[-1].argmax()), drafter.new_cache(256))


def _graph_us(stream, enqueue, queued=True, n=1) -> float:
    """``enqueue(stream)`` repeated ``n`` times, captured as one graph and replayed: µs a copy
    (``time_gpu``; ``queued``: the graph's device time alone)."""
    from ddtree_numba._device import capture_graph, replay_graph
    exe = capture_graph(lambda s: [enqueue(s) for _ in range(n)])
    return time_gpu(lambda: replay_graph(exe, stream), stream, reps=30, queued=queued) / n


def per_kernel(V=163840, L=15):
    """Each kernel alone as a replayed graph (no launch time): the level build at L = 1 and L, and
    the top-K's partial and merge kernels, at budgets 16, 64 and 1024. Printed, not appended."""
    from numba import cuda
    from ddtree_numba import kernels as kn
    from ddtree_numba import reference as ref
    from ddtree_numba.kernels import topk as tk
    stream = cuda.stream()

    def graph_us(enqueue):
        return _graph_us(stream, enqueue)
    print("(every figure: queued, the graph's device time alone; --overhead times the graph's own cost)",
          flush=True)
    for v in (8192, 40960, V):                           # the first read's fixed cost: 8 slices a row
        xs = cuda.to_device(drafter_logits(np.random.default_rng(0), L, v))
        scs = kn.TopKScratch.allocate(L, v, 64, slices=8)
        lps, ids_s = cuda.device_array((L, 64), np.float32), cuda.device_array((L, 64), np.int32)
        ts = graph_us(lambda s: tk._topk_partial_kernel(512, 1, 1)[(8, L), 512, s](
            xs.view(np.uint32), 64, 64, scs.part_m, scs.part_s, scs.cand, scs.cnt, scs.arrive, lps, ids_s))
        print(f"the partial kernel's first read alone, V {v}, 8 slices, 512 threads: {ts:.1f} µs", flush=True)
    real = demo_draft_logits()
    for budget in (16, 64, 256, 1024):
        lp_h, ids_h = ref.topk_logprobs(real, min(budget, real.shape[1]))
        lp, ids = cuda.to_device(lp_h), cuda.to_device(ids_h)
        bufs, sc = kn.TreeBuffers.allocate(budget), kn.LevelScratch.allocate(L, budget)
        cells = []                                       # the level build without and with its seed
        for seed, threads in ((False, None), (True, None), (True, 512)):
            t = graph_us(lambda s: kn.build_tree_levels(lp, ids, budget, out=bufs, scratch=sc, stream=s,
                                                        seed=seed, threads=threads))
            assert bufs.to_tree() == ref.build_tree(lp_h, ids_h, budget), "level tree differs"
            trace = []
            ref.build_tree_levels(lp_h, ids_h, budget, trace=trace, seed=seed)
            ways = "".join({"filter": "f", "select": "S", "seed": "+"}[a] for a in trace)
            cells.append(f"{'seeded' if seed else 'unseeded'}{f' {threads} threads' if threads else ''} {t:.1f} µs "
                         f"(levels {ways})")
        t_heap = graph_us(lambda s: kn.build_tree(lp, ids, budget, out=bufs, stream=s))
        print(f"demo drafter's draft, budget {budget}: level build " + ", ".join(cells)
              + f" (f filtered, S selected, + the seed computed before that level); heap build {t_heap:.1f} µs",
              flush=True)
    x = drafter_logits(np.random.default_rng(0), L, V)
    dx = cuda.to_device(x)
    for budget in (16, 64, 256, 1024):
        lp_h, ids_h = ref.topk_logprobs(x, budget)
        for depths in (1, L):
            lp, ids = cuda.to_device(lp_h[:depths].copy()), cuda.to_device(ids_h[:depths].copy())
            bufs, sc = kn.TreeBuffers.allocate(budget), kn.LevelScratch.allocate(depths, budget)
            t = graph_us(lambda s: kn.build_tree_levels(lp, ids, budget, out=bufs, scratch=sc, stream=s))
            assert bufs.to_tree() == ref.build_tree(lp_h[:depths], ids_h[:depths], budget), "level tree differs"
            trace = []
            ref.build_tree_levels(lp_h[:depths], ids_h[:depths], budget, trace=trace)
            t_heap = graph_us(lambda s: kn.build_tree(lp, ids, budget, out=bufs, stream=s))
            ways = "".join({"filter": "f", "select": "S", "seed": "+"}[a] for a in trace)
            print(f"level build, budget {budget}, L = {depths}: {t:.1f} µs (levels {ways}: "
                  f"f filtered, S selected, + the seed computed); heap build {t_heap:.1f} µs", flush=True)
        G, cap = tk._split(V, budget)
        T = tk._default_threads(budget, cap)             # the block topk_logprobs picks
        keep = tk._keep_per_thread(cap, T)
        lpd, idd = cuda.device_array((L, budget), np.float32), cuda.device_array((L, budget), np.int32)
        scr = kn.TopKScratch.allocate(L, V, budget)
        t = graph_us(lambda s: kn.topk_logprobs(dx, budget, out=(lpd, idd), stream=s, scratch=scr))
        assert np.array_equal(idd.copy_to_host(), ids_h), "GPU top-K differs from the twin"
        merge_threads = 1024
        t_stage = []                                     # the partial kernel stopped after each stage
        for stop in (1, 2, 3, 0):
            t_stage.append(graph_us(lambda s: tk._topk_partial_kernel(T, keep, stop)[(G, L), T, s](
                dx.view(np.uint32), budget, cap, scr.part_m, scr.part_s, scr.cand, scr.cnt, scr.arrive, lpd, idd)))
        t_merge = graph_us(lambda s: tk._topk_merge_kernel(merge_threads)[L, merge_threads, s](
            dx.view(np.uint32), budget, cap, scr.part_m, scr.part_s, scr.cand, scr.cnt, lpd, idd))
        print(f"top-K, K = {budget}, G = {G}, lists of {cap}, {T} threads, kept a thread = {keep}: {t:.1f} µs (partial "
              f"{t_stage[3]:.1f}, stopped after the first read's loads and exps {t_stage[0]:.1f}, after tau "
              f"{t_stage[1]:.1f}, after the second read {t_stage[2]:.1f}; merge {t_merge:.1f})", flush=True)
        cells = []
        for g in (2, 4, 8, 16, 32, 64):                  # slices a row: blocks against the merge's keys
            if g * tk._pow2_at_least(budget) > tk.MERGE_SLOTS:
                continue                                 # the merge's shared memory holds G * P keys
            scg = kn.TopKScratch.allocate(L, V, budget, slices=g, cap=budget)
            tg = graph_us(lambda s: kn.topk_logprobs(dx, budget, out=(lpd, idd), stream=s, scratch=scg, slices=g,
                                                     cap=budget))
            assert np.array_equal(idd.copy_to_host(), ids_h), "GPU top-K differs from the twin"
            cells.append(f"G {g}: {tg:.1f}")
        print(f"top-K, K = {budget}, µs by slices: " + ", ".join(cells), flush=True)
        cells = []
        for threads in (128, 256, 512, 1024):            # the partial kernel's block
            tg = graph_us(lambda s: kn.topk_logprobs(dx, budget, out=(lpd, idd), stream=s, scratch=scr,
                                                     threads=threads))
            assert np.array_equal(idd.copy_to_host(), ids_h), "GPU top-K differs from the twin"
            cells.append(f"{threads} threads: {tg:.1f}")
        print(f"top-K, K = {budget}, G = {G}, µs by block: " + ", ".join(cells), flush=True)
        cells = []
        for kp in (1, 2, 4, 8):                          # kept keys a thread: the filter's bound
            tg = graph_us(lambda s: kn.topk_logprobs(dx, budget, out=(lpd, idd), stream=s, scratch=scr, keep=kp))
            assert np.array_equal(idd.copy_to_host(), ids_h), "GPU top-K differs from the twin"
            cells.append(f"keep {kp}: {tg:.1f}")
        print(f"top-K, K = {budget}, G = {G}, {T} threads, µs by kept keys: " + ", ".join(cells), flush=True)


def overhead(V=163840, L=15, copies=8):
    """Where a replayed graph's time goes: empty kernels (one, two, three, eight in a row) timed with
    nothing queued and queued; then top-K + level build at each budget as one copy a graph and as
    ``copies`` copies a graph (divided by ``copies``: the stage's marginal cost inside a longer graph,
    such as the captured round), and each of its kernels the same way. Printed only."""
    from numba import cuda
    from ddtree_numba import kernels as kn
    from ddtree_numba import reference as ref
    from ddtree_numba.kernels import topk as tk
    stream = cuda.stream()

    def graph_us(enqueue, queued=True, n=1):
        return _graph_us(stream, enqueue, queued, n)
    empty = cuda.jit(lambda x: None)
    arg = cuda.device_array(1, np.float32)
    for queued in (False, True):
        cells = [f"{n}: {graph_us(lambda s: empty[(8, L), 512, s](arg), queued, n) * n:.1f}" for n in (1, 2, 3, 8)]
        print(f"empty kernels in a graph ({'queued' if queued else 'nothing queued'}), µs a graph by kernels: "
              + ", ".join(cells), flush=True)
    x = drafter_logits(np.random.default_rng(0), L, V)
    dx = cuda.to_device(x)
    for budget in (16, 64, 256, 1024):
        lp_h, ids_h = ref.topk_logprobs(x, budget)
        lpd, idd = cuda.device_array((L, budget), np.float32), cuda.device_array((L, budget), np.int32)
        scr = kn.TopKScratch.allocate(L, V, budget)
        bufs, sc = kn.TreeBuffers.allocate(budget), kn.LevelScratch.allocate(L, budget)
        G, cap = tk._split(V, budget)
        T = tk._default_threads(budget, cap)             # the block topk_logprobs picks
        keep = tk._keep_per_thread(cap, T)

        def topk(s):
            kn.topk_logprobs(dx, budget, out=(lpd, idd), stream=s, scratch=scr)

        def levels(s):
            kn.build_tree_levels(lpd, idd, budget, out=bufs, scratch=sc, stream=s)

        def partial(s):
            tk._topk_partial_kernel(T, keep, 0)[(G, L), T, s](dx.view(np.uint32), budget, cap, scr.part_m, scr.part_s,
                                                              scr.cand, scr.cnt, scr.arrive, lpd, idd)

        def merge(s):
            tk._topk_merge_kernel(1024)[L, 1024, s](dx.view(np.uint32), budget, cap, scr.part_m, scr.part_s, scr.cand, scr.cnt, lpd, idd)
        cells = []
        for name, fn in (("top-K + level build", lambda s: (topk(s), levels(s))),
                         (f"top-K ({'merge fused' if tk._fused_merge(G, cap) else 'merge kernel'})", topk),
                         ("partial unfused", partial), ("merge kernel", merge), ("level build", levels)):
            cells.append(f"{name} {graph_us(fn):.1f} / {graph_us(fn, n=copies):.1f}")
        assert bufs.to_tree() == ref.build_tree(lp_h, ids_h, budget), "level tree differs from the twin"
        print(f"budget {budget}, V {V}, L {L}, µs queued, one copy a graph / {copies} copies a graph per copy: "
              + "; ".join(cells), flush=True)


def main():
    from numba import cuda
    from ddtree_numba import kernels as kn
    from ddtree_numba import reference as ref
    from ddtree_numba._device import capture_graph, replay_graph
    from ddtree_numba.decode.device import LEVEL_BUILD_FROM

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-append", action="store_true")
    ap.add_argument("--sweep-threads", action="store_true", help="build time vs threads per block")
    ap.add_argument("--kernels", action="store_true", help="each kernel alone, graph replay (printed only)")
    ap.add_argument("--overhead", action="store_true", help="graph launch cost against the kernels' (printed only)")
    args = ap.parse_args()
    if args.sweep_threads:
        return sweep_threads()
    if args.kernels:
        return per_kernel()
    if args.overhead:
        return overhead()
    budgets = [16, 64, 256, 1024] if args.quick else [16, 32, 64, 128, 256, 512, 1024]
    L = 15
    try:
        import torch
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    stream = cuda.stream()
    rows = []
    for V in (32000, 163840):
        logits = drafter_logits(rng, L, V)
        d_logits = cuda.to_device(logits, stream=stream)
        for budget in budgets:
            k = min(budget, V)
            lp_d = cuda.device_array((L, k), np.float32, stream=stream)
            ids_d = cuda.device_array((L, k), np.int32, stream=stream)
            bufs = kn.TreeBuffers.allocate(budget, stream)
            lbufs, scratch = kn.TreeBuffers.allocate(budget, stream), kn.LevelScratch.allocate(L, budget, stream)
            tk_scratch = kn.TopKScratch.allocate(L, V, k, stream)

            def topk(s=stream):
                kn.topk_logprobs(d_logits, k, out=(lp_d, ids_d), stream=s, scratch=tk_scratch)

            def levels(s=stream):
                kn.build_tree_levels(lp_d, ids_d, budget, out=lbufs, scratch=scratch, stream=s)
            topk()
            levels()
            kn.build_tree(lp_d, ids_d, budget, out=bufs, stream=stream)
            stream.synchronize()
            lp, ids = ref.topk_logprobs(logits, k)
            assert bufs.to_tree() == ref.build_tree(lp, ids, budget), "GPU tree differs from the twin"
            assert lbufs.to_tree() == ref.build_tree(lp, ids, budget), "GPU level tree differs from the twin"
            assert ref.build_tree_levels(lp, ids, budget) == ref.build_tree(lp, ids, budget), "level twin differs"

            def both():
                topk()
                kn.build_tree(lp_d, ids_d, budget, out=bufs, stream=stream)

            t_topk = time_gpu(topk, stream)
            t_build = time_gpu(lambda: kn.build_tree(lp_d, ids_d, budget, out=bufs, stream=stream), stream)
            t_both = time_gpu(both, stream)
            t_levels_gpu = time_gpu(levels, stream)
            # The figure: top-K + the level build captured as one graph, replayed.
            exe = capture_graph(lambda s: (topk(s), levels(s)))
            t_graph = time_gpu(lambda: replay_graph(exe, stream), stream)
            t_queued = time_gpu(lambda: replay_graph(exe, stream), stream, queued=True)
            # top-K + the build the device round takes at this budget (decode.device: the heap build,
            # on the warp kernel up to WARP_DEFAULT_UP_TO, below LEVEL_BUILD_FROM; else the level build)
            if budget < LEVEL_BUILD_FROM:
                exe_round = capture_graph(lambda s: (topk(s), kn.build_tree(lp_d, ids_d, budget, out=bufs, stream=s)))
                t_round = time_gpu(lambda: replay_graph(exe_round, stream), stream, queued=True)
            else:
                t_round = t_queued
            lbufs.tokens.copy_to_device(np.full(lbufs.tokens.shape, -7, np.int32), stream=stream)  # poison
            replay_graph(exe, stream)
            stream.synchronize()
            assert lbufs.to_tree() == ref.build_tree(lp, ids, budget), "replayed level tree differs from the twin"
            t_host = time_host(lambda: (replay_graph(exe, stream), stream.synchronize()))
            t_twin = time_host(lambda: ref.build_tree(lp, ids, budget), reps=5)
            t_twin_topk = time_host(lambda: ref.topk_logprobs(logits, k), reps=3)
            t_heapq = time_host(lambda: heapq_build(lp, ids, budget), reps=5)
            t_levels = time_host(lambda: ref.build_tree_levels(lp, ids, budget), reps=3)
            t_peer = "n/a"
            if torch is not None and torch.cuda.is_available():
                tl = torch.from_numpy(logits).cuda()

                def peer():
                    torch.topk(torch.log_softmax(tl.float(), -1), k, dim=-1)
                torch.cuda.synchronize()
                t_peer = f"{time_host(lambda: (peer(), torch.cuda.synchronize())):.1f}"
            floor = L * V * 4 / COPY_BW * 1e6
            rows.append([V, budget, L, f"{t_topk:.1f}", f"{t_build:.1f}", f"{t_levels_gpu:.1f}",
                         f"{t_graph:.1f}", f"{t_queued:.1f}", f"{t_round:.1f}", f"{t_both:.1f}", f"{floor:.2f}",
                         f"{t_host:.1f}", t_peer, f"{t_twin_topk:.0f}", f"{t_twin:.0f}", f"{t_levels:.0f}",
                         f"{t_heapq:.0f}"])
            print(rows[-1], flush=True)
    header = ["V", "budget", "L", "GPU top-K µs", "GPU heap build µs", "GPU level build µs",
              "GPU top-K + level build µs (graph replay)", "the same, queued µs",
              "GPU top-K + the round's build µs (graph, queued)", "GPU top-K+heap build µs (eager)", "floor µs",
              "host wall top-K+level build µs (graph)", "peer torch top-K µs", "numpy top-K µs", "numpy build µs",
              "numpy level build µs", "heapq build µs"]
    keys = ["vocab", "budget", "depths", "topk_us", "heap_build_us", "build_us", "us", "us_queued", "round_us",
            "heap_us_together",
            "floor_us", "host_us", "peer_us",
            "numpy_topk_us", "numpy_build_us", "numpy_levels_us", "heapq_us"]
    note = (f"L = {L} depths. Heap build: best-first pops (build_tree's default: one warp with the frontier in "
            f"registers up to WARP_DEFAULT_UP_TO = {kn.tree_build.WARP_DEFAULT_UP_TO} nodes, else one block); "
            "level build: the level-synchronous "
            "kernel (kernels.build_tree_levels, one block of _level_threads(budget) threads: 32 to 1024). GPU columns: CUDA-event device time, "
            "median of 50: top-K, each build alone and top-K + heap build as eager launches; the issue's figure "
            "(top-K + level build) as one captured CUDA graph, replayed; queued: the same graph launched behind a "
            "sleeping kernel, so the host's submission (~10 µs) is hidden and the figure is the graph's device "
            "time, as the stage costs inside the captured round. The round's build: top-K + the build the "
            "device round takes at that budget (the heap build below decode.device.LEVEL_BUILD_FROM, else the "
            "level build), one graph, queued. Host wall: per graph replay with a "
            "stream sync. Peer: torch.log_softmax + torch.topk on the same GPU "
            "(wall, synced). numpy/heapq: CPU of the GPU machine. Every GPU tree equals the heapq twin's, "
            "and so does the level-synchronous twin's (build_tree_levels).")
    append_rows("Tree build (benchmarks/tree_build.py)", header, rows, note, append=not args.no_append,
                results="tree_build", keys=keys)


if __name__ == "__main__":
    main()
