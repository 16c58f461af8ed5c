"""Batches of trees at the Moonlight-16B-A3B shape: one verify forward for S sequences (issue 17).

Usage (a GPU machine): python benchmarks/batch.py [--batches 1 4 16] [--budgets 16 64] [--layers 27]
    [--prefix 1024] [--max-rows 4096] [--dry-run]

Random bf16 weights (``verify_forward.build_target``) and S sequences, each with its own latent
cache of ``--prefix`` random rows. A round of ``ar`` verifies one token a sequence; a round of
``ddtree`` at budget B verifies a tree of B + 1 nodes a sequence (``verify_forward.ddtree_tree``:
the best-first tree a DDTree round builds over random drafts, at most 15 deep, positions prefix +
depth; runs before 2026-12-04 took ``random_tree``, ~B / 4.5 deep). Each round is one
``CudaTarget.forward_batch`` over all S sequences' rows (``enqueue_batch``: the GEMMs and the MoE
once over every row, the attention of every sequence over its own cache in one launch set over a
cache pool, or with ``--separate-caches`` a launch set a sequence), replayed as one CUDA graph,
timed by CUDA events (median of ``--reps``; no host readback).

What is and is not in the figures:
- **Acceptance is replayed, not measured here**: random weights accept nothing, so a ddtree round
  commits the demo pair's measured mean acceptance at that budget (``results/demo_pair.json``,
  8 held-out prompts, graph mode) and an ar round 1 token. tokens/s = S x tokens a round / ms a
  round.
- **The verify forward only**: the drafter, the tree build and the accept of a batched round are
  not timed (the device-resident batched round does not exist yet; at batch 1 on the demo pair
  they are about a third of a round).
- ``unique_experts``: the distinct routed experts the router picked in a round, the mean over the
  MoE layers (uniform-ish under random weights; at most ``n_routed_experts`` = 64).
- Layouts of more than ``--max-rows`` verified rows are skipped (logits alone are 0.66 MB a row).
- The floor of a round: max(bytes / 4.2 TB/s, FLOPs / the mma.sync ceiling measured in this run),
  ``verify_forward.cost_model`` for all the rows (weights read once, routed experts as uniform
  routing touches them) plus every sequence's own latent cache. No peer column yet: HF
  transformers has no batched tree verify to set beside it.

Rows of ``results/batch.json``: batch, method, budget, tokens_per_s, unique_experts, ms_per_round
(and rows, tokens_per_round).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import COPY_BW, MMA_RATE, RESULTS, append_rows, mma_ceiling  # noqa: E402
from verify_forward import (MOONLIGHT, build_target, cost_model, ddtree_tree, device_timer,  # noqa: E402
                            prefilled_cache)


def demo_acceptance(budgets) -> dict:
    """{budget: mean accepted tokens a ddtree round} from the committed demo-pair run."""
    path = RESULTS / "demo_pair.json"
    rows = json.loads(path.read_text())["rows"]
    have = {r["budget"]: float(r["mean_acceptance"]) for r in rows if r["method"] == "ddtree"}
    missing = [b for b in budgets if b not in have]
    if missing:
        raise ValueError(f"{path} has no ddtree row at budget(s) {missing} (it has {sorted(have)}): "
                         "choose --budgets among them")
    return {b: have[b] for b in budgets}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--budgets", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--layers", type=int, default=27)
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-rows", type=int, default=4096, help="skip layouts verifying more rows")
    ap.add_argument("--separate-caches", action="store_true",
                    help="a cache a sequence (the attention launched per sequence), not one pool")
    ap.add_argument("--no-append", action="store_true")
    ap.add_argument("--dry-run", action="store_true",
                    help="a tiny config of the same architecture, eager (checks the script, e.g. in the simulator)")
    args = ap.parse_args()

    from numba import config as numba_config
    from numba import cuda
    from ddtree_numba.model.config import ModelConfig
    from ddtree_numba.model.target import Segment
    sim = numba_config.ENABLE_CUDASIM
    time_gpu = device_timer(sim)
    accept = demo_acceptance(args.budgets)

    shape = dict(MOONLIGHT, num_hidden_layers=args.layers)
    if args.dry_run:
        shape.update(vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=8,
                     num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=16, qk_nope_head_dim=8,
                     qk_rope_head_dim=8, v_head_dim=8, n_routed_experts=8, num_experts_per_tok=2)
    cfg = ModelConfig.from_dict(shape)
    target = build_target(cfg)
    rng = np.random.default_rng(0)
    cap = args.prefix + max(args.budgets) + 1
    if args.separate_caches:
        caches = [prefilled_cache(target, args.prefix, cap, rng) for _ in range(max(args.batches))]
    else:                                    # one pool: every sequence's attention in one launch set
        pool = target.new_cache_pool(max(args.batches), cap)
        for name in ("c_kv", "k_pe"):
            arr = getattr(pool, name)
            getattr(pool, name).copy_to_device(rng.standard_normal(arr.shape, np.float32))
        caches = pool.caches
    moe_layers = [i for i in range(cfg.num_hidden_layers) if cfg.is_moe_layer(i)]
    stream = cuda.stream()
    mma_rate = MMA_RATE if sim else mma_ceiling(stream)
    C, R = cfg.kv_lora_rank, cfg.qk_rope_head_dim

    rows, values = [], []
    for method, budget in [("ar", 1)] + [("ddtree", b) for b in args.budgets]:
        per_seq = 1 if method == "ar" else budget + 1
        tokens = 1.0 if method == "ar" else accept[budget]
        for batch in args.batches:
            if batch * per_seq > args.max_rows:
                print(f"skipped: {method} budget {budget} batch {batch} ({batch * per_seq} rows > --max-rows)")
                continue
            segs = []
            for cache in caches[:batch]:
                cache.length = args.prefix
                parents, depth = ddtree_tree(rng, per_seq)
                segs.append(Segment(rng.integers(0, cfg.vocab_size, per_seq).astype(np.int32),
                                    (args.prefix + depth).astype(np.int32), cache, parents))

            def one_round():
                target.enqueue_batch(segs, graph=not sim, stream=stream)     # lengths not advanced

            us = time_gpu(one_round, stream, reps=args.reps, warmup=1)
            out = target.forward_batch(segs)                                  # experts, a finite check
            for cache in caches[:batch]:
                cache.length = args.prefix
            unique = float(np.mean(out.unique_experts[moe_layers])) if moe_layers else 0.0
            tps = batch * tokens / (us / 1e6)
            b = budget if method == "ddtree" else "-"
            # one cost model over every row, each sequence's cache read once (cost_model counts one)
            n_bytes, flops = cost_model(cfg, batch * per_seq, args.prefix + per_seq)
            n_bytes += (batch - 1) * cfg.num_hidden_layers * (args.prefix + per_seq) * (C + R) * 4
            floor_ms = max(n_bytes / COPY_BW, flops / mma_rate) * 1e3
            rows.append([batch, method, b, batch * per_seq, f"{tokens:.2f}", f"{us / 1e3:.2f}", f"{floor_ms:.2f}",
                         f"{us / 1e3 / floor_ms:.1f}x", f"{tps:,.0f}", f"{unique:.1f}"])
            values.append([batch, method, b, batch * per_seq, round(tokens, 3), round(us / 1e3, 3), round(floor_ms, 3),
                           round(us / 1e3 / floor_ms, 2), round(tps, 1), round(unique, 2)])
            print(f"{method} budget {b} batch {batch}: {us / 1e3:.2f} ms a round, {tps:,.0f} tokens/s", flush=True)

    note = (f"Moonlight-16B-A3B shape, {cfg.num_hidden_layers} layers, random bf16 weights, each sequence its own "
            f"{args.prefix}-row latent cache ("
            + ("separate caches, the attention launched per sequence" if args.separate_caches
               else "slots of one pool, the attention of every sequence in one launch set")
            + "); one verify forward (CudaTarget.forward_batch, a CUDA graph) a round for all sequences: ar 1 token a sequence, ddtree a random tree of budget + 1 nodes a sequence. Tokens a "
            "round replayed from the demo pair's measured mean acceptance (results/demo_pair.json), not measured "
            "here; the drafter, tree build and accept are not timed. Floor = max(bytes / 4.2 TB/s, FLOPs / "
            f"{mma_rate / 1e12:.0f} TFLOP/s, the mma.sync ceiling measured in this run), weights once and every "
            "sequence's cache; no peer (HF has no batched tree verify). Unique experts: the mean over the MoE "
            "layers of the distinct routed experts picked in the round (of "
            f"{cfg.n_routed_experts}).")
    header = ["batch", "method", "budget", "rows verified", "tokens a round", "ms a round", "floor ms",
              "ms / floor", "tokens/s", "unique experts"]
    keys = ["batch", "method", "budget", "rows", "tokens_per_round", "ms_per_round", "floor_ms", "ms_per_floor",
            "tokens_per_s", "unique_experts"]
    append_rows("Batches of trees, Moonlight-16B-A3B shape (benchmarks/batch.py)", header, rows, note,
                append=not args.no_append, results="batch", keys=keys, values=values)


if __name__ == "__main__":
    main()
