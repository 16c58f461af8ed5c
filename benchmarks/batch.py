"""Batches of trees at the Moonlight-16B-A3B shape: whole batched rounds, or one verify forward,
for S sequences (issue 17).

Usage (a GPU machine): python benchmarks/batch.py [--batches 1 4 16] [--budgets 16 64] [--layers 27]
    [--prompt 256] [--rounds 12] [--drafter-layers 3] [--verify-only [--prefix 1024] [--max-rows 4096]]
    [--dry-run]

Random bf16 weights (``verify_forward.build_target``), S sequences.

**Whole rounds** (the default): ``generate_batch`` on the GPU (``decode.device_batch``), each round
one CUDA graph: every slot's draft in one forward of a random bf16 DFlash drafter
(``--drafter-layers`` layers of the target's width, 16 heads / 4 KV heads of 128, intermediate
5632, block 16, reading target layers 1, 13, 25; the target's lm_head), the top-K and the trees,
one verify forward over every live slot's rows, the accept, the compactions, and the host's read of
the round's report (the loop synchronizes every round, as a user's call does). Prompts of
``--prompt`` random tokens; a warm-up call (compiles, captures the graph), then a timed call of
about ``--rounds`` rounds replaying the kept graph. ``ms_per_round`` = the timed call's round time
by the host's clock over its rounds.

**``--verify-only``**: the verify forward alone, as runs before 2026-12-05 timed it: each sequence
its own latent cache of ``--prefix`` random rows, a round one ``CudaTarget.forward_batch`` over all
S sequences' rows (``enqueue_batch``: the GEMMs and the MoE once over every row, the attention of
every sequence over its own cache in one launch set over a cache pool, or with
``--separate-caches`` a launch set a sequence) of ``verify_forward.ddtree_tree`` trees, replayed as
one CUDA graph, timed by CUDA events (median of ``--reps``; no host readback). Layouts of more than
``--max-rows`` verified rows are skipped (logits alone are 0.66 MB a row).

What is and is not in the figures:
- **Acceptance is replayed, not measured here**: random weights accept nothing, so tokens/s counts a
  ddtree round as committing the demo pair's measured mean acceptance at that budget
  (``results/demo_pair.json``, 8 held-out prompts, graph mode) and an ar round 1 token:
  tokens/s = S x tokens a round / ms a round. (The whole-round runs' trees are those of the
  random drafter's drafts; ``rows``, their verify rows a round, is measured: S x (budget + 1) as
  a real draft's.)
- ``unique_experts``: the distinct routed experts the router picked in a round, the mean over the
  MoE layers (and over the rounds; uniform-ish under random weights; at most 64).
- The floor: of the verify forward alone, max(bytes / 4.2 TB/s, FLOPs / the mma.sync ceiling
  measured in this run), ``verify_forward.cost_model`` for all the rows (weights read once, routed
  experts as uniform routing touches them) plus every sequence's own latent cache. No peer column:
  HF transformers has no batched tree verify to set beside it.

Rows of ``results/batch.json`` (whole rounds) or ``results/batch_verify.json`` (``--verify-only``):
batch, method, budget, tokens_per_s, unique_experts, ms_per_round (and rows, tokens_per_round,
floor_ms, ms_per_floor).
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
                         "choose --budgets among them, or run benchmarks/demo_pair.py (its default budgets "
                         "include 4 and 8) on the GPU first")
    return {b: have[b] for b in budgets}


DRAFTER = dict(num_attention_heads=16, num_key_value_heads=4, head_dim=128, intermediate_size=5632, block_size=16)


def moonlight_drafter(target, layers: int, dry_run: bool):
    """A CudaDrafter of random bf16 matrices for ``target`` (``DRAFTER``; the dry run's tiny shape)."""
    from ddtree_numba.model.loader import random_drafter
    shape = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=8, intermediate_size=16,
                 block_size=4) if dry_run else DRAFTER
    n = target.config.num_hidden_layers
    ids = tuple(sorted({min(1, n - 1), n // 2, n - 2 if n > 2 else n - 1}))
    return random_drafter(target, num_hidden_layers=layers, target_layer_ids=ids, seed=1, weight_dtype="bfloat16",
                          **shape)


def time_rounds(target, drafter, method: str, budget: int, batch: int, prompt: int, rounds: int, graph: bool, rng,
                moe_layers):
    """ms a whole batched round (the host's clock, over a timed call after a warm-up call), the
    mean unique experts a MoE layer (of ``moe_layers``) a round, the rounds, and the mean verify
    rows a round."""
    import ddtree_numba as dd
    cfg = target.config
    prompts = [rng.integers(0, cfg.vocab_size - 1, prompt).astype(np.int32) for _ in range(batch)]
    kw = dict(max_new_tokens=rounds + 1, method=method, budget=budget, graph=graph)
    dd.generate_batch(target, drafter, prompts, **kw)             # compiles; captures the round's graph
    res = dd.generate_batch(target, drafter, prompts, **kw)       # replays the kept graph from round 1
    assert all(r.loop == "device" for r in res), "the batch did not run on the GPU"
    n = len(res.rounds)
    unique = float(np.mean([r.unique_experts[moe_layers].mean() for r in res.rounds])) if moe_layers else 0.0
    return res[0].stage_times["round"] / n * 1e3, unique, n, float(np.mean([r.rows for r in res.rounds]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--budgets", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--layers", type=int, default=27)
    ap.add_argument("--prompt", type=int, default=256, help="(whole rounds) prompt tokens a sequence")
    ap.add_argument("--rounds", type=int, default=12, help="(whole rounds) rounds of the timed call, about")
    ap.add_argument("--drafter-layers", type=int, default=3, help="(whole rounds) the random drafter's layers")
    ap.add_argument("--verify-only", action="store_true", help="time the verify forward alone (a CUDA graph)")
    ap.add_argument("--prefix", type=int, default=1024, help="(--verify-only) cached rows a sequence")
    ap.add_argument("--reps", type=int, default=5, help="(--verify-only) timed replays, the median")
    ap.add_argument("--max-rows", type=int, default=4096, help="skip layouts verifying more rows")
    ap.add_argument("--separate-caches", action="store_true",
                    help="(--verify-only) a cache a sequence (the attention launched per sequence), not one pool")
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
    whole = not args.verify_only
    prefix = args.prompt if whole else args.prefix
    caches = drafter = None
    if whole:
        drafter = moonlight_drafter(target, args.drafter_layers, args.dry_run)
    elif args.separate_caches:
        cap = args.prefix + max(args.budgets) + 1
        caches = [prefilled_cache(target, args.prefix, cap, rng) for _ in range(max(args.batches))]
    else:                                    # one pool: every sequence's attention in one launch set
        pool = target.new_cache_pool(max(args.batches), args.prefix + max(args.budgets) + 1)
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
            if whole:
                ms, unique, n_rounds, n_rows = time_rounds(target, None if method == "ar" else drafter, method,
                                                           budget, batch, args.prompt, args.rounds, not sim, rng,
                                                           moe_layers)
            else:
                n_rows = batch * per_seq
                segs = []
                for cache in caches[:batch]:
                    cache.length = args.prefix
                    parents, depth = ddtree_tree(rng, per_seq)
                    segs.append(Segment(rng.integers(0, cfg.vocab_size, per_seq).astype(np.int32),
                                        (args.prefix + depth).astype(np.int32), cache, parents))

                def one_round():
                    target.enqueue_batch(segs, graph=not sim, stream=stream)     # lengths not advanced

                ms = time_gpu(one_round, stream, reps=args.reps, warmup=1) / 1e3
                out = target.forward_batch(segs)                                  # experts, a finite check
                for cache in caches[:batch]:
                    cache.length = args.prefix
                unique = float(np.mean(out.unique_experts[moe_layers])) if moe_layers else 0.0
            tps = batch * tokens / (ms / 1e3)
            b = budget if method == "ddtree" else "-"
            # one cost model over every row, each sequence's cache read once (cost_model counts one)
            n_bytes, flops = cost_model(cfg, batch * per_seq, prefix + per_seq)
            n_bytes += (batch - 1) * cfg.num_hidden_layers * (prefix + per_seq) * (C + R) * 4
            floor_ms = max(n_bytes / COPY_BW, flops / mma_rate) * 1e3
            rows.append([batch, method, b, f"{n_rows:g}", f"{tokens:.2f}", f"{ms:.2f}", f"{floor_ms:.2f}",
                         f"{ms / floor_ms:.1f}x", f"{tps:,.0f}", f"{unique:.1f}"])
            values.append([batch, method, b, round(n_rows, 2), round(tokens, 3), round(ms, 3), round(floor_ms, 3),
                           round(ms / floor_ms, 2), round(tps, 1), round(unique, 2)])
            print(f"{method} budget {b} batch {batch}: {ms:.2f} ms a round"
                  + (f" ({n_rounds} rounds)" if whole else "") + f", {tps:,.0f} tokens/s", flush=True)

    what = (f"whole batched rounds (generate_batch on the GPU, each round one CUDA graph: the drafts of a random bf16 "
            f"{args.drafter_layers}-layer DFlash drafter in one forward, top-K, the trees, one verify forward, accept, "
            f"compaction, the host's read of the report), prompts of {args.prompt} random tokens, ms a round by the "
            f"host's clock over a call of about {args.rounds} rounds after a warm-up call; ar 1 token a sequence a "
            "round, ddtree budget + 1 rows a sequence" if whole else
            f"one verify forward (CudaTarget.forward_batch, a CUDA graph, CUDA events) a round for all sequences, each "
            f"its own {args.prefix}-row latent cache ("
            + ("separate caches, the attention launched per sequence" if args.separate_caches
               else "slots of one pool, the attention of every sequence in one launch set")
            + "): ar 1 token a sequence, ddtree a DDTree-shaped tree of budget + 1 nodes a sequence; the drafter, "
            "tree build and accept not timed")
    note = (f"Moonlight-16B-A3B shape, {cfg.num_hidden_layers} layers, random bf16 weights; {what}. Tokens a "
            "round replayed from the demo pair's measured mean acceptance (results/demo_pair.json), not measured "
            "here. Floor (of the verify forward alone) = max(bytes / 4.2 TB/s, FLOPs / "
            f"{mma_rate / 1e12:.0f} TFLOP/s, the mma.sync ceiling measured in this run), weights once and every "
            "sequence's cache; no peer (HF has no batched tree verify). Unique experts: the mean over the MoE "
            "layers of the distinct routed experts picked in a round (of "
            f"{cfg.n_routed_experts}).")
    header = ["batch", "method", "budget", "rows verified", "tokens a round", "ms a round", "verify floor ms",
              "ms / floor", "tokens/s", "unique experts"]
    keys = ["batch", "method", "budget", "rows", "tokens_per_round", "ms_per_round", "floor_ms", "ms_per_floor",
            "tokens_per_s", "unique_experts"]
    title = "whole rounds" if whole else "verify forward only"
    append_rows(f"Batches of trees, Moonlight-16B-A3B shape, {title} (benchmarks/batch.py)", header, rows, note,
                append=not args.no_append, results="batch" if whole else "batch_verify", keys=keys, values=values,
                extra=dict(shape="Moonlight-16B-A3B", layers=cfg.num_hidden_layers,
                           n_routed_experts=cfg.n_routed_experts))


if __name__ == "__main__":
    main()
