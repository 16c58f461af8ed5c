"""The target model on the numpy backend: the reference forward over an MLA latent cache.

Shapes: T new tokens, S cache rows after the forward, M hidden size, H heads, C
``kv_lora_rank``, R ``qk_rope_head_dim``, D ``qk_nope_head_dim``, Dv ``v_head_dim``, E experts,
K experts per token, V vocab, Y requested hidden layers.

The forward is DeepSeek-V3's decoder (HF ``DeepseekV3ForCausalLM`` / ``DeepseekV2ForCausalLM``),
stage by stage through ``ddtree_numba.reference``, attention in the weight-absorbed MLA form.
``model.loader.load_target`` makes one from a checkpoint; ``model.protocols.Target`` is the API
both backends implement; docs/MODEL.md walks through the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._checks import check_array, check_int, check_parents_values
from ..dtypes import stack_weights, widened
from ..reference.embedding import embedding, lm_head
from ..reference.linear import linear
from ..reference.mla import mla_attention_absorbed, mla_kv_latent, mla_mask
from ..reference.moe import moe_experts, moe_route, swiglu_mlp
from ..reference.rms_norm import rms_norm
from ..reference.rope import rope, rope_cos_sin, rope_inv_freq, softmax_scale, yarn_attention_factor, yarn_inv_freq
from .cache import MLACache
from .checkpoint import expected_shapes
from .config import ModelConfig


@dataclass(frozen=True)
class ForwardOutput:
    """logits [T, V] float32; hidden [T, Y, M] float32, the hidden states of the requested layers,
    in the order requested. Layer id i gives HF transformers' ``hidden_states[i + 1]``, as the
    reference DFlash code reads a drafter's context features: the residual stream after decoder
    layer i, and for the last layer the final-normed state (HF's last entry)."""

    logits: np.ndarray
    hidden: np.ndarray


@dataclass(frozen=True)
class Segment:
    """One sequence's part of a batched forward (``NumpyTarget.forward_batch``): ``forward``'s
    arguments. ids [T] int32/int64, positions [T], cache its own ``MLACache``, parents [T] int32
    or None (causal)."""

    ids: np.ndarray
    positions: np.ndarray
    cache: MLACache
    parents: np.ndarray | None = None


@dataclass(frozen=True)
class BatchForward:
    """outputs: a ``ForwardOutput`` per segment, in order; unique_experts [layers] int32: the
    distinct routed experts the router picked over every row of the batch (0 for dense layers)."""

    outputs: list
    unique_experts: np.ndarray


@dataclass(frozen=True)
class RopeTables:
    """inv_freq [R/2] float64, attention_factor (cos/sin scale), scale (softmax scale)."""

    inv_freq: np.ndarray
    attention_factor: float
    scale: float


def rope_tables(cfg: ModelConfig) -> RopeTables:
    """The rope frequencies and the two YaRN magnitude corrections a config implies."""
    rs, dim = cfg.rope_scaling, cfg.qk_rope_head_dim
    if rs is None:
        return RopeTables(rope_inv_freq(dim, cfg.rope_theta), 1.0, softmax_scale(cfg.qk_head_dim))
    inv = yarn_inv_freq(dim, cfg.rope_theta, rs.factor, rs.original_max_position_embeddings,
                        rs.beta_fast, rs.beta_slow, rs.truncate)
    return RopeTables(inv, yarn_attention_factor(rs.factor, rs.mscale, rs.mscale_all_dim, rs.attention_factor),
                      softmax_scale(cfg.qk_head_dim, rs.factor, rs.mscale_all_dim))


@dataclass
class LayerWeights:
    """One decoder layer's weights, HF layout ([out, in]); unused ones are None. float32 on the
    numpy backend; a matrix stored as fp8 may be a ``dtypes.BlockScaled`` on its way to the GPU
    (``CudaTarget.from_weights``)."""

    input_layernorm: np.ndarray          # [M]
    post_attention_layernorm: np.ndarray  # [M]
    q_proj: np.ndarray | None            # [H * (D + R), M] when q_lora_rank is null
    q_a_proj: np.ndarray | None          # [Q, M]
    q_a_layernorm: np.ndarray | None     # [Q]
    q_b_proj: np.ndarray | None          # [H * (D + R), Q]
    kv_a_proj_with_mqa: np.ndarray       # [C + R, M]
    kv_a_layernorm: np.ndarray           # [C]
    kv_b_proj: np.ndarray                # [H * (D + Dv), C]
    o_proj: np.ndarray                   # [M, H * Dv]
    mlp_gate_proj: np.ndarray | None = None      # [I, M] dense layers
    mlp_up_proj: np.ndarray | None = None        # [I, M]
    mlp_down_proj: np.ndarray | None = None      # [M, I]
    gate: np.ndarray | None = None               # [E, M] MoE layers
    e_score_correction_bias: np.ndarray | None = None  # [E] noaux_tc
    experts_gate_proj: np.ndarray | None = None  # [E, Ie, M]
    experts_up_proj: np.ndarray | None = None    # [E, Ie, M]
    experts_down_proj: np.ndarray | None = None  # [E, M, Ie]
    shared_gate_proj: np.ndarray | None = None   # [Ie * n_shared, M]
    shared_up_proj: np.ndarray | None = None
    shared_down_proj: np.ndarray | None = None   # [M, Ie * n_shared]


def _layer_weights(cfg: ModelConfig, w: dict, i: int) -> LayerWeights:
    p, a, f = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
    lw = LayerWeights(
        input_layernorm=w[p + "input_layernorm.weight"],
        post_attention_layernorm=w[p + "post_attention_layernorm.weight"],
        q_proj=w.get(a + "q_proj.weight") if cfg.q_lora_rank is None else None,
        q_a_proj=w.get(a + "q_a_proj.weight") if cfg.q_lora_rank is not None else None,
        q_a_layernorm=w.get(a + "q_a_layernorm.weight") if cfg.q_lora_rank is not None else None,
        q_b_proj=w.get(a + "q_b_proj.weight") if cfg.q_lora_rank is not None else None,
        kv_a_proj_with_mqa=w[a + "kv_a_proj_with_mqa.weight"],
        kv_a_layernorm=w[a + "kv_a_layernorm.weight"],
        kv_b_proj=w[a + "kv_b_proj.weight"],
        o_proj=w[a + "o_proj.weight"],
    )
    if not cfg.is_moe_layer(i):
        lw.mlp_gate_proj, lw.mlp_up_proj, lw.mlp_down_proj = (
            w[f + "gate_proj.weight"], w[f + "up_proj.weight"], w[f + "down_proj.weight"])
        return lw
    e = range(cfg.n_routed_experts)
    lw.gate = w[f + "gate.weight"]
    lw.e_score_correction_bias = w.get(f + "gate.e_score_correction_bias")
    lw.experts_gate_proj = stack_weights([w.pop(f + f"experts.{j}.gate_proj.weight") for j in e])  # [E, Ie, M]
    lw.experts_up_proj = stack_weights([w.pop(f + f"experts.{j}.up_proj.weight") for j in e])      # [E, Ie, M]
    lw.experts_down_proj = stack_weights([w.pop(f + f"experts.{j}.down_proj.weight") for j in e])  # [E, M, Ie]
    if cfg.n_shared_experts:
        lw.shared_gate_proj = w[f + "shared_experts.gate_proj.weight"]
        lw.shared_up_proj = w[f + "shared_experts.up_proj.weight"]
        lw.shared_down_proj = w[f + "shared_experts.down_proj.weight"]
    return lw


def check_finite_output(model: str, what: str, values: np.ndarray, first_bad_layer: int | None,
                        layers_checked: bool = True) -> None:
    """A ``ValueError`` when a forward's output (``what``: 'logits', 'hidden state') holds NaN or
    infinity, naming the model ('target' or 'drafter') and the first of its layers whose output
    was not finite (``layers_checked`` False: the caller could not look)."""
    if np.isfinite(values).all():
        return
    if first_bad_layer is not None:
        where = f"the output of its layer {first_bad_layer} is the first that is not"
    elif layers_checked:
        where = "every layer's output was finite: the final norm or the head overflowed"
    else:
        where = "the numpy backend's forward names the first layer whose output is not"
    verb = "are" if what.endswith("s") else "is"
    raise ValueError(f"{model} forward: the {what} {verb} not finite (NaN or inf); {where}")


def check_forward_inputs(cfg: ModelConfig, ids, positions, cache, parents, hidden_layer_ids) -> list[int]:
    """Validate a forward's arguments (shared by both backends); returns the hidden layer ids.
    ``cache`` is an ``MLACache`` or a ``DeviceMLACache``: both have c_kv / k_pe and reserve()."""
    check_array("ids", ids, 1, (np.int32, np.int64))
    check_array("positions", positions, 1, (np.int32, np.int64))
    t = ids.shape[0]
    if t == 0:
        raise ValueError("ids is empty: forward needs at least one token")
    if positions.shape[0] != t:
        raise ValueError(f"positions has {positions.shape[0]} entries but ids has {t}")
    if ids.min() < 0 or ids.max() >= cfg.vocab_size:
        bad = int(ids[(ids < 0) | (ids >= cfg.vocab_size)][0])
        raise ValueError(f"token id {bad} is out of range [0, {cfg.vocab_size})")
    if positions.min() < 0:
        raise ValueError(f"positions must be >= 0, got {int(positions.min())}")
    if cache.c_kv.shape[0] != cfg.num_hidden_layers or cache.c_kv.shape[2] != cfg.kv_lora_rank \
            or cache.k_pe.shape[2] != cfg.qk_rope_head_dim:
        raise ValueError("cache was made for a different model config")
    if parents is not None:
        check_array("parents", parents, 1, np.int32, shape=(t,))
        check_parents_values(parents)
    ids_out = []
    for i in hidden_layer_ids:
        ids_out.append(check_int("hidden_layer_ids entry", i, 0, cfg.num_hidden_layers - 1))
    cache.reserve(t)
    return ids_out


class NumpyTarget:
    """A loaded target model on the numpy backend. ``forward`` appends to an ``MLACache``."""

    backend = "numpy"

    def __init__(self, cfg: ModelConfig, weights: dict[str, np.ndarray]):
        self.config = cfg
        weights = {name: widened(w) for name, w in weights.items()}    # fp8 kept as stored: dequantized
        self.embed_tokens = weights["model.embed_tokens.weight"]                 # [V, M]
        self.norm = weights["model.norm.weight"]                                 # [M]
        self.lm_head = self.embed_tokens if cfg.tie_word_embeddings else weights["lm_head.weight"]  # [V, M]
        self.layers = [_layer_weights(cfg, weights, i) for i in range(cfg.num_hidden_layers)]
        self.rope = rope_tables(cfg)

    def __repr__(self) -> str:
        return f"NumpyTarget({self.config.describe()})"

    def new_cache(self, max_tokens: int) -> MLACache:
        """An empty latent cache with room for ``max_tokens`` rows per layer."""
        return MLACache(self.config, max_tokens)

    # -- the forward -----------------------------------------------------------------------
    def forward(self, ids: np.ndarray, positions: np.ndarray, cache: MLACache,
                parents: np.ndarray | None = None, hidden_layer_ids=()) -> ForwardOutput:
        """Run ``ids`` at ``positions`` after the cached rows and append their latent rows.

        ids [T] int32/int64, positions [T] int32/int64, parents [T] int32 or None (causal);
        with parents, token i sees every cached row and the new rows ``visibility(parents)``
        allows. -> ForwardOutput(logits [T, V], hidden [T, Y, M]).
        """
        return self.forward_batch([Segment(ids, positions, cache, parents)], hidden_layer_ids).outputs[0]

    def forward_batch(self, segments: list["Segment"], hidden_layer_ids=()) -> "BatchForward":
        """One forward over several sequences' rows: ``forward`` of each ``Segment`` (its ids,
        positions, own cache and parents), with the projections, norms and MoE run over all rows
        at once and the attention per sequence (a row sees its own sequence's cache and its own
        ancestors only: the block-diagonal visibility). -> ``BatchForward``: an output per
        segment, in order, and the distinct routed experts each layer's router picked over all
        rows (what a batched MoE reads once for every sequence)."""
        cfg = self.config
        layers_out = check_segments(cfg, segments, MLACache, hidden_layer_ids)
        starts = [seg.cache.length for seg in segments]
        masks = [mla_mask(s0, seg.ids.shape[0], seg.parents) for s0, seg in zip(starts, segments)]   # [T_j, S_j]
        sizes = [seg.ids.shape[0] for seg in segments]
        rows = np.cumsum([0] + sizes)                                         # segment j: rows[j] .. rows[j+1]
        ids = np.concatenate([seg.ids for seg in segments])
        positions = np.concatenate([seg.positions for seg in segments])
        t, h = ids.shape[0], cfg.num_attention_heads
        d, r, dv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        cos, sin = rope_cos_sin(positions, self.rope.inv_freq, self.rope.attention_factor)  # [T, R/2]

        x = embedding(ids, self.embed_tokens)                                 # [T, M]
        hidden, last, first_bad = {}, cfg.num_hidden_layers - 1, None
        unique = np.zeros(cfg.num_hidden_layers, np.int32)
        for i, lw in enumerate(self.layers):
            # attention
            a = rms_norm(x, lw.input_layernorm, cfg.rms_norm_eps)             # [T, M]
            if cfg.q_lora_rank is None:
                q = linear(a, lw.q_proj)                                      # [T, H * (D + R)]
            else:
                q = linear(rms_norm(linear(a, lw.q_a_proj), lw.q_a_layernorm, cfg.rms_norm_eps), lw.q_b_proj)
            q = q.reshape(t, h, d + r)                                        # [T, H, D + R]
            q_nope, q_pe = q[:, :, :d], rope(q[:, :, d:], cos, sin, cfg.rope_interleave)  # [T, H, D], [T, H, R]
            c_kv, k_pe = mla_kv_latent(a, lw.kv_a_proj_with_mqa, lw.kv_a_layernorm, cfg.rms_norm_eps)  # [T, C], [T, R]
            k_pe = rope(k_pe, cos, sin, cfg.rope_interleave)
            o = np.empty((t, h, dv), np.float32)                              # [T, H, Dv]
            for j, seg in enumerate(segments):                                # each sequence its own cache
                js, s0 = slice(rows[j], rows[j + 1]), starts[j]
                s1 = s0 + sizes[j]
                seg.cache.c_kv[i, s0:s1] = c_kv[js]
                seg.cache.k_pe[i, s0:s1] = k_pe[js]
                o[js] = mla_attention_absorbed(q_nope[js], q_pe[js], seg.cache.c_kv[i, :s1], seg.cache.k_pe[i, :s1],
                                               lw.kv_b_proj, masks[j], self.rope.scale)
            x = x + linear(o.reshape(t, h * dv), lw.o_proj)                   # [T, M]
            # feed-forward
            m = rms_norm(x, lw.post_attention_layernorm, cfg.rms_norm_eps)    # [T, M]
            if lw.gate is None:
                x = x + swiglu_mlp(m, lw.mlp_gate_proj, lw.mlp_up_proj, lw.mlp_down_proj)
            else:
                topk_ids, topk_w = moe_route(
                    m, lw.gate, lw.e_score_correction_bias, cfg.scoring_func, cfg.topk_method,
                    cfg.n_group, cfg.topk_group, cfg.num_experts_per_tok, cfg.norm_topk_prob,
                    cfg.routed_scaling_factor)                                # [T, K], [T, K]
                unique[i] = np.unique(topk_ids).shape[0]
                y = moe_experts(m, topk_ids, topk_w, lw.experts_gate_proj, lw.experts_up_proj,
                                lw.experts_down_proj)                         # [T, M]
                if lw.shared_gate_proj is not None:
                    y = y + swiglu_mlp(m, lw.shared_gate_proj, lw.shared_up_proj, lw.shared_down_proj)
                x = x + y
            if first_bad is None and not np.isfinite(x).all():
                first_bad = i
            if i in layers_out and i != last:
                hidden[i] = x.copy()
        for j, seg in enumerate(segments):
            seg.cache.length = starts[j] + sizes[j]
        final = rms_norm(x, self.norm, cfg.rms_norm_eps)                     # [T, M]
        if last in layers_out:
            hidden[last] = final                                              # HF's last hidden_states entry
        logits = lm_head(final, self.lm_head)                                 # [T, V]
        check_finite_output("target", "logits", logits, first_bad)
        if layers_out:
            hid = np.stack([hidden[i] for i in layers_out], axis=1)          # [T, Y, M]
        else:
            hid = np.zeros((t, 0, cfg.hidden_size), dtype=np.float32)
        outputs = [ForwardOutput(logits=logits[rows[j]:rows[j + 1]], hidden=hid[rows[j]:rows[j + 1]])
                   for j in range(len(segments))]
        return BatchForward(outputs=outputs, unique_experts=unique)


def check_segments(cfg: ModelConfig, segments, cache_type: type, hidden_layer_ids=()) -> list:
    """A ``forward_batch``'s segments: a non-empty list of ``Segment``, each with its own cache of
    ``cache_type`` with room for its rows and ``forward``'s inputs (``check_forward_inputs``);
    the caches' rows reserved. -> the hidden layers to keep; a ``ValueError`` naming the segment
    otherwise."""
    if not isinstance(segments, (list, tuple)) or not segments:
        raise ValueError("forward_batch needs a non-empty list of Segment")
    layers_out = []
    for j, seg in enumerate(segments):
        if not isinstance(seg, Segment):
            raise ValueError(f"segments[{j}] must be a Segment, got {type(seg).__name__}")
        if not isinstance(seg.cache, cache_type):
            name = cache_type.__name__
            raise ValueError(f"segments[{j}].cache must be {'an' if name.startswith('MLA') else 'a'} {name} "
                             f"from new_cache(), got {type(seg.cache).__name__}")
        if any(seg.cache is other.cache for other in segments[:j]):
            raise ValueError(f"segments[{j}] shares its cache with an earlier segment: each sequence "
                             "needs its own")
        layers_out = check_forward_inputs(cfg, seg.ids, seg.positions, seg.cache, seg.parents, hidden_layer_ids)
        seg.cache.reserve(seg.ids.shape[0])
    return layers_out


def random_target(cfg: ModelConfig | None = None, seed: int = 0) -> NumpyTarget:
    """A target with random weights under HF names, no checkpoint needed (``ModelConfig.tiny()``
    by default). The init is wide on purpose, as in tools/make_goldens.py: unit-gain
    projections, router logits of order 3, norm weights in [0.5, 1.5], so that routing, norms
    and rope all matter. For tests and notebooks of the decode loop."""
    cfg = cfg or ModelConfig.tiny()
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in expected_shapes(cfg).items():
        if len(shape) == 1 and name.endswith("e_score_correction_bias"):
            w = 0.2 * rng.standard_normal(shape)
        elif len(shape) == 1:
            w = rng.uniform(0.5, 1.5, shape)
        elif name == "model.embed_tokens.weight":
            w = rng.standard_normal(shape)
        elif name.endswith("mlp.gate.weight"):
            w = rng.standard_normal(shape) * (3.0 / np.sqrt(shape[1]))
        else:
            w = rng.standard_normal(shape) / np.sqrt(shape[1])
        weights[name] = w.astype(np.float32)
    return NumpyTarget(cfg, weights)
