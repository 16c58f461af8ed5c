"""Build the tiny random DeepSeek-V3 / V2 / Kimi-K2 checkpoints under tests/data/ and the
logits HF transformers computes for them (the goldens the numpy reference forward is held to).

Needs the ``goldens`` extra (torch, transformers >= 5 with DeepseekV3ForCausalLM and
DeepseekV2ForCausalLM); the test suite itself never imports torch. Run from the repo root:

    python tools/make_goldens.py            # rewrites tests/data/<case>/

Each case directory holds:
  config.json             as a checkpoint ships it (HF >= 5 spelling, or the released one)
  model*.safetensors      HF tensor names as on disk (per-expert names), in the case's dtype
  expected.npz            ids [T], positions [T], logits [T, V] f32, hidden [T, L, M] f32
                          (hidden[:, i] = HF's hidden_states[i + 1]: the output of decoder layer
                          i, and for the last layer the final-normed state)
  tree.npz                prefix_ids [P], prefix_positions [P], tree_ids [N], parents [N],
                          tree_positions [N], logits [N, V], hidden [N, L, M]: row i is the
                          last row of a causal HF forward over prefix + root-to-node-i path.

HF's default init (std 0.02, unit norms, zero router bias) makes every expert, head and rope
angle look alike, so a wrong routing rule or rope layout would still pass. The init here is
widened: unit-variance projections, router logits of order 3, random norm weights and
correction biases.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import tempfile

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data")

SMALL = dict(vocab_size=96, hidden_size=32, num_attention_heads=4, kv_lora_rank=16,
             qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, intermediate_size=40,
             moe_intermediate_size=8, n_routed_experts=8, rms_norm_eps=1e-6,
             max_position_embeddings=256)

CASES = {
    # sigmoid + correction bias, noaux_tc group routing, interleaved rope, q_lora, dense layer 0
    "v3_noaux_tc": dict(
        family="v3", dtype="f32", seed=1, layers=3, offset=0,
        cfg=dict(q_lora_rank=24, n_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2,
                 first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.5,
                 rope_interleave=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    # NeoX rope + YaRN (new spelling), no q_lora, all MoE, un-normalised weights, 2 shared experts
    "v3_neox_yarn_nolora": dict(
        family="v3", dtype="f32", seed=2, layers=2, offset=37,
        cfg=dict(q_lora_rank=None, n_shared_experts=2, num_experts_per_tok=3, n_group=2, topk_group=1,
                 first_k_dense_replace=0, norm_topk_prob=False, routed_scaling_factor=1.7,
                 rope_interleave=False, max_position_embeddings=128,
                 rope_parameters={"rope_type": "yarn", "rope_theta": 5000.0, "factor": 4.0,
                                  "original_max_position_embeddings": 32, "beta_fast": 8.0,
                                  "beta_slow": 0.5, "mscale": 0.8, "mscale_all_dim": 0.6})),
    # bf16 weights, tied embeddings, Kimi-K2 style single group
    "v3_bf16_tied": dict(
        family="v3", dtype="bf16", seed=3, layers=3, offset=5,
        cfg=dict(q_lora_rank=24, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
                 first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.827,
                 tie_word_embeddings=True, rope_interleave=True,
                 rope_parameters={"rope_type": "default", "rope_theta": 50000.0})),
    # DeepSeek-V2-Lite style: softmax greedy, no q_lora, fp16 weights
    "v2_greedy_f16": dict(
        family="v2", dtype="f16", seed=4, layers=3, offset=0,
        cfg=dict(q_lora_rank=None, n_shared_experts=2, num_experts_per_tok=2, topk_method="greedy",
                 first_k_dense_replace=1, norm_topk_prob=False, routed_scaling_factor=1.0,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    # DeepSeek-V2 style: softmax group_limited_greedy, q_lora, YaRN with mscale == mscale_all_dim
    "v2_group_yarn": dict(
        family="v2", dtype="f32", seed=5, layers=2, offset=11,
        cfg=dict(q_lora_rank=24, n_shared_experts=1, num_experts_per_tok=3, topk_method="group_limited_greedy",
                 n_group=4, topk_group=2, first_k_dense_replace=0, norm_topk_prob=False,
                 routed_scaling_factor=4.0, max_position_embeddings=128,
                 rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0,
                                  "original_max_position_embeddings": 16, "beta_fast": 32.0,
                                  "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707})),
    # DeepSeek-V3 as released: rope_theta + rope_scaling {type: yarn}, scoring_func / topk_method
    # keys, an MTP layer past num_hidden_layers, two shards with an index
    "v3_released": dict(
        family="v3", dtype="bf16", seed=6, layers=2, offset=3, released=True, shards=2, mtp=True,
        cfg=dict(q_lora_rank=24, n_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2,
                 first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.5,
                 rope_interleave=True, max_position_embeddings=128,
                 rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                  "original_max_position_embeddings": 32, "beta_fast": 32.0,
                                  "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0})),
    # Kimi-K2 as released: model_type kimi_k2, fp8 e4m3 weights with block scales (16 x 16 here,
    # so tiny weights still span several blocks with ragged edges), YaRN beta 1 / 1
    "kimi_fp8": dict(
        family="v3", dtype="bf16", seed=7, layers=2, offset=0, released=True, fp8_block=(16, 16),
        model_type="kimi_k2",
        cfg=dict(q_lora_rank=24, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
                 first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.827,
                 rope_interleave=True, max_position_embeddings=128,
                 rope_parameters={"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0,
                                  "original_max_position_embeddings": 32, "beta_fast": 1.0,
                                  "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0})),
    # Kimi K2 Thinking / K2.5 / K2.6 as released: compressed-tensors pack-quantized INT4 routed
    # experts (symmetric, group 32, packed and quantized by the compressed-tensors library), the
    # released ignore list (attention, shared experts, the dense MLP and lm_head stay bf16)
    "kimi_int4": dict(
        family="v3", dtype="bf16", seed=8, layers=2, offset=2, released=True, int4_group=32,
        model_type="kimi_k2",
        cfg=dict(q_lora_rank=24, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
                 first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.827,
                 moe_intermediate_size=32, rope_interleave=True, max_position_embeddings=128,
                 rope_parameters={"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0,
                                  "original_max_position_embeddings": 32, "beta_fast": 1.0,
                                  "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0})),
}
# The ignore list of Kimi K2 Thinking's quantization_config (the modules left in bf16).
KIMI_INT4_IGNORE = ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]

T_SEQ = 14                      # tokens in the causal golden
PREFIX = 5                      # cached tokens before the tree
TREE_PARENTS = [-1, 0, 0, 1, 1, 2, 3, 3, 6, 5]   # node 0 first, parents[i] < i


def build_model(case):
    kw = dict(SMALL)
    kw.update(case["cfg"])
    kw["num_hidden_layers"] = case["layers"]
    if case["family"] == "v3":
        kw["num_key_value_heads"] = kw["num_attention_heads"]
        cfg, cls = DeepseekV3Config(**kw), DeepseekV3ForCausalLM
    else:
        cfg, cls = DeepseekV2Config(**kw), DeepseekV2ForCausalLM
    torch.manual_seed(case["seed"])
    model = cls(cfg).float().eval()
    widen_init(model, case["seed"])
    return model


@torch.no_grad()
def widen_init(model, seed):
    """Replace HF's near-zero init with one under which routing, norms and rope all matter."""
    g = torch.Generator().manual_seed(1000 + seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight") or "layernorm" in name:
            p.copy_(torch.empty_like(p).uniform_(0.5, 1.5, generator=g))
        elif name.endswith("embed_tokens.weight"):
            p.copy_(torch.randn(p.shape, generator=g))
        elif name.endswith("gate.weight"):
            p.copy_(torch.randn(p.shape, generator=g) * (3.0 / math.sqrt(p.shape[-1])))
        else:  # projections, fused expert tensors [E, out, in] included: unit gain
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.copy_(torch.randn(b.shape, generator=g) * 0.2)


def disk_state(model):
    """The state dict under HF's on-disk names (per-expert tensors), via save_pretrained."""
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        state = {}
        for f in sorted(os.listdir(tmp)):
            if f.endswith(".safetensors"):
                state.update(load_file(os.path.join(tmp, f)))
        with open(os.path.join(tmp, "config.json")) as f:
            config = json.load(f)
    return {k: v.float().contiguous() for k, v in state.items()}, config


def quantize_fp8(w, block):
    """Block-scaled e4m3: scale_inv = amax / 448 per block; returns (fp8, scale_inv, dequantized)."""
    bo, bi = block
    o, i = w.shape
    so, si = -(-o // bo), -(-i // bi)
    scale = torch.zeros(so, si)
    for a in range(so):
        for b in range(si):
            blk = w[a * bo:(a + 1) * bo, b * bi:(b + 1) * bi]
            scale[a, b] = blk.abs().max().clamp(min=1e-12) / 448.0
    full = scale.repeat_interleave(bo, 0).repeat_interleave(bi, 1)[:o, :i]
    q = (w / full).to(torch.float8_e4m3fn)
    return q, scale, q.float() * full


def quantize_int4(w, group):
    """Symmetric INT4 in groups of ``group`` inputs, by the compressed-tensors library: bf16 scales
    amax / 7.5 (as its minmax observer with a symmetric 4-bit range), ``quantize`` to int8 values in
    [-8, 7], ``pack_to_int32``; returns (packed int32, scale bf16, dequantized float32)."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import quantize
    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=group)
    o, i = w.shape
    amax = w.reshape(o, i // group, group).abs().amax(-1).clamp(min=1e-8)
    scale = (amax / 7.5).to(torch.bfloat16).float()                       # [o, i / group]
    q = quantize(w, scale, torch.zeros_like(scale, dtype=torch.int8), args, dtype=torch.int8)
    deq = q.float() * scale.repeat_interleave(group, 1)
    return pack_to_int32(q, 4), scale.to(torch.bfloat16), deq


FP8_PARTS = ("q_a_proj", "q_b_proj", "q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj",
             "gate_proj", "up_proj", "down_proj")


def store_dtype(state, case):
    """Round the weights to the case's storage dtype; returns (tensors to save, float32 weights
    the HF model must run with so that its logits are those of the stored checkpoint)."""
    save, run = {}, {}
    for name, w in state.items():
        keep_f32 = name.endswith("gate.weight") or name.endswith("e_score_correction_bias")
        if case.get("int4_group") and ".mlp.experts." in name and name.endswith("_proj.weight"):
            packed, scale, deq = quantize_int4(w, case["int4_group"])
            module = name.removesuffix(".weight")
            save[module + ".weight_packed"], save[module + ".weight_scale"] = packed, scale
            save[module + ".weight_shape"] = torch.tensor(list(w.shape))
            run[name] = deq
            continue
        if case.get("fp8_block") and name.endswith(".weight") and name.split(".")[-2] in FP8_PARTS:
            q, s, deq = quantize_fp8(w, case["fp8_block"])
            save[name], save[name + "_scale_inv"], run[name] = q, s, deq
            continue
        if keep_f32 or case["dtype"] == "f32":
            save[name], run[name] = w, w
        else:
            dt = torch.bfloat16 if case["dtype"] == "bf16" else torch.float16
            save[name] = w.to(dt)
            run[name] = save[name].float()
    return save, run


@torch.no_grad()
def load_run_weights(model, run):
    """Put the (rounded) per-expert weights back into HF's fused parameters."""
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    for name, p in list(params.items()) + list(buffers.items()):
        if name in run:
            p.copy_(run[name])
        elif name.endswith("experts.gate_up_proj"):
            pre, e = name[: -len("gate_up_proj")], p.shape[0]
            p.copy_(torch.stack([torch.cat([run[f"{pre}{j}.gate_proj.weight"], run[f"{pre}{j}.up_proj.weight"]])
                                 for j in range(e)]))
        elif name.endswith("experts.down_proj"):
            pre, e = name[: -len("down_proj")], p.shape[0]
            p.copy_(torch.stack([run[f"{pre}{j}.down_proj.weight"] for j in range(e)]))
        elif name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        elif name.endswith("rotary_emb.inv_freq") or name.endswith("original_inv_freq"):
            continue
        else:
            raise KeyError(f"no stored weight for {name}")


@torch.no_grad()
def run_hf(model, ids, positions):
    """Logits [T, V] and HF's ``hidden_states[1:]`` [T, L, M] of one causal HF forward: entry i is
    decoder layer i's output, the last one after the final norm (what a DFlash drafter reads)."""
    out = model(input_ids=torch.tensor(ids)[None], position_ids=torch.tensor(positions)[None],
                use_cache=False, output_hidden_states=True)
    hidden = torch.stack(out.hidden_states[1:], dim=2)[0]                  # [T, L, M]
    return out.logits[0].float().numpy(), hidden.float().numpy()


def released_config(config, case):
    """Rewrite an HF >= 5 config.json in the spelling of released checkpoints."""
    c = dict(config)
    rp = c.pop("rope_parameters")
    c["rope_theta"] = rp.pop("rope_theta")
    rtype = rp.pop("rope_type")
    c["rope_scaling"] = None if rtype == "default" else {"type": rtype, **rp}
    if c.get("rope_interleave") is True:
        c.pop("rope_interleave")     # released DeepSeek-V3 configs leave it out (default true)
    for k in ("head_dim", "qk_head_dim", "transformers_version", "dtype", "output_router_logits"):
        c.pop(k, None)
    c.update(model_type=case.get("model_type", "deepseek_v3"), scoring_func="sigmoid",
             topk_method="noaux_tc", moe_layer_freq=1, num_nextn_predict_layers=1, ep_size=1,
             aux_loss_alpha=0.001, seq_aux=True, torch_dtype="bfloat16",
             auto_map={"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                       "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"})
    if case.get("fp8_block"):
        c["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                    "quant_method": "fp8", "weight_block_size": list(case["fp8_block"])}
    if case.get("int4_group"):
        weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                   "group_size": case["int4_group"], "dynamic": False, "actorder": None, "observer": "minmax",
                   "block_structure": None, "observer_kwargs": {}}
        c["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                          "output_activations": None, "format": "pack-quantized"}},
            "ignore": KIMI_INT4_IGNORE, "kv_cache_scheme": None, "global_compression_ratio": None}
    return c


def add_mtp_layer(save, layers, rng):
    """Tensors of a multi-token-prediction layer at index num_hidden_layers (to be ignored)."""
    for name in [k for k in save if k.startswith("model.layers.0.")]:
        save[name.replace("model.layers.0.", f"model.layers.{layers}.")] = save[name].clone()
    m = save["model.norm.weight"].shape[0]
    for extra, shape in (("enorm.weight", (m,)), ("hnorm.weight", (m,)), ("eh_proj.weight", (m, 2 * m)),
                         ("shared_head.norm.weight", (m,))):
        save[f"model.layers.{layers}.{extra}"] = torch.tensor(rng.standard_normal(shape), dtype=torch.float32)


def write_tensors(directory, save, shards):
    names = sorted(save)
    if shards == 1:
        save_file(save, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: save[n] for n in names[s::shards]}
        save_file(part, os.path.join(directory, fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    total = sum(t.numel() * t.element_size() for t in save.values())
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def path_to(parents, i):
    path = []
    while i >= 0:
        path.append(i)
        i = parents[i]
    return path[::-1]


def make_case(name, case):
    model = build_model(case)
    state, config = disk_state(model)
    save, run = store_dtype(state, case)
    load_run_weights(model, run)
    rng = np.random.default_rng(case["seed"])
    v, layers = model.config.vocab_size, case["layers"]

    ids = rng.integers(0, v, T_SEQ).astype(np.int64)
    positions = np.arange(T_SEQ, dtype=np.int64) + case["offset"]
    logits, hidden = run_hf(model, ids, positions)

    parents = np.array(TREE_PARENTS, dtype=np.int32)
    depths = np.zeros(len(parents), dtype=np.int64)
    for i in range(1, len(parents)):
        depths[i] = depths[parents[i]] + 1
    prefix_ids = rng.integers(0, v, PREFIX).astype(np.int64)
    prefix_pos = np.arange(PREFIX, dtype=np.int64) + case["offset"]
    tree_ids = rng.integers(0, v, len(parents)).astype(np.int64)
    tree_pos = PREFIX + case["offset"] + depths
    t_logits, t_hidden = [], []
    for i in range(len(parents)):
        path = path_to(parents, i)
        lg, hd = run_hf(model, np.concatenate([prefix_ids, tree_ids[path]]),
                        np.concatenate([prefix_pos, tree_pos[path]]))
        t_logits.append(lg[-1])
        t_hidden.append(hd[-1])

    directory = os.path.join(OUT, name)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    if case.get("released"):
        config = released_config(config, case)
    if case.get("mtp"):
        add_mtp_layer(save, layers, rng)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    write_tensors(directory, save, case.get("shards", 1))
    np.savez_compressed(os.path.join(directory, "expected.npz"), ids=ids, positions=positions,
                        logits=logits.astype(np.float32), hidden=hidden.astype(np.float32))
    np.savez_compressed(os.path.join(directory, "tree.npz"), prefix_ids=prefix_ids,
                        prefix_positions=prefix_pos, tree_ids=tree_ids, parents=parents,
                        tree_positions=tree_pos, logits=np.stack(t_logits).astype(np.float32),
                        hidden=np.stack(t_hidden).astype(np.float32))
    check_reload(directory, case, model, ids, positions, logits)
    size = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))
    print(f"{name:22s} {size / 1024:7.1f} KiB  argmax {np.argmax(logits, -1)[:6]}...")


def check_reload(directory, case, model, ids, positions, logits):
    """HF itself reads the written checkpoint back to the same logits (names and config are
    ones transformers understands). Skipped for fp8 (a custom block size) and kimi_k2."""
    if case.get("fp8_block") or case.get("int4_group"):
        return
    cls = type(model)
    again = cls.from_pretrained(directory, torch_dtype=torch.float32).eval()
    lg, _ = run_hf(again, ids, positions)
    err = np.abs(lg - logits).max() / np.abs(logits).max()
    assert err < 1e-6, f"{directory}: HF reload differs by {err}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", default=list(CASES))
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    for name in args.cases:
        make_case(name, CASES[name])
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(OUT) for f in fs)
    print(f"tests/data: {total / 1024:.1f} KiB")


if __name__ == "__main__":
    main()
