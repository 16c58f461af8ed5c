"""The demo drafter's whole draft on the GPU, with its attention forced to each GQA kernel: µs a draft
(one captured graph of ``--repeat`` drafts, each followed by a reset of the cache length, replayed),
the sides alternated in one process, so that a kernel's gain alone (tools/gqa_keys.py) can be held
to its gain where it runs, between the drafter's other launches.

Usage (a GPU machine): python tools/draft_ab.py [--keys 330] [--new 4] [--repeat 20] [--rounds 6]

Each side: ``enqueue_gqa_attention`` with ``method`` forced ("split": the split kernel's fused
launch; "split+merge": the split kernel, then the merge in a launch of its own, ``fuse=False``;
"warp": ``_gqa_warp_kernel`` at ``_warp_tiles``), a drafter cache holding ``--keys`` context
rows (random features), ``--new`` new context rows a draft. Prints the best and the median of
``--rounds`` timings a side, and checks that every side's logits are the same bits.
"""

from __future__ import annotations

import argparse
import functools
import importlib

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=330)
    ap.add_argument("--new", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    from numba import cuda
    import ddtree_numba as dd
    from ddtree_numba._device import capture_graph, replay_graph
    kn = importlib.import_module("ddtree_numba.kernels")
    target_dir, drafter_dir = dd.demo_pair()
    target = dd.load_target(target_dir, backend="cuda", progress=False)
    drafter = dd.load_drafter(drafter_dir, target)
    cfg = drafter.config
    width = len(cfg.target_layer_ids) * cfg.hidden_size
    rng = np.random.default_rng(0)
    block = drafter.block_size
    ctx = cuda.to_device(rng.standard_normal((args.keys, width), np.float32))
    feats = cuda.to_device(rng.standard_normal((block, width), np.float32))
    n_ctx = cuda.to_device(np.array([args.keys], np.int32))
    n_new = cuda.to_device(np.array([args.new], np.int32))
    bonus = cuda.to_device(np.array([65], np.int32))
    cache = drafter.new_cache(args.keys + 64)
    drafter.prefill_device(ctx, n_ctx, cache)
    cuda.synchronize()
    saved = cache.status.copy_to_host()
    saved_d = cuda.to_device(saved)
    original = kn.enqueue_gqa_attention
    graphs, logits = {}, {}
    sides = {"split": dict(method="split"), "split+merge": dict(method="split", fuse=False),
             "warp": dict(method="warp")}
    for method, forced in sides.items():
        kn.enqueue_gqa_attention = functools.partial(original, **forced)
        try:
            def enqueue(s):
                for _ in range(args.repeat):
                    drafter.draft_device(feats, n_new, bonus, cache, stream=s)
                    cache.status.copy_to_device(saved_d, stream=s)     # the same context every draft
            graphs[method] = capture_graph(enqueue)
        finally:
            kn.enqueue_gqa_attention = original
        cuda.synchronize()
        logits[method] = drafter.workspace(block).logits.copy_to_host()
    same = all(np.array_equal(logits["split"].view(np.uint32), got.view(np.uint32)) for got in logits.values())
    stream = cuda.stream()
    times = {m: [] for m in graphs}
    for _ in range(args.rounds):
        for method, exe in graphs.items():
            a, b = cuda.event(), cuda.event()
            a.record(stream)
            replay_graph(exe, stream)
            b.record(stream)
            b.synchronize()
            times[method].append(cuda.event_elapsed_time(a, b) * 1000 / args.repeat)
    print(f"demo drafter, {args.keys} context keys + {args.new} new rows, {block} block rows; "
          f"µs a draft ({args.repeat} a graph, {args.rounds} replays a side, alternated); logits equal: {same}")
    print("| attention | best µs | median µs |")
    print("|---|---|---|")
    for method, ts in times.items():
        print(f"| {method} | {min(ts):.1f} | {float(np.median(ts)):.1f} |")
    if not same:
        raise SystemExit("the sides' drafts differ")


if __name__ == "__main__":
    main()
