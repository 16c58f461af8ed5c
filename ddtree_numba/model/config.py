"""The target model's configuration: the HF ``config.json`` keys of DeepSeek-V3 / V2 / Kimi-K2.

Field names are the keys as they appear in ``config.json``. ``ModelConfig.from_dict`` reads both
rope spellings (released checkpoints: ``rope_theta`` + ``rope_scaling``; transformers >= 5:
``rope_parameters``), fills absent keys with the default of the model's own HF implementation
(``model_type`` picks the family), ignores keys the engine does not use, and raises ``ValueError``
for a value the engine cannot run. See docs/MODEL.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass

TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")
SCORING_FUNCS = ("softmax", "sigmoid")
ROPE_TYPES = ("default", "yarn")


@dataclass(frozen=True)
class RopeScaling:
    """YaRN settings (``rope_scaling`` / ``rope_parameters`` with ``type: yarn``).

    ``attention_factor`` None means derive it from ``factor``, ``mscale`` and ``mscale_all_dim``
    as transformers does; ``truncate`` rounds the correction range outwards (HF default).
    """

    rope_type: str
    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True


@dataclass(frozen=True)
class ModelConfig:
    """One frozen record per checkpoint; every field is the ``config.json`` key of that name."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    n_group: int
    topk_group: int
    topk_method: str
    scoring_func: str
    norm_topk_prob: bool
    routed_scaling_factor: float
    first_k_dense_replace: int
    moe_layer_freq: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    rope_interleave: bool
    max_position_embeddings: int
    rope_theta: float
    rope_scaling: RopeScaling | None
    weight_block_size: tuple[int, int] | None = None   # from quantization_config (fp8 checkpoints)
    num_nextn_predict_layers: int = 0                  # DeepSeek's MTP layers after the last (not run)
    int4_group_size: int | None = None                 # compressed-tensors pack-quantized INT4 (Kimi K2.x)
    quant_ignore: tuple[str, ...] = ()                 # its ignore list: module names and "re:" regexes

    def is_int4(self, module: str) -> bool:
        """Whether Linear module ``module`` (e.g. 'model.layers.1.mlp.experts.0.down_proj') is
        stored as INT4: an INT4 checkpoint's Linears are, except those its ignore list names
        (exactly, or by a "re:" regex matched at the start of the name, as compressed-tensors
        matches them)."""
        if self.int4_group_size is None:
            return False
        for entry in self.quant_ignore:
            if entry.startswith("re:"):
                if re.match(entry[3:], module):
                    return False
            elif entry == module:
                return False
        return True

    # -- derived sizes ---------------------------------------------------------------------
    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def describe(self) -> str:
        """One line: the family and the sizes a reader looks for first."""
        moe = sum(self.is_moe_layer(i) for i in range(self.num_hidden_layers))
        experts = (f", {moe} MoE layers of {self.n_routed_experts} experts ({self.num_experts_per_tok} per token)"
                   if moe else "")
        layers = f"{self.num_hidden_layers} layer{'' if self.num_hidden_layers == 1 else 's'}"
        return (f"{self.model_type}, {layers}{experts}, hidden {self.hidden_size}, "
                f"{self.num_attention_heads} heads, kv_lora {self.kv_lora_rank}, vocab {self.vocab_size}")

    def is_moe_layer(self, layer: int) -> bool:
        """MoE from ``first_k_dense_replace`` on, every ``moe_layer_freq``-th layer (dense otherwise)."""
        return layer >= self.first_k_dense_replace and layer % self.moe_layer_freq == 0

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        """Parse a ``config.json`` dict; see the module docstring."""
        if not isinstance(d, dict):
            raise ValueError(f"config must be a dict, got {type(d).__name__}")
        if isinstance(d.get("text_config"), dict):     # Kimi K2.5 / K2.6: the text model nested
            d = {**d["text_config"], "quantization_config": d.get("quantization_config")
                 or d["text_config"].get("quantization_config")}
        model_type = d.get("model_type", "deepseek_v3")
        if model_type not in _FAMILY_DEFAULTS:
            raise ValueError(
                f"model_type {model_type!r} is not supported; expected one of "
                f"{sorted(_FAMILY_DEFAULTS)} (the DeepSeek-V2 / V3 / Kimi-K2 MLA + MoE family)"
            )
        defaults = _FAMILY_DEFAULTS[model_type]
        _refuse_unsupported(d)
        missing = [k for k in ESSENTIAL if k not in d or (d[k] is None and k != "q_lora_rank")]
        if missing:
            raise ValueError(f"config has no {', '.join(missing)}: the tensors' shapes follow from "
                             f"{'it' if len(missing) == 1 else 'them'}, so no default is taken")

        def get(key):
            value = d.get(key)
            return defaults[key] if value is None else value

        rope_theta, rope_scaling = _parse_rope(d, defaults)
        kwargs = {f.name: None for f in dataclasses.fields(cls)}
        for key in kwargs:
            if key in ("model_type", "rope_theta", "rope_scaling", "weight_block_size", "q_lora_rank",
                       "num_nextn_predict_layers", "int4_group_size", "quant_ignore"):
                continue
            kwargs[key] = get(key)
        kwargs.update(
            model_type=model_type,
            q_lora_rank=d["q_lora_rank"],
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            num_nextn_predict_layers=d.get("num_nextn_predict_layers") or 0,
            int4_group_size=None, quant_ignore=(),
        )
        kwargs.update(_parse_quantization(d.get("quantization_config")))
        cfg = cls(**_coerce(kwargs))
        cfg.validate()
        return cfg

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "ModelConfig":
        """Read ``config.json`` (or the ``config.json`` inside a checkpoint directory)."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        d = read_config_json(path)
        try:
            return cls.from_dict(d)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None

    def to_dict(self) -> dict:
        """The config in the released-checkpoint spelling (``rope_theta`` + ``rope_scaling``)."""
        d = dataclasses.asdict(self)
        rs = d.pop("rope_scaling")
        if rs is not None:
            rs = {k: v for k, v in rs.items() if v is not None}
            rs["type"] = rs.pop("rope_type")
        d["rope_scaling"] = rs
        wbs = d.pop("weight_block_size")
        if wbs is not None:
            d["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                        "activation_scheme": "dynamic",
                                        "weight_block_size": list(wbs)}
        group, ignore = d.pop("int4_group_size"), d.pop("quant_ignore")
        if group is not None:
            d["quantization_config"] = int4_quantization_config(group, ignore)
        return d

    def replace(self, **changes) -> "ModelConfig":
        """This config with ``changes``, their types checked as ``from_dict`` checks a config.json's."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(f"ModelConfig has no field {', '.join(unknown)}")
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        cfg = type(self)(**_coerce({**fields, **changes}))
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Raise ``ValueError`` for a value the engine cannot run, saying which and why."""
        positive = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                    "max_position_embeddings", "moe_layer_freq"]
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.q_lora_rank is not None and self.q_lora_rank <= 0:
            raise ValueError(f"q_lora_rank must be positive or null, got {self.q_lora_rank}")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even (rope rotates pairs), got {self.qk_rope_head_dim}")
        if self.rms_norm_eps < 0:
            raise ValueError(f"rms_norm_eps must be >= 0, got {self.rms_norm_eps}")
        if not 0 < self.rope_theta < float("inf"):
            raise ValueError(f"rope_theta must be positive and finite, got {self.rope_theta}")
        if self.first_k_dense_replace < 0:
            raise ValueError(f"first_k_dense_replace must be >= 0, got {self.first_k_dense_replace}")
        if self.first_k_dense_replace > 0 and self.intermediate_size <= 0:
            raise ValueError("intermediate_size must be positive when there are dense layers")
        if self.topk_method not in TOPK_METHODS:
            raise ValueError(f"topk_method {self.topk_method!r} is not one of {TOPK_METHODS}")
        if self.scoring_func not in SCORING_FUNCS:
            raise ValueError(f"scoring_func {self.scoring_func!r} is not one of {SCORING_FUNCS}")
        if self.weight_block_size is not None and min(self.weight_block_size) <= 0:
            raise ValueError(f"weight_block_size must be positive, got {self.weight_block_size}")
        if any(self.is_moe_layer(i) for i in range(self.num_hidden_layers)):
            self._validate_moe()
        rs = self.rope_scaling
        if rs is not None:
            if rs.rope_type not in ROPE_TYPES:
                raise ValueError(f"rope type {rs.rope_type!r} is not one of {ROPE_TYPES}")
            if rs.factor <= 0:
                raise ValueError(f"rope_scaling factor must be positive, got {rs.factor}")
            if rs.original_max_position_embeddings <= 0:
                raise ValueError("rope_scaling original_max_position_embeddings must be positive")

    def _validate_moe(self):
        e, g = self.n_routed_experts, self.n_group
        for name in ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "n_group",
                     "topk_group"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive in a model with MoE layers, got {getattr(self, name)}")
        if self.n_shared_experts < 0:
            raise ValueError(f"n_shared_experts must be >= 0, got {self.n_shared_experts}")
        if self.num_experts_per_tok > e:
            raise ValueError(f"num_experts_per_tok={self.num_experts_per_tok} exceeds n_routed_experts={e}")
        if self.topk_method != "greedy":
            if e % g:
                raise ValueError(f"n_routed_experts={e} must divide into n_group={g} equal groups")
            if self.topk_group > g:
                raise ValueError(f"topk_group={self.topk_group} exceeds n_group={g}")
            if self.num_experts_per_tok > self.topk_group * (e // g):
                raise ValueError(
                    f"num_experts_per_tok={self.num_experts_per_tok} exceeds the "
                    f"{self.topk_group * (e // g)} experts in topk_group={self.topk_group} groups"
                )
            if self.topk_method == "noaux_tc" and e // g < 2:
                raise ValueError("noaux_tc scores a group by its two best experts: needs >= 2 experts per group")

    @classmethod
    def tiny(cls, **changes) -> "ModelConfig":
        """A two-layer DeepSeek-V3-shaped preset for tests (dense layer 0, MoE layer 1)."""
        base = dict(
            model_type="deepseek_v3", vocab_size=64, hidden_size=32, intermediate_size=48,
            moe_intermediate_size=8, num_hidden_layers=2, num_attention_heads=4, q_lora_rank=24,
            kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
            n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2,
            topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True,
            routed_scaling_factor=2.5, first_k_dense_replace=1, moe_layer_freq=1,
            rms_norm_eps=1e-6, tie_word_embeddings=False, rope_interleave=True,
            max_position_embeddings=256, rope_theta=10000.0, rope_scaling=None,
        )
        return cls(**base).replace(**changes)


def read_config_json(path: str) -> dict:
    """A checkpoint's ``config.json`` as a dict; a ``ValueError`` naming the file when it is
    missing or not JSON."""
    if not os.path.isfile(path):
        raise ValueError(f"no config.json at {path}")
    with open(path) as f:
        try:
            return json.load(f)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path} is not valid JSON: {err}") from None


# Defaults of each family's own HF implementation. deepseek_v3 (and kimi_k2, which ships with the
# DeepSeek-V3 code): sigmoid scores + e_score_correction_bias, noaux_tc group routing, normalised
# top-k weights. deepseek_v2: softmax scores, greedy top-k, no normalisation.
# The shape keys of ESSENTIAL have no default here: a config.json must give them.
_V3 = dict(
    n_group=8, topk_group=4, topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True,
    routed_scaling_factor=2.5, moe_layer_freq=1, rms_norm_eps=1e-6, tie_word_embeddings=False,
    rope_interleave=True, max_position_embeddings=4096, rope_theta=10000.0,
)
_V2 = dict(
    n_group=1, topk_group=1, topk_method="greedy", scoring_func="softmax", norm_topk_prob=False,
    routed_scaling_factor=1.0, moe_layer_freq=1, rms_norm_eps=1e-6, tie_word_embeddings=False,
    rope_interleave=True, max_position_embeddings=2048, rope_theta=10000.0,
)
_FAMILY_DEFAULTS = {"deepseek_v3": _V3, "kimi_k2": _V3, "deepseek_v2": _V2}

# Keys that fix tensor shapes: a config.json without one of them is refused, never defaulted
# (q_lora_rank may be null, but not absent). moe_layer_freq is left out: transformers' config has
# none, and its absence means 1 there too.
ESSENTIAL = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "q_lora_rank",
             "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "intermediate_size",
             "moe_intermediate_size", "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
             "first_k_dense_replace")

_INT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
               "num_hidden_layers", "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim",
               "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "n_shared_experts",
               "num_experts_per_tok", "n_group", "topk_group", "first_k_dense_replace",
               "moe_layer_freq", "max_position_embeddings", "num_nextn_predict_layers")


def _coerce(kwargs):
    for key in _INT_FIELDS:
        v = kwargs[key]
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                raise ValueError(f"{key} must be an integer, got {v!r}")
        kwargs[key] = v
    if kwargs["q_lora_rank"] is not None and not isinstance(kwargs["q_lora_rank"], int):
        raise ValueError(f"q_lora_rank must be an integer or null, got {kwargs['q_lora_rank']!r}")
    for key in ("norm_topk_prob", "tie_word_embeddings", "rope_interleave"):
        if not isinstance(kwargs[key], bool):
            raise ValueError(f"{key} must be true or false, got {kwargs[key]!r}")
    for key in ("routed_scaling_factor", "rms_norm_eps"):
        if isinstance(kwargs[key], bool) or not isinstance(kwargs[key], (int, float)):
            raise ValueError(f"{key} must be a number, got {kwargs[key]!r}")
        kwargs[key] = float(kwargs[key])
    return kwargs


def _refuse_unsupported(d):
    """Keys whose value changes the computation in a way this engine does not implement."""
    act = d.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported: the experts and MLPs are SwiGLU (silu)")
    if d.get("attention_bias"):
        raise ValueError("attention_bias=true is not supported: DeepSeek MLA projections carry no bias")
    if d.get("mlp_bias"):
        raise ValueError("mlp_bias=true is not supported: DeepSeek MLPs carry no bias")
    heads, kv_heads = d.get("num_attention_heads"), d.get("num_key_value_heads")
    if kv_heads is not None and heads is not None and kv_heads != heads:
        raise ValueError(
            f"num_key_value_heads={kv_heads} differs from num_attention_heads={heads}: MLA expands "
            "one latent into every head, so grouped KV heads have no meaning here"
        )
    if d.get("model_type") == "deepseek_v2" and d.get("norm_topk_prob") and \
            d.get("routed_scaling_factor", 1.0) != 1.0:
        raise ValueError(
            "deepseek_v2 with norm_topk_prob=true and routed_scaling_factor != 1 is ambiguous: "
            "DeepSeek-V2's code skips the scaling when it normalises, transformers never normalises"
        )


def _parse_rope(d, defaults):
    """(rope_theta, RopeScaling | None) from either spelling."""
    params = d.get("rope_parameters")
    scaling = d.get("rope_scaling")
    theta = d.get("rope_theta")
    if isinstance(params, dict) and params:
        if any(isinstance(v, dict) for v in params.values()):
            raise ValueError("per-layer-type rope_parameters are not supported (one rope for all layers)")
        theta = params.get("rope_theta", theta)
        rope = params
    else:
        rope = scaling
    if theta is None:
        theta = defaults["rope_theta"]
    if not rope:
        return theta, None
    if not isinstance(rope, dict):
        raise ValueError(f"rope settings must be a dict, got {rope!r}")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope type {rope_type!r} is not supported; expected one of {ROPE_TYPES}")
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial_rotary_factor != 1 is not supported: MLA rotates the whole rope dim")
    if rope_type == "default":
        return theta, None
    max_pos = d.get("max_position_embeddings", defaults["max_position_embeddings"])
    orig = rope.get("original_max_position_embeddings", max_pos)
    factor = rope.get("factor")
    if factor is None:
        factor = max_pos / orig          # as transformers: the ratio of context lengths
    return theta, RopeScaling(
        rope_type=rope_type,
        factor=float(factor),
        original_max_position_embeddings=int(orig),
        beta_fast=float(rope.get("beta_fast") or 32.0),
        beta_slow=float(rope.get("beta_slow") or 1.0),
        mscale=None if rope.get("mscale") is None else float(rope["mscale"]),
        mscale_all_dim=None if rope.get("mscale_all_dim") is None else float(rope["mscale_all_dim"]),
        attention_factor=None if rope.get("attention_factor") is None else float(rope["attention_factor"]),
        truncate=bool(rope.get("truncate", True)),
    )


def int4_quantization_config(group_size: int, ignore) -> dict:
    """The ``quantization_config`` of a compressed-tensors pack-quantized INT4 checkpoint, as Kimi
    K2 Thinking / K2.5 / K2.6 ship it (symmetric int4 weights in groups along the input, no
    activation quantization)."""
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {
                "targets": ["Linear"], "format": "pack-quantized", "input_activations": None, "output_activations": None,
                "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                            "group_size": int(group_size), "dynamic": False, "actorder": None, "observer": "minmax"}}},
            "ignore": list(ignore)}


def _parse_quantization(q) -> dict:
    """The ModelConfig fields of a ``quantization_config``: fp8 e4m3 block scales
    (``weight_block_size``) or compressed-tensors pack-quantized INT4 (``int4_group_size``,
    ``quant_ignore``); a ValueError naming any other scheme or setting."""
    if not q:
        return {}
    if not isinstance(q, dict):
        raise ValueError(f"quantization_config must be an object, got {type(q).__name__}")
    method = q.get("quant_method")
    if method == "compressed-tensors":
        return _parse_compressed_tensors(q)
    if method != "fp8":
        raise ValueError(f"quantization_config quant_method {method!r} is not supported (only fp8 block scales "
                         "and compressed-tensors pack-quantized INT4)")
    fmt = q.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ValueError(f"quantization_config fmt {fmt!r} is not supported (only e4m3)")
    block = q.get("weight_block_size", [128, 128])
    if not (isinstance(block, (list, tuple)) and len(block) == 2):
        raise ValueError(f"quantization_config weight_block_size must be two integers, got {block!r}")
    return {"weight_block_size": (int(block[0]), int(block[1]))}


def _parse_compressed_tensors(q: dict) -> dict:
    fmt = q.get("format")
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or len(groups) != 1:
        raise ValueError(f"quantization_config config_groups: one group is supported, got "
                         f"{len(groups) if isinstance(groups, dict) else groups!r}")
    (gname, group), = groups.items()
    for f in (fmt, group.get("format") or fmt):
        if f != "pack-quantized":
            raise ValueError(f"quantization_config format {f!r} is not supported (only pack-quantized)")
    if group.get("targets") != ["Linear"]:
        raise ValueError(f"quantization_config {gname} targets {group.get('targets')!r}: only ['Linear'] is supported")
    for key in ("input_activations", "output_activations"):
        if group.get(key):
            raise ValueError(f"quantization_config {gname} {key} {group[key]!r}: activation quantization is not "
                             "supported (weights only, w4a16)")
    w = group.get("weights") or {}
    checks = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group"}
    for key, want in checks.items():
        if w.get(key) != want:
            raise ValueError(f"quantization_config {gname} weights {key} {w.get(key)!r} is not supported "
                             f"(only {want!r})")
    if w.get("dynamic") not in (None, False) or w.get("actorder") not in (None, False):
        raise ValueError(f"quantization_config {gname} weights: dynamic {w.get('dynamic')!r} / actorder "
                         f"{w.get('actorder')!r} are not supported")
    size = w.get("group_size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 8 or size % 8:
        raise ValueError(f"quantization_config {gname} weights group_size must be a positive multiple of 8, "
                         f"got {size!r}")
    ignore = q.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(e, str) for e in ignore):
        raise ValueError(f"quantization_config ignore must be a list of names, got {ignore!r}")
    for e in ignore:
        if e.startswith("re:"):
            try:
                re.compile(e[3:])
            except re.error as err:
                raise ValueError(f"quantization_config ignore entry {e!r} is not a valid regex: {err}") from None
    return {"int4_group_size": size, "quant_ignore": tuple(ignore)}