"""Where a device round's time goes on the GPU: the demo pair's rounds replayed as one CUDA graph
per stage (``generate(..., graph="stages")``), with CUDA events between the stages.

Usage (a GPU machine): python tools/profile_round.py [--budgets 16 64] [--new 128] [--prompts 8]
    [--kernels BUDGET [--method ar|dflash|ddtree] [--replays N]]

Prints, per method and budget, the mean device time per round of each stage (draft, topk,
build, verify, accept, compact) and of the whole round, over the held-out prompts after a
warm-up. Splitting the graph adds a few microseconds a stage (each part is its own launch).
``--kernels B``: instead, one ddtree round at budget B replayed under the CUDA profiler API
(run it under ``ncu --profile-from-start off --graph-profiling node --metrics
gpu__time_duration.sum --csv``) for each kernel's time: the round after ``--after`` rounds
(default 4: a steady round, its new context rows a round's accepted tokens, not the prompt's);
``--method ar`` or ``dflash`` profiles that method's round instead of ddtree's; ``--replays N``
profiles N rounds in a row (under ``nsys profile --capture-range=cudaProfilerApi
--cuda-graph-trace=node``: each kernel's time inside the graph, not alone as ncu replays it).
"""

from __future__ import annotations

import argparse

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--kernels", type=int, metavar="BUDGET")
    ap.add_argument("--after", type=int, default=4, help="--kernels: rounds replayed before the profiled one")
    ap.add_argument("--method", choices=("ddtree", "dflash", "ar"), default="ddtree", help="--kernels: whose round")
    ap.add_argument("--replays", type=int, default=1, help="--kernels: rounds profiled, one after another")
    args = ap.parse_args()

    import ddtree_numba as dd
    from ddtree_numba.decode.device import rounds_for
    from ddtree_numba.decode.rounds import check_generate_inputs
    from ddtree_numba.demo import demo_metadata
    from numba import cuda
    t_dir, d_dir = dd.demo_pair()
    target = dd.load_target(t_dir, backend="cuda", progress=False)
    drafter = dd.load_drafter(d_dir, target)
    prompts = [np.asarray(p["ids"], np.int32) for p in demo_metadata()["prompts"][:args.prompts]]
    if args.kernels:
        b, m = args.kernels, args.method
        d = None if m == "ar" else drafter
        dd.generate(target, d, prompts[0], args.new, method=m, budget=b, graph=True)     # captures the round
        p = len(prompts[0])
        # generate's K and cap for this method (decode/device.py), and its checked max_tokens
        K = 1 if m == "dflash" else min(b, target.config.vocab_size)
        cap = {"ar": 0, "dflash": drafter.block_size - 1, "ddtree": b}[m]
        max_tokens = check_generate_inputs(target, d, prompts[0], args.new, m, b, 0.0, 0, None).max_tokens
        dr = rounds_for(target, d, m, K, cap, max_tokens, max(p, cap + 1), keep=True)
        stream = cuda.stream()
        dr.prefill(prompts[0], max_tokens, 0.0, 0, True, stream)
        (_, exe), = dr.graphs[True][1]
        from ddtree_numba._device import replay_graph
        for _ in range(args.after):              # the device state advances round by round
            replay_graph(exe, stream)
        cuda.synchronize()
        cuda.profile_start()
        for _ in range(args.replays):
            replay_graph(exe, stream)
        cuda.synchronize()
        cuda.profile_stop()
        return
    stages = ("draft", "topk", "build", "verify", "accept", "compact")
    print(f"{'method':>7} {'budget':>6} {'rounds':>6} " + " ".join(f"{s:>8}" for s in stages) + f" {'round':>8}  (µs a round)")
    for method, budget in [("ar", 1), ("dflash", 1)] + [("ddtree", b) for b in args.budgets]:
        d = None if method == "ar" else drafter
        dd.generate(target, d, prompts[0], args.new, method=method, budget=budget, graph="stages")   # warm-up
        times, rounds = dict.fromkeys(stages, 0.0), 0
        for p in prompts:
            res = dd.generate(target, d, p, args.new, method=method, budget=budget, graph="stages")
            rounds += len(res.acceptance_lengths)
            for s in stages:
                times[s] += res.stage_times[s]
        us = {s: 1e6 * times[s] / rounds for s in stages}
        print(f"{method:>7} {budget if method == 'ddtree' else '-':>6} {rounds:>6} "
              + " ".join(f"{us[s]:>8.1f}" for s in stages) + f" {sum(us.values()):>8.1f}")


if __name__ == "__main__":
    main()
