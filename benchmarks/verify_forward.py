"""One tree-verify target forward on the GPU at the Moonlight-16B-A3B shape, eager and graph.

Usage (on a GPU machine): python benchmarks/verify_forward.py [--nodes 1 16 64 256] [--layers 27]
    [--prefix 1024] [--no-append] [--peer]
or, Kimi K2's shape with INT4 routed experts: python benchmarks/verify_forward.py --shape kimi-k2
    [--layers 3] [--nodes 1 16 64 256]

Moonlight-16B-A3B is a real DeepSeek-V3-architecture checkpoint: 27 layers, hidden 2048, 16 heads,
no q_lora, kv_lora 512, nope/rope/v 128/64/128, 64 routed experts (top-6, sigmoid + noaux_tc,
scaling 2.446) with 2 shared, expert width 1408, a dense first layer of width 11264, vocab 163840.
Weights are random bf16 made on the GPU (no checkpoint needed); the latent cache holds a random
``--prefix``-row prefix; the new tokens form a tree (``--tree ddtree``, the default: the best-first
tree a DDTree round builds over random drafts, at most 15 deep; ``--tree deep``: random, ~n / 4.5
deep, the tree of every run before 2026-12-04, whose attention sees that many more keys).

``--nodes`` counts the rows verified, the root included: a DDTree round of budget B verifies B + 1.

Per node count: ms eager (every kernel launched from Python) and ms graph (one CUDA-graph replay),
the bytes the forward must move and its FLOPs, the floor max(bytes / 4.2 TB/s, FLOPs / the mma.sync
ceiling measured in the same run), GEMMs in ``--precision`` (default bf16),
and, with ``--peer``, the peer: HF transformers DeepseekV3ForCausalLM in bf16 on the same GPU and
shape, measured in this run first (no figure is carried over from another run). Then a per-kernel
breakdown of one MoE layer. ``results/verify_forward.json`` rows: nodes, ms (graph), eager_ms,
floor_ms, peer_ms (null without --peer), bytes, flops, ms_per_floor, peer_per_ms.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import COPY_BW, MMA_RATE, append_rows, mma_ceiling, random_bf16, random_int4  # noqa: E402

MOONLIGHT = dict(
    model_type="deepseek_v3", vocab_size=163840, hidden_size=2048, intermediate_size=11264,
    moe_intermediate_size=1408, num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16,
    q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6, n_group=1, topk_group=1,
    topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True, routed_scaling_factor=2.446,
    first_k_dense_replace=1, rms_norm_eps=1e-5, rope_theta=50000.0, max_position_embeddings=8192,
    tie_word_embeddings=False, rope_interleave=True,
)
# Kimi K2 (Instruct / Thinking): 61 layers, the first dense; its routed experts INT4 in groups of 32 as
# K2 Thinking ships them. The whole model (~590 GB in INT4) does not fit one H200: --layers times a
# slice of full-shape layers and projects the 61.
KIMI_K2 = dict(
    model_type="kimi_k2", vocab_size=163840, hidden_size=7168, intermediate_size=18432,
    moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=64, num_key_value_heads=64,
    q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    n_routed_experts=384, n_shared_experts=1, num_experts_per_tok=8, n_group=1, topk_group=1,
    topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True, routed_scaling_factor=2.827,
    first_k_dense_replace=1, rms_norm_eps=1e-6, rope_theta=50000.0, max_position_embeddings=131072,
    tie_word_embeddings=False, rope_interleave=True,
)
INT4_GROUP = 32
INT4_BYTES = 0.5 + 2 / INT4_GROUP        # a weight's share of the checkpoint: a nibble and a bf16 scale per group


class RandomBF16:
    """Random bf16 matrices made on the GPU, each with unit-gain scale sqrt(3 / fan_in)."""

    def __init__(self):
        self.seed = 1

    def __call__(self, *shape):
        from numba import config, cuda
        self.seed += 1
        if config.ENABLE_CUDASIM:          # a dry run of the script (libdevice is a stub there)
            from ddtree_numba.dtypes import to_bf16_bits
            rng = np.random.default_rng(self.seed)
            return cuda.to_device(to_bf16_bits(rng.uniform(-1, 1, shape) * math.sqrt(3.0 / shape[-1])))
        return random_bf16(shape, math.sqrt(3.0 / shape[-1]), self.seed * 7919)


def random_int4_experts(*shape):
    """Random int4 experts in groups of 32 (``dtypes.Int4Grouped``), unit-gain scale."""
    from numba import config
    from ddtree_numba._device import to_device
    from ddtree_numba.dtypes import Int4Grouped, to_bf16_bits
    scale = math.sqrt(3.0 / shape[-1])
    if config.ENABLE_CUDASIM:
        rng = np.random.default_rng(shape[-1])
        q = rng.integers(-8, 8, shape)
        sc = to_bf16_bits(np.full(tuple(shape[:-1]) + (shape[-1] // INT4_GROUP,), scale / 8, np.float32))
        return to_device(Int4Grouped(Int4Grouped.pack(q), sc, INT4_GROUP, shape[-1]))
    return random_int4(shape, scale, 1 + shape[-1], group=INT4_GROUP)


def build_target(cfg, precision="bf16", int4_experts=False):
    """A CudaTarget with random bf16 matrices (float32 norms, router and bias); ``int4_experts``:
    the routed experts int4 in groups of 32 (Kimi K2 Thinking's format)."""
    from numba import cuda
    from ddtree_numba.model.cuda_target import CudaTarget, DeviceLayer
    from ddtree_numba.model.target import rope_tables
    rng = np.random.default_rng(0)
    mat = RandomBF16()
    M, H, C, R = cfg.hidden_size, cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    D, Dv, E, Ie = cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.n_routed_experts, cfg.moe_intermediate_size
    f32 = lambda a: cuda.to_device(np.ascontiguousarray(a, np.float32))  # noqa: E731
    layers = []
    for i in range(cfg.num_hidden_layers):
        Q = cfg.q_lora_rank
        lw = DeviceLayer(
            input_layernorm=f32(rng.uniform(0.5, 1.5, M)), post_attention_layernorm=f32(rng.uniform(0.5, 1.5, M)),
            q_proj=mat(H * (D + R), M) if Q is None else None,
            q_a_proj=None if Q is None else mat(Q, M), q_a_layernorm=None if Q is None else f32(rng.uniform(0.5, 1.5, Q)),
            q_b_proj=None if Q is None else mat(H * (D + R), Q),
            kv_a_proj_with_mqa=mat(C + R, M), kv_a_layernorm=f32(rng.uniform(0.5, 1.5, C)),
            w_uk_t=mat(H, C, D), w_uv=mat(H, Dv, C), o_proj=mat(M, H * Dv))
        if cfg.is_moe_layer(i):
            lw.gate = f32(rng.standard_normal((E, M)) * (3.0 / math.sqrt(M)))
            lw.e_score_correction_bias = f32(0.1 * rng.standard_normal(E))
            expert = random_int4_experts if int4_experts else mat
            lw.experts_gate_proj, lw.experts_up_proj = expert(E, Ie, M), expert(E, Ie, M)
            lw.experts_down_proj = expert(E, M, Ie)
            Is = Ie * cfg.n_shared_experts
            lw.shared_gate_proj, lw.shared_up_proj, lw.shared_down_proj = mat(Is, M), mat(Is, M), mat(M, Is)
        else:
            I = cfg.intermediate_size
            lw.mlp_gate_proj, lw.mlp_up_proj, lw.mlp_down_proj = mat(I, M), mat(I, M), mat(M, I)
        layers.append(lw)
    embed, head = mat(cfg.vocab_size, M), mat(cfg.vocab_size, M)
    return CudaTarget(cfg, embed, f32(rng.uniform(0.5, 1.5, M)), head, layers, rope_tables(cfg),
                      precision=precision)


def device_timer(sim):
    """``_common.time_gpu``, or in the simulator (no events, no graphs: a dry run checks the
    script only) one host-timed call."""
    from _common import time_gpu, time_host
    if sim:
        return lambda fn, stream, reps, warmup: time_host(fn, reps=1, warmup=0)
    return time_gpu


def prefilled_cache(target, prefix, cap, rng):
    """A device latent cache of ``cap`` rows, every row random, the first ``prefix`` live."""
    cfg = target.config
    cache = target.new_cache(cap)
    for layer in range(cfg.num_hidden_layers):
        cache.c_kv[layer].copy_to_device(rng.standard_normal((cap, cfg.kv_lora_rank)).astype(np.float32))
        cache.k_pe[layer].copy_to_device(rng.standard_normal((cap, cfg.qk_rope_head_dim)).astype(np.float32))
    cache.length = prefix
    return cache


def tree_workspace(target, t, prefix, rng, tree="ddtree"):
    """The workspace for ``t`` new rows, holding a tree of t nodes (``TREES[tree]``) after
    ``prefix`` cached rows: ids, positions (prefix + depth), parents and meta, ready for
    ``forward_device``."""
    ws = target.workspace(t)
    parents, depth = TREES[tree](rng, t)
    chain = np.arange(-1, ws.rows - 1, dtype=np.int32)
    chain[:t] = parents
    ids = np.zeros(ws.rows, np.int32)
    ids[:t] = rng.integers(0, target.config.vocab_size, t)
    pos = np.zeros(ws.rows, np.int32)
    pos[:t] = prefix + depth
    ws.ids.copy_to_device(ids)
    ws.positions.copy_to_device(pos)
    ws.parents.copy_to_device(chain)
    ws.meta.copy_to_device(np.array([prefix, t], np.int32))
    return ws


def ddtree_tree(rng, n, depths=15, width=64):
    """parents [n] and depths [n] of the tree a DDTree round of budget n - 1 builds
    (``reference.build_tree``, best first, node 0 the root) over random draft distributions of
    ``depths`` positions (a block-16 drafter's), ``width`` tokens kept a position: a DDTree
    verify's shape, at most ``depths`` deep, bushy where the draft is unsure."""
    from ddtree_numba import reference as ref
    if n == 1:
        return np.full(1, -1, np.int32), np.zeros(1, np.int32)
    # peaky drafts (logits of standard deviation 8): 5 / 13 / 15 / 15 deep at 16 / 64 / 256 / 1024 nodes
    logits = (rng.standard_normal((depths, 4 * width)) * 8).astype(np.float32)
    tree = ref.build_tree(*ref.topk_logprobs(logits, width), n - 1)
    assert tree.num_nodes == n - 1, f"a draft of {depths} x {width} holds fewer than {n - 1} paths"
    return tree.parents.astype(np.int32), np.concatenate([[0], tree.depths]).astype(np.int32)


def random_tree(rng, n):
    """parents [n] of a random tree over n nodes (node 0 the root), and its depths: each node's
    parent one of the 8 before it, so ~n / 4.5 deep (230 at 1024 nodes, far deeper than a DDTree
    of a 16-block drafter; its attention sees that many more keys)."""
    parents = np.full(n, -1, np.int32)
    depth = np.zeros(n, np.int32)
    for i in range(1, n):
        parents[i] = rng.integers(max(0, i - 8), i)        # bushy but deep-ish, like a DDTree
        depth[i] = depth[parents[i]] + 1
    return parents, depth


TREES = {"ddtree": ddtree_tree, "deep": random_tree}   # --tree; "deep" was every run's before 2026-12-04


def cost_model(cfg, t, s, expert_bytes=2.0):
    """(bytes, FLOPs) one forward of t new tokens over s cache rows must move / do, bf16 weights
    (routed experts ``expert_bytes`` a weight: INT4_BYTES for int4)."""
    M, H, C, R = cfg.hidden_size, cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    D, Dv, E, K, Ie = (cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.n_routed_experts,
                       cfg.num_experts_per_tok, cfg.moe_intermediate_size)
    q = H * (D + R) * M if cfg.q_lora_rank is None else cfg.q_lora_rank * (M + H * (D + R))
    attn = q + (C + R) * M + H * C * D + H * Dv * C + M * H * Dv   # weights per layer
    touched = E * (1.0 - (1.0 - K / E) ** t)                    # distinct experts hit, uniform routing
    shared = 3 * Ie * cfg.n_shared_experts * M
    n_moe = sum(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
    n_dense = cfg.num_hidden_layers - n_moe
    dense = 3 * cfg.intermediate_size * M
    weight_elems = (cfg.num_hidden_layers * attn + n_dense * dense + n_moe * shared + cfg.vocab_size * M)
    bytes_ = (2 * weight_elems + expert_bytes * n_moe * touched * 3 * Ie * M + n_moe * E * M * 4
              + cfg.num_hidden_layers * s * (C + R) * 4)
    per_token = (cfg.num_hidden_layers * attn + n_dense * dense + n_moe * (K * 3 * Ie * M + shared + E * M)
                 + cfg.vocab_size * M)
    flops = 2 * t * per_token + cfg.num_hidden_layers * t * H * s * 2 * (C + R + C)
    return bytes_, flops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 16, 64, 256, 1024])
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--layers", type=int, default=27)
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--no-append", action="store_true")
    ap.add_argument("--peer", action="store_true", help="measure the HF peer here too (slow)")
    ap.add_argument("--json", metavar="FILE",
                    help="also write {label, nodes, ms (graph), eager_ms, ...} for `ddtree-numba plot --verify-bench`")
    ap.add_argument("--no-breakdown", action="store_true", help="skip the per-kernel breakdown of one layer")
    ap.add_argument("--tree", choices=sorted(TREES), default="ddtree",
                    help="ddtree: the best-first tree a DDTree round builds over random drafts (at most 15 "
                         "deep); deep: a random tree ~n / 4.5 deep (every run's before 2026-12-04)")
    ap.add_argument("--shape", choices=["moonlight", "kimi-k2"], default="moonlight",
                    help="kimi-k2: Kimi K2's full-shape layers with INT4 routed experts (a --layers slice, "
                         "projected to 61; results in kimi_k2.json)")
    ap.add_argument("--dry-run", action="store_true",
                    help="a tiny config of the same architecture (checks the script, e.g. in the simulator)")
    ap.add_argument("--shared-inline", action="store_true",
                    help="the MoE blocks' shared experts in line, not on a side stream (kernels.moe.CONCURRENT_SHARED)")
    ap.add_argument("--no-x-raw", action="store_true",
                    help="the register GEMM kernel packs activations at their loads (kernels.linear._X_RAW off)")
    ap.add_argument("--fp32-scores", action="store_true",
                    help="MLA's scores in float32 chains (kernels.mla.MMA_SCORES off; on by default)")
    ap.add_argument("--fp32-pv", action="store_true",
                    help="MLA's p @ c_kv in float32 chains (kernels.mla.MMA_PV off; on by default)")
    ap.add_argument("--dense-ring-rows", type=int, metavar="N",
                    help="dense GEMMs take the cp.async weight ring from N workspace rows "
                         "(kernels.linear._RING_ROWS; below it the register kernel, which splits the chunks)")
    args = ap.parse_args()
    import importlib
    if args.dense_ring_rows is not None:
        importlib.import_module("ddtree_numba.kernels.linear")._RING_ROWS = args.dense_ring_rows
    if args.fp32_scores or args.fp32_pv:
        mla_module = importlib.import_module("ddtree_numba.kernels.mla")
        mla_module.MMA_SCORES = mla_module.MMA_SCORES and not args.fp32_scores
        mla_module.MMA_PV = mla_module.MMA_PV and not args.fp32_pv
    if args.shared_inline:
        import ddtree_numba.kernels.moe as moe_kernels
        moe_kernels.CONCURRENT_SHARED = False
    if args.no_x_raw:                         # the module (kernels.linear is also the launcher's name)
        importlib.import_module("ddtree_numba.kernels.linear")._X_RAW = False

    from numba import config as numba_config
    from numba import cuda
    from ddtree_numba.model.config import ModelConfig
    sim = numba_config.ENABLE_CUDASIM
    time_gpu = device_timer(sim)

    kimi = args.shape == "kimi-k2"
    if kimi:
        return kimi_k2_slice(args)
    shape = dict(MOONLIGHT, num_hidden_layers=args.layers)
    if args.dry_run:
        shape.update(vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=8,
                     num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8,
                     v_head_dim=8, n_routed_experts=8, num_experts_per_tok=2)
    cfg = ModelConfig.from_dict(shape)
    # the peer first, in this run, and its GPU memory given back before our target is built
    peer_ms = measure_peer(cfg, args) if args.peer else {}
    target = build_target(cfg, args.precision)
    rng = np.random.default_rng(0)
    cap = args.prefix + max(args.nodes)
    cache = prefilled_cache(target, args.prefix, cap, rng)
    stream = cuda.stream()
    mma_rate = MMA_RATE if sim else mma_ceiling(stream)

    rows, values, breakdown, times = [], [], {}, []
    for t in args.nodes:
        ws = tree_workspace(target, t, args.prefix, rng, args.tree)
        eager_us = time_gpu(lambda: target.forward_device(ws, cache, (), graph=False, stream=stream),
                            stream, reps=args.reps, warmup=2)
        graph_us = eager_us if sim else time_gpu(
            lambda: target.forward_device(ws, cache, (), graph=True, stream=stream), stream,
            reps=args.reps, warmup=2)
        times.append((t, eager_us / 1e3, graph_us / 1e3))
        logits = ws.logits[:t].copy_to_host()
        assert np.isfinite(logits).all(), "non-finite logits"
        b, f = cost_model(cfg, t, args.prefix + t)
        floor_ms = max(b / COPY_BW, f / mma_rate) * 1e3
        peer = peer_ms.get(t)
        rows.append([t, f"{eager_us / 1e3:.2f}", f"{graph_us / 1e3:.2f}", f"{b / 1e9:.2f} GB",
                     f"{f / 1e12:.3f} TFLOP", f"{floor_ms:.2f}", f"{graph_us / 1e3 / floor_ms:.2f}x",
                     f"{peer:.1f}" if peer else "-",
                     f"{peer / (graph_us / 1e3):.2f}x" if peer else "-"])
        values.append([t, round(eager_us / 1e3, 3), round(graph_us / 1e3, 3), int(b), int(f), round(floor_ms, 3),
                       round(graph_us / 1e3 / floor_ms, 3), round(peer, 2) if peer else None,
                       round(peer / (graph_us / 1e3), 3) if peer else None])
        if not args.no_breakdown:
            breakdown[t] = {"(simulator)": 0.0} if sim else layer_breakdown(target, ws, cache, stream)

    note = (f"Moonlight-16B-A3B shape, {cfg.num_hidden_layers} layers, random bf16 weights, "
            f"{args.prefix}-row latent prefix, a tree of the given node count ("
            + ("a DDTree build over random drafts, at most 15 deep" if args.tree == "ddtree"
               else "random, ~nodes / 4.5 deep") + f", --tree {args.tree}). Floor = "
            f"max(bytes / 4.2 TB/s, FLOPs / {mma_rate / 1e12:.0f} TFLOP/s, the mma.sync ceiling measured in this "
            f"run); GEMMs on tensor cores in precision {args.precision}; bytes count every weight read once (routed "
            "experts: the expected number touched under uniform routing) and the f32 latent cache; "
            "peer = HF DeepseekV3ForCausalLM bf16 on the same GPU, measured in this run (--peer; '-' without it)."
            + (" The MoE blocks' shared experts in line (--shared-inline)." if args.shared_inline else "")
            + (" Activations packed at their loads (--no-x-raw)." if args.no_x_raw else "")
            + (f" Dense GEMMs on the weight ring from {args.dense_ring_rows} rows (--dense-ring-rows)."
               if args.dense_ring_rows is not None else "")
            + (" MLA's scores in float32 chains (--fp32-scores)." if args.fp32_scores
               else " MLA's scores on tensor cores (kernels.mla.MMA_SCORES).")
            + (" MLA's p @ c_kv in float32 chains (--fp32-pv)." if args.fp32_pv
               else " MLA's p @ c_kv on tensor cores (kernels.mla.MMA_PV)."))
    header = ["nodes", "eager ms", "graph ms", "bytes", "FLOPs", "floor ms", "graph / floor",
              "peer ms", "peer / graph"]
    keys = ["nodes", "eager_ms", "ms", "bytes", "flops", "floor_ms", "ms_per_floor", "peer_ms", "peer_per_ms"]
    append_rows("Verify forward, Moonlight-16B-A3B shape (benchmarks/verify_forward.py)", header, rows, note,
                append=not args.no_append, results="verify_forward", keys=keys, values=values)
    if args.json:
        import datetime
        import json
        from _common import commit
        name = "simulator" if sim else cuda.get_current_device().name
        with open(args.json, "w") as f:
            json.dump(dict(label=f"Moonlight-16B-A3B shape ({cfg.num_hidden_layers} layers)",
                           device=name.decode() if isinstance(name, bytes) else str(name), commit=commit(),
                           date=datetime.date.today().isoformat(), prefix=args.prefix,
                           nodes=[t for t, _, _ in times], ms=[g for _, _, g in times],
                           eager_ms=[e for _, e, _ in times], note=note), f, indent=1)
    if not breakdown:
        return
    names = list(next(iter(breakdown.values())))
    brows = [[n] + [f"{breakdown[t][n]:.1f}" for t in args.nodes] for n in names]
    bhead = ["kernel (one MoE layer), µs"] + [f"{t} nodes" for t in args.nodes]
    append_rows("Verify forward, per-kernel time of one MoE layer (eager, CUDA events)", bhead, brows,
                append=not args.no_append)


def kimi_k2_slice(args):
    """Kimi K2's shape, INT4 routed experts: a forward of ``--layers`` full-shape layers (the first
    dense, the rest MoE) at each node count, against the INT4 bytes floor, projected to 61 layers
    by adding 61 - layers more MoE layers at the measured per-MoE-layer time (the breakdown's)."""
    from numba import config as numba_config
    from numba import cuda
    from ddtree_numba.model.config import ModelConfig
    sim = numba_config.ENABLE_CUDASIM
    time_gpu = device_timer(sim)
    layers = args.layers if args.layers != 27 else 3          # 27 is the Moonlight default
    shape = dict(KIMI_K2, num_hidden_layers=layers)
    if args.dry_run:
        shape.update(vocab_size=64, hidden_size=64, intermediate_size=64, moe_intermediate_size=32,
                     num_attention_heads=2, num_key_value_heads=2, q_lora_rank=32, kv_lora_rank=16,
                     qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, n_routed_experts=8, num_experts_per_tok=2)
    cfg = ModelConfig.from_dict(shape)
    full = ModelConfig.from_dict(dict(shape, num_hidden_layers=61))
    target = build_target(cfg, args.precision, int4_experts=True)
    rng = np.random.default_rng(0)
    cap = args.prefix + max(args.nodes)
    cache = prefilled_cache(target, args.prefix, cap, rng)
    stream = cuda.stream()
    mma_rate = MMA_RATE if sim else mma_ceiling(stream)
    rows = []
    for t in args.nodes:
        ws = tree_workspace(target, t, args.prefix, rng, args.tree)
        run = (lambda: target.forward_device(ws, cache, (), graph=not sim, stream=stream))
        ms = time_gpu(run, stream, reps=args.reps, warmup=2) / 1e3
        assert np.isfinite(ws.logits[:t].copy_to_host()).all(), "non-finite logits"
        offsets = ws.moe.offsets.copy_to_host()                 # the last MoE layer's routing
        unique = int((np.diff(offsets) > 0).sum())
        moe_ms = (sum(layer_breakdown(target, ws, cache, stream).values()) / 1e3) if not sim else ms / layers
        projected = ms + (61 - layers) * moe_ms
        b, f = cost_model(cfg, t, args.prefix + t, expert_bytes=INT4_BYTES)
        floor_ms = max(b / COPY_BW, f / mma_rate) * 1e3
        b61, f61 = cost_model(full, t, args.prefix + t, expert_bytes=INT4_BYTES)
        floor61 = max(b61 / COPY_BW, f61 / mma_rate) * 1e3
        rows.append([t, layers, f"{ms:.2f}", f"{floor_ms:.2f}", f"{ms / floor_ms:.2f}x", f"{moe_ms:.2f}",
                     f"{projected:.1f}", f"{floor61:.1f}", unique])
    note = (f"Kimi K2 shape ({cfg.describe()}), routed experts int4 in groups of 32 (kept packed, decoded in "
            f"the GEMM), the rest bf16; {layers} full-shape layers (the first dense) over a {args.prefix}-row "
            "latent prefix, a random tree of the given node count, one CUDA-graph replay; floor = max(bytes / "
            f"4.2 TB/s, FLOPs / {mma_rate / 1e12:.0f} TFLOP/s) with int4 at {INT4_BYTES} B a weight (nibble + bf16 "
            "group scale, as stored in the checkpoint) and the expected routed experts touched; projected: "
            "the slice plus 61 - layers MoE layers at the per-MoE-layer time of the breakdown.")
    header = ["rows", "layers", "ms", "floor_ms", "ms / floor", "moe_layer_ms", "projected_61_layers_ms",
              "floor_61_layers_ms", "unique_experts"]
    append_rows("Verify forward, Kimi K2 shape, INT4 experts (benchmarks/verify_forward.py --shape kimi-k2)",
                header, rows, note, append=not args.no_append, results="kimi_k2")


def layer_breakdown(target, ws, cache, stream, reps=5):
    """Median µs per stage of layer 1 (an MoE layer), timed with events between the enqueues.

    A spin kernel first holds the stream for 20 ms, so every launch of the layer is queued
    before the GPU reaches it: the events then measure device time, not Python launch time."""
    from numba import cuda

    @cuda.jit
    def spin(n):
        if cuda.threadIdx.x == 0:
            for _ in range(n):
                cuda.nanosleep(1000)

    samples = {}
    for _ in range(reps):
        marks = []
        stream.synchronize()
        spin[1, 32, stream](20000)

        def mark(name):
            ev = cuda.event()
            ev.record(stream)
            marks.append((name, ev))

        mark("start")
        for name, enqueue in target.layer_stages(ws, cache, 1):
            enqueue(stream)
            mark(name)
        marks[-1][1].synchronize()
        for (_, a), (name, b) in zip(marks[:-1], marks[1:]):
            samples.setdefault(name, []).append(cuda.event_elapsed_time(a, b) * 1e3)
    return {k: float(np.median(v)) for k, v in samples.items()}


def measure_peer(cfg, args) -> dict:
    """HF transformers' DeepseekV3ForCausalLM, bf16, same shape, random weights, sdpa: the median
    ms of a forward of t new tokens over the prefix, for each t of --nodes -> {t: ms}. The model
    and its cache are freed before returning."""
    import time
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    hf = DeepseekV3Config(**{k: v for k, v in MOONLIGHT.items() if k != "model_type"},
                          torch_dtype="bfloat16")
    hf.num_hidden_layers = args.layers
    with torch.device("cuda"):
        model = DeepseekV3ForCausalLM(hf).to(torch.bfloat16).eval()
    peer = {}
    for t in args.nodes:
        ids = torch.randint(0, cfg.vocab_size, (1, args.prefix), device="cuda")
        with torch.no_grad():
            out = model(ids, use_cache=True)
            past = out.past_key_values
            new = torch.randint(0, cfg.vocab_size, (1, t), device="cuda")
            times = []
            for _ in range(5):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                model(new, past_key_values=past, use_cache=True)
                torch.cuda.synchronize()
                times.append((time.perf_counter() - t0) * 1e3)
                past.crop(args.prefix)
        peer[t] = float(np.median(times))
        print(f"peer HF bf16, {t} new tokens over {args.prefix}: {peer[t]:.1f} ms", flush=True)
    del model, past, out
    torch.cuda.empty_cache()
    return peer


if __name__ == "__main__":
    main()
