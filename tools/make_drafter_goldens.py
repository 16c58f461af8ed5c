"""Build a tiny random DFlash drafter under tests/data/drafters/dflash_v3_noaux_tc/ for the golden target
tests/data/v3_noaux_tc, and what an independent DFlash implementation built from HF
transformers' Qwen3 modules computes for it (the golden the numpy drafter is held to).

Needs the ``goldens`` extra (torch, transformers >= 5); the test suite never imports torch.
Run from the repo root:

    python tools/make_drafter_goldens.py

The directory holds:
  config.json        Qwen3-style, with block_size and dflash_config {target_layer_ids, mask_token_id}
  model.safetensors  layers.{i}.self_attn.{q,k,v,o}_proj / q_norm / k_norm, input_layernorm,
                     post_attention_layernorm, mlp.{gate,up,down}_proj, fc, hidden_norm, norm (bf16)
  expected.npz       features [P, Y, M] (the HF target's hidden_states[i + 1] at target_layer_ids
                     i, from tests/data/v3_noaux_tc/expected.npz; layer 2 is the target's last,
                     so its feature is final-normed, as the reference DFlash code reads it),
                     split (context rows fed by the first call), block0 / block1 [B] ids, hidden0 / hidden1 [B, M] (final-normed drafter
                     output of each call), logits0 / logits1 [B-1, V] (through the target's lm_head)

The two calls share one DynamicCache cropped back to the context after the first, as DFlash's
spec_generate does, so the golden also covers the drafter's context cache.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import DynamicCache, Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding, repeat_kv, rotate_half

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.path.join(ROOT, "tests", "data", "v3_noaux_tc")
OUT = os.path.join(ROOT, "tests", "data", "drafters", "dflash_v3_noaux_tc")  # outside the target cases


class Attention(nn.Module):
    """Queries from the block; keys and values from [context; block]; no mask; GQA."""

    def __init__(self, cfg: Qwen3Config, layer: int):
        super().__init__()
        h, kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.layer, self.heads, self.kv_heads, self.head_dim = layer, h, kv, d
        self.q_proj = nn.Linear(cfg.hidden_size, h * d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, kv * d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, kv * d, bias=False)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)
        self.q_norm = Qwen3RMSNorm(d, eps=cfg.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(d, eps=cfg.rms_norm_eps)

    def forward(self, x, ctx, cos, sin, cache):
        b, t, _ = x.shape
        n = ctx.shape[1]
        q = self.q_norm(self.q_proj(x).view(b, t, self.heads, self.head_dim)).transpose(1, 2)
        both = torch.cat([ctx, x], dim=1)
        k = self.k_norm(self.k_proj(both).view(b, n + t, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(both).view(b, n + t, self.kv_heads, self.head_dim).transpose(1, 2)
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)                       # positions of [ctx; block]
        q = q * c[:, :, -t:] + rotate_half(q) * s[:, :, -t:]
        k = k * c + rotate_half(k) * s
        k, v = cache.update(k, v, self.layer)
        g = self.heads // self.kv_heads
        out = torch.nn.functional.scaled_dot_product_attention(
            q, repeat_kv(k, g), repeat_kv(v, g), is_causal=False, scale=self.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class Layer(nn.Module):
    def __init__(self, cfg, layer):
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        self.mlp = Qwen3MLP(cfg)
        self.input_layernorm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def forward(self, x, ctx, cos, sin, cache):
        x = x + self.self_attn(self.input_layernorm(x), ctx, cos, sin, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlash(nn.Module):
    def __init__(self, cfg, n_target_layers):
        super().__init__()
        self.layers = nn.ModuleList(Layer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.fc = nn.Linear(n_target_layers * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.norm = Qwen3RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(cfg)

    def forward(self, features, block_embeds, cache):
        past, n, t = cache.get_seq_length(), features.shape[1], block_embeds.shape[1]
        ctx = self.hidden_norm(self.fc(features))
        pos = torch.arange(past, past + n + t).unsqueeze(0)
        cos, sin = self.rotary_emb(block_embeds, pos)
        x = block_embeds
        for layer in self.layers:
            x = layer(x, ctx, cos, sin, cache)
        return self.norm(x)


def main():
    argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()          # (--help only)
    torch.manual_seed(0)
    rng = np.random.default_rng(7)
    target_cfg = json.load(open(os.path.join(TARGET, "config.json")))
    m, vocab = target_cfg["hidden_size"], target_cfg["vocab_size"]
    layer_ids, block, mask = [0, 2], 6, vocab - 1
    cfg = Qwen3Config(hidden_size=m, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6, vocab_size=vocab,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                      attention_bias=False, hidden_act="silu", max_position_embeddings=256)
    model = DFlash(cfg, len(layer_ids)).float().eval()
    with torch.no_grad():                         # a wide init: unit-gain projections, random norms
        for name, p in model.named_parameters():
            shape = tuple(p.shape)
            w = rng.uniform(0.5, 1.5, shape) if len(shape) == 1 else rng.standard_normal(shape) / np.sqrt(shape[1])
            p.copy_(torch.tensor(w, dtype=torch.float32).to(torch.bfloat16).float())  # bf16-exact

    os.makedirs(OUT, exist_ok=True)
    tensors = {n: p.detach().to(torch.bfloat16).contiguous() for n, p in model.named_parameters()}
    save_file(tensors, os.path.join(OUT, "model.safetensors"), metadata={"format": "pt"})
    config = cfg.to_dict()
    config.update(architectures=["DFlashDraftModel"], block_size=block, num_target_layers=3,
                  dflash_config={"target_layer_ids": layer_ids, "mask_token_id": mask})
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    golden = np.load(os.path.join(TARGET, "expected.npz"))
    target_w = load_file(os.path.join(TARGET, "model.safetensors"))
    embed = target_w["model.embed_tokens.weight"].float()
    head = target_w["lm_head.weight"].float()
    features = golden["hidden"][:, layer_ids].astype(np.float32)           # [P, Y, M]
    split = features.shape[0] // 2
    feats = torch.tensor(features).reshape(1, features.shape[0], -1)       # [1, P, Y M]
    cache = DynamicCache()
    out = {"features": features, "split": np.int64(split)}
    with torch.no_grad():
        for call, (lo, hi) in enumerate([(0, split), (split, features.shape[0])]):
            ids = np.full(block, mask, np.int64)
            ids[0] = rng.integers(0, vocab - 1)
            h = model(feats[:, lo:hi], embed[torch.tensor(ids)].unsqueeze(0), cache)[0]   # [B, M]
            cache.crop(-block)                                              # drop the block: keep the context
            assert cache.get_seq_length() == hi
            out[f"block{call}"] = ids
            out[f"hidden{call}"] = h.numpy()
            out[f"logits{call}"] = (h[1:] @ head.T).numpy()
    np.savez(os.path.join(OUT, "expected.npz"), **out)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
