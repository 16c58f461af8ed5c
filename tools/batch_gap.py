"""Why ``generate_batch`` of one prompt is slower than ``generate`` on the GPU (issue 17; docs/PLANS.md §4):
the demo pair's held-out prompts, each decoded alone by both, every round one CUDA graph.

Usage (a GPU machine): python tools/batch_gap.py [--budget 16] [--new 128] [--prompts 8] [--batch 8]
    [--kernels batch|prefill] [--profile]

Prints, per method (ar, ddtree at ``--budget``) and per loop (``generate``; ``generate_batch`` of
one prompt; ``generate_batch`` of ``--batch`` prompts at once): tokens/s over the prompts, the
wall time a call spends before its first round (the prefill, with its sync) and a round's wall
time (the rounds' span over their count), after two warm-up passes. A gap in the round column
is the batched round's graph; one in the prefill column is the batched prefill.
``--kernels batch``: instead, one batched ddtree round's graph (``--batch`` prompts, the round
after ``--after`` rounds, default 4: a steady round, as ``tools/profile_round.py --kernels``'s)
replayed under the CUDA profiler API (run it under ``ncu --profile-from-start off
--graph-profiling node --metrics gpu__time_duration.sum --csv``), for
``tools/ncu_summary.py``; ``generate``'s round: ``tools/profile_round.py --kernels``.
``--kernels prefill``: ``generate``'s prefill of the first prompt (its graph and the launches
after it). ``--profile``: instead, the host's time in each function (cProfile, cumulative) over a pass of
``generate`` and one of ``generate_batch`` of one prompt, ddtree, after the warm-up.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--kernels", choices=("batch", "prefill"))
    ap.add_argument("--after", type=int, default=4, help="--kernels batch: rounds replayed before the profiled one")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()

    import ddtree_numba as dd
    from ddtree_numba.demo import demo_metadata
    from numba import cuda
    t_dir, d_dir = dd.demo_pair()
    target = dd.load_target(t_dir, backend="cuda", progress=False)
    drafter = dd.load_drafter(d_dir, target)
    prompts = [np.asarray(p["ids"], np.int32) for p in demo_metadata()["prompts"][:args.prompts]]
    b = args.budget

    if args.kernels:
        from ddtree_numba._device import replay_graph
        p = prompts[0]
        stream = cuda.stream()
        for _ in range(2):                       # compiles, captures the round (and the prefill's graph)
            if args.kernels == "prefill":
                dd.generate(target, drafter, p, args.new, budget=b, graph=True)
            else:
                dd.generate_batch(target, drafter, prompts[:args.batch], args.new, budget=b, graph=True)
        if args.kernels == "prefill":
            from ddtree_numba.decode.device import rounds_for
            n = len(p)
            dr = rounds_for(target, drafter, "ddtree", b, b, n + args.new + b + 1, max(n, b + 1), keep=True)
            cuda.synchronize()
            cuda.profile_start()
            dr.prefill(p, n + args.new + b + 1, 0.0, 0, True, stream)
            cuda.synchronize()
            cuda.profile_stop()
            return
        from ddtree_numba.decode.device_batch import _BATCH_ROUNDS
        br = list(_BATCH_ROUNDS[target].values())[-1]
        ps = prompts[:args.batch]
        br.prefill(ps, [len(q) + args.new + b + 1 for q in ps], [len(q) + args.new for q in ps], set(), 0, True, stream)
        br.live.copy_to_device(np.ones(len(ps), np.int32), stream=stream)
        for _ in range(args.after):              # the device state advances round by round
            replay_graph(br.graph, stream)
        cuda.synchronize()
        cuda.profile_start()
        replay_graph(br.graph, stream)
        cuda.synchronize()
        cuda.profile_stop()
        return

    if args.profile:
        import cProfile
        import pstats
        for name, call in (("generate", lambda p: dd.generate(target, drafter, p, args.new, budget=b, graph=True)),
                           ("generate_batch", lambda p: dd.generate_batch(target, drafter, [p], args.new, budget=b,
                                                                          graph=True))):
            for _ in range(2):
                for p in prompts:
                    call(p)
            prof = cProfile.Profile()
            prof.enable()
            for p in prompts:
                call(p)
            prof.disable()
            print(f"== {name}")
            pstats.Stats(prof).sort_stats("cumulative").print_stats(28)
        return

    def single(d, p, method, budget):
        r = dd.generate(target, d, p, args.new, method=method, budget=budget, graph=True)
        return [r], r.stage_times.get("prefill", 0.0), r.stage_times.get("round", 0.0), len(r.acceptance_lengths)

    def batched(d, ps, method, budget):
        res = dd.generate_batch(target, d, ps, args.new, method=method, budget=budget, graph=True)
        st = res[0].stage_times
        return list(res), st.get("prefill", 0.0), st.get("round", 0.0), len(res.rounds)

    print(f"{'method':>7} {'loop':>9} {'tokens/s':>9} {'prefill ms':>10} {'round us':>9} {'rounds':>6} {'calls':>5}")
    for method, budget in (("ar", 1), ("ddtree", b)):
        d = None if method == "ar" else drafter
        loops = [("generate", lambda: [single(d, p, method, budget) for p in prompts]),
                 ("batch 1", lambda: [batched(d, [p], method, budget) for p in prompts]),
                 (f"batch {args.batch}", lambda: [batched(d, prompts[i:i + args.batch], method, budget)
                                                  for i in range(0, len(prompts), args.batch)])]
        for name, run in loops:
            run(), run()                                            # warm-up: compile, capture
            t0 = time.perf_counter()
            calls = run()
            wall = time.perf_counter() - t0
            tokens = sum(len(r.tokens) for c in calls for r in c[0])
            prefill = sum(c[1] for c in calls) / len(calls)
            rounds = sum(c[3] for c in calls)
            round_us = sum(c[2] for c in calls) / max(rounds, 1) * 1e6
            print(f"{method:>7} {name:>9} {tokens / wall:>9.0f} {prefill * 1e3:>10.2f} {round_us:>9.1f} {rounds:>6} "
                  f"{len(calls):>5}")


if __name__ == "__main__":
    main()
