"""The DFlash drafter (block diffusion, z-lab/dflash): its config, weights and numpy forward.

Shapes: n new context rows, S context rows in the drafter cache after them, B block size,
M hidden size (the target's), Y target layers read, Hq / Hkv query / key-value heads, Dh head
dim, I MLP width, V vocab (the target's).

The drafter is a stack of Qwen3 decoder layers with no embedding or head of its own:

    ctx = hidden_norm(fc(concat_y target_hidden[:, y]))            [n, M]   context features
    x   = target.embed_tokens[[bonus, MASK, ..., MASK]]             [B, M]
    per layer:  a = input_layernorm(x)
                q = rope(q_norm(q_proj(a)))                         [B, Hq, Dh]  block positions
                k = rope(k_norm(k_proj([ctx; a])))                  [S + B, Hkv, Dh]
                v = v_proj([ctx; a])                                [S + B, Hkv, Dh]
                x = x + o_proj(attention(q, k, v))                  non-causal, GQA
                x = x + mlp(post_attention_layernorm(x))
    logits = target.lm_head(norm(x)[1:])                            [B - 1, V]

Context K/V depend only on the context features, so each layer's are computed once and kept in
a ``DrafterCache``; the block's K/V are never stored (DFlash crops them after every draft).
Context rows sit at positions ``0 .. S-1``, the block at ``S .. S+B-1``. RoPE is Qwen3's
rotate-half form. docs/DESIGN.md §1, step 1; ``model.loader.load_drafter`` reads
a checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._checks import check_array, check_int
from ..reference.embedding import embedding, lm_head
from ..reference.gqa import gqa_attention
from ..reference.linear import linear
from ..reference.moe import swiglu_mlp
from ..reference.rms_norm import head_norm_rope, rms_norm
from ..reference.rope import rope_cos_sin, rope_inv_freq
from .target import check_finite_output


@dataclass(frozen=True)
class DrafterConfig:
    """The keys of a DFlash drafter's Qwen3-style config.json that the forward reads."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    vocab_size: int | None = None          # the target's, when the config says (checked against it)
    num_target_layers: int | None = None   # likewise

    @classmethod
    def from_dict(cls, d: dict) -> "DrafterConfig":
        """Parse a config dict; refuses what the forward would get wrong rather than guess."""
        def need(key, src=d):
            if key not in src:
                raise ValueError(f"drafter config.json is missing {key!r}")
            return src[key]

        dflash = need("dflash_config")
        if not isinstance(dflash, dict):
            raise ValueError("drafter config.json: dflash_config must be an object")
        if d.get("attention_bias"):
            raise ValueError("drafter config.json: attention_bias = true is not supported")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"drafter config.json: hidden_act {d['hidden_act']!r} is not supported: "
                             "the drafter's MLP is SwiGLU (silu)")
        if d.get("mlp_bias"):
            raise ValueError("drafter config.json: mlp_bias = true is not supported")
        if d.get("use_sliding_window") or any(t != "full_attention" for t in d.get("layer_types") or ()):
            raise ValueError("drafter config.json: sliding-window layers are not supported (DFlash attends to "
                             "the whole context)")
        rope = d.get("rope_parameters") or {}
        scaling = d.get("rope_scaling") or {}
        kind = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
        if kind != "default":
            raise ValueError(f"drafter config.json: rope type {kind!r} is not supported (default only)")
        theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
        heads = int(need("num_attention_heads"))
        cfg = cls(
            hidden_size=int(need("hidden_size")),
            num_hidden_layers=int(need("num_hidden_layers")),
            num_attention_heads=heads,
            num_key_value_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(d.get("head_dim") or need("hidden_size") // heads),
            intermediate_size=int(need("intermediate_size")),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            block_size=int(need("block_size")),
            vocab_size=None if d.get("vocab_size") is None else int(d["vocab_size"]),
            num_target_layers=None if d.get("num_target_layers") is None else int(d["num_target_layers"]),
            target_layer_ids=tuple(int(i) for i in need("target_layer_ids", dflash)),
            mask_token_id=int(need("mask_token_id", dflash)),
        )
        cfg.validate()
        return cfg

    def to_dict(self) -> dict:
        """A config.json in the published DFlash layout."""
        return dict(
            architectures=["DFlashDraftModel"], model_type="qwen3", hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
            intermediate_size=self.intermediate_size, rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta, rope_scaling=None, attention_bias=False,
            hidden_act="silu", block_size=self.block_size,
            vocab_size=self.vocab_size, num_target_layers=self.num_target_layers,
            dflash_config=dict(target_layer_ids=list(self.target_layer_ids),
                               mask_token_id=self.mask_token_id),
        )

    def describe(self) -> str:
        """One line: the sizes a reader looks for first."""
        layers = f"{self.num_hidden_layers} layer{'' if self.num_hidden_layers == 1 else 's'}"
        return (f"DFlash, {layers}, block {self.block_size}, hidden {self.hidden_size}, "
                f"{self.num_attention_heads}/{self.num_key_value_heads} heads, reads target layers "
                f"{list(self.target_layer_ids)}")

    def validate(self) -> None:
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                     "head_dim", "intermediate_size"):
            check_int(name, getattr(self, name), 1)
        check_int("block_size", self.block_size, 2)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rope")
        if not self.target_layer_ids:
            raise ValueError("dflash_config.target_layer_ids is empty")


def drafter_shapes(cfg: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the drafter forward reads, by its checkpoint name, with its shape."""
    m, hq, hkv, dh = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    shapes = {"fc.weight": (m, len(cfg.target_layer_ids) * m), "hidden_norm.weight": (m,),
              "norm.weight": (m,)}
    for i in range(cfg.num_hidden_layers):
        p, a = f"layers.{i}.", f"layers.{i}.self_attn."
        shapes.update({
            p + "input_layernorm.weight": (m,), p + "post_attention_layernorm.weight": (m,),
            a + "q_proj.weight": (hq * dh, m), a + "k_proj.weight": (hkv * dh, m),
            a + "v_proj.weight": (hkv * dh, m), a + "o_proj.weight": (m, hq * dh),
            a + "q_norm.weight": (dh,), a + "k_norm.weight": (dh,),
            p + "mlp.gate_proj.weight": (cfg.intermediate_size, m),
            p + "mlp.up_proj.weight": (cfg.intermediate_size, m),
            p + "mlp.down_proj.weight": (m, cfg.intermediate_size),
        })
    return shapes


class DrafterCache:
    """Per layer, the rotated keys and the values of every context row; rows ``[0, length)`` live."""

    def __init__(self, cfg: DrafterConfig, capacity: int):
        capacity = check_int("max_tokens", capacity, 1)
        shape = (cfg.num_hidden_layers, capacity, cfg.num_key_value_heads, cfg.head_dim)
        self.capacity = capacity
        self.length = 0
        self.k = np.zeros(shape, dtype=np.float32)                     # [L, S, Hkv, Dh] after rope
        self.v = np.zeros(shape, dtype=np.float32)                     # [L, S, Hkv, Dh]

    def __len__(self) -> int:
        return self.length

    def truncate(self, length: int) -> None:
        self.length = check_int("length", length, 0, self.length)


class NumpyDrafter:
    """A DFlash drafter bound to its target (whose embedding and lm_head it uses); numpy backend."""

    backend = "numpy"

    def __init__(self, cfg: DrafterConfig, weights: dict[str, np.ndarray], target):
        tc = target.config
        if cfg.hidden_size != tc.hidden_size:
            raise ValueError(f"drafter hidden_size {cfg.hidden_size} differs from the target's {tc.hidden_size}")
        for i in cfg.target_layer_ids:
            if not 0 <= i < tc.num_hidden_layers:
                raise ValueError(f"target_layer_ids entry {i} is outside the target's "
                                 f"{tc.num_hidden_layers} layers")
        if not 0 <= cfg.mask_token_id < tc.vocab_size:
            raise ValueError(f"mask_token_id {cfg.mask_token_id} is outside the target's vocab [0, {tc.vocab_size})")
        for key, mine, theirs in (("vocab_size", cfg.vocab_size, tc.vocab_size),
                                  ("num_target_layers", cfg.num_target_layers, tc.num_hidden_layers)):
            if mine is not None and mine != theirs:
                raise ValueError(f"drafter config {key}={mine} disagrees with the target's {theirs}: "
                                 "the drafter was made for another target")
        shapes = drafter_shapes(cfg)
        for name, shape in shapes.items():
            if name not in weights:
                raise ValueError(f"drafter checkpoint is missing tensor {name}")
            if tuple(weights[name].shape) != shape:
                raise ValueError(f"drafter tensor {name} has shape {list(weights[name].shape)}; "
                                 f"the config implies {list(shape)}")
        self.config = cfg
        self.target = target
        self.w = {n: np.ascontiguousarray(weights[n], dtype=np.float32) for n in shapes}
        self.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta)    # [Dh/2] float64

    def __repr__(self) -> str:
        return f"NumpyDrafter({self.config.describe()})"

    block_size = property(lambda self: self.config.block_size)
    target_layer_ids = property(lambda self: self.config.target_layer_ids)
    mask_token_id = property(lambda self: self.config.mask_token_id)

    def new_cache(self, max_tokens: int) -> DrafterCache:
        """An empty context cache with room for ``max_tokens`` context rows."""
        return DrafterCache(self.config, max_tokens)

    def forward(self, features: np.ndarray, block_ids: np.ndarray, cache: DrafterCache) -> np.ndarray:
        """Append ``features``' context rows to the cache, then run the block over it.

        features [n, Y, M] float32 (target hidden states at ``target_layer_ids`` of the next n
        committed tokens; n may be 0), block_ids [B'] int (any B' >= 1) -> final-normed hidden
        [B', M] float32. Context rows take positions ``cache.length ..``, the block follows them.
        """
        cfg, w = self.config, self.w
        y, m = len(cfg.target_layer_ids), cfg.hidden_size
        check_array("features", features, 3, np.float32, shape=(None, y, m))
        check_array("block_ids", block_ids, 1, (np.int32, np.int64))
        nb, n = block_ids.shape[0], features.shape[0]
        vocab = self.target.config.vocab_size
        if nb == 0:
            raise ValueError("block_ids is empty")
        if block_ids.min() < 0 or block_ids.max() >= vocab:
            raise ValueError(f"block token id out of range [0, {vocab})")
        s0 = cache.length
        if s0 + n > cache.capacity:
            raise ValueError(f"drafter cache overflow: {s0} rows + {n} new exceeds capacity {cache.capacity}")
        s1 = s0 + n
        hq, hkv, dh, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
        cos_c, sin_c = rope_cos_sin(np.arange(s0, s1), self.inv_freq)       # [n, Dh/2]
        cos_b, sin_b = rope_cos_sin(np.arange(s1, s1 + nb), self.inv_freq)  # [B, Dh/2]

        ctx = rms_norm(linear(features.reshape(n, y * m), w["fc.weight"]), w["hidden_norm.weight"], eps)  # [n, M]
        x = embedding(block_ids, self.target.embed_tokens)                  # [B, M]
        first_bad = None
        for i in range(cfg.num_hidden_layers):
            p, a = f"layers.{i}.", f"layers.{i}.self_attn."

            def keys_values(h, cos, sin):
                k = linear(h, w[a + "k_proj.weight"]).reshape(-1, hkv, dh)  # [., Hkv, Dh]
                k = head_norm_rope(k, w[a + "k_norm.weight"], eps, cos, sin, interleave=False)
                return k, linear(h, w[a + "v_proj.weight"]).reshape(-1, hkv, dh)

            cache.k[i, s0:s1], cache.v[i, s0:s1] = keys_values(ctx, cos_c, sin_c)
            h = rms_norm(x, w[p + "input_layernorm.weight"], eps)          # [B, M]
            q = linear(h, w[a + "q_proj.weight"]).reshape(nb, hq, dh)       # [B, Hq, Dh]
            q = head_norm_rope(q, w[a + "q_norm.weight"], eps, cos_b, sin_b, interleave=False)
            k_b, v_b = keys_values(h, cos_b, sin_b)                         # [B, Hkv, Dh] each
            k = np.concatenate([cache.k[i, :s1], k_b])                      # [S + B, Hkv, Dh]
            v = np.concatenate([cache.v[i, :s1], v_b])                      # [S + B, Hkv, Dh]
            o = gqa_attention(q, k, v, dh ** -0.5)                          # [B, Hq, Dh]
            x = x + linear(o.reshape(nb, hq * dh), w[a + "o_proj.weight"])  # [B, M]
            h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
            x = x + swiglu_mlp(h, w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"],
                               w[p + "mlp.down_proj.weight"])               # [B, M]
            if first_bad is None and not np.isfinite(x).all():
                first_bad = i
        cache.length = s1
        out = rms_norm(x, w["norm.weight"], eps)                           # [B, M]
        check_finite_output("drafter", "hidden state", out, first_bad)
        return out

    def draft(self, features: np.ndarray, bonus: int, cache: DrafterCache) -> np.ndarray:
        """One DFlash draft: append the context rows, run ``[bonus, MASK x (B-1)]`` after them.

        features [n, Y, M] float32, bonus in [0, V) -> logits [B-1, V] float32 for the B-1
        positions after the bonus (docs/DESIGN.md §1, step 1).
        """
        block = np.full(self.config.block_size, self.config.mask_token_id, dtype=np.int64)  # [B]
        block[0] = check_int("bonus", bonus, 0, self.target.config.vocab_size - 1)
        h = self.forward(features, block, cache)                            # [B, M]
        logits = lm_head(h[1:], self.target.lm_head)                        # [B-1, V]
        check_finite_output("drafter", "logits", logits, None)
        return logits
