"""ModelConfig: both rope spellings, family defaults (those of HF's own implementations),
unknown keys, and every value the engine refuses."""

import json
import os
import re

import pytest

from ddtree_numba import ModelConfig
from ddtree_numba.model.config import RopeScaling

DATA = os.path.join(os.path.dirname(__file__), "data")

YARN = {"factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
        "mscale": 1.0, "mscale_all_dim": 1.0}


def _small(**extra):
    d = dict(model_type="deepseek_v3", vocab_size=96, hidden_size=32, num_attention_heads=4,
             num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8,
             qk_rope_head_dim=8, v_head_dim=8, moe_intermediate_size=8, n_routed_experts=8,
             num_experts_per_tok=2, n_group=4, topk_group=2, num_hidden_layers=2,
             max_position_embeddings=163840, first_k_dense_replace=1, intermediate_size=40,
             n_shared_experts=1)
    d.update(extra)
    return d


def test_released_and_new_rope_spellings_parse_to_the_same_config():
    released = ModelConfig.from_dict(_small(rope_theta=10000, rope_scaling={"type": "yarn", **YARN}))
    new = ModelConfig.from_dict(_small(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, **YARN}))
    also = ModelConfig.from_dict(_small(rope_theta=10000, rope_scaling={"rope_type": "yarn", **YARN}))
    assert released == new == also
    assert released.rope_theta == 10000.0
    assert released.rope_scaling == RopeScaling("yarn", 40.0, 4096, 32.0, 1.0, 1.0, 1.0)


def test_default_rope_in_either_spelling_means_no_scaling():
    a = ModelConfig.from_dict(_small(rope_theta=50000.0, rope_scaling=None))
    b = ModelConfig.from_dict(_small(rope_parameters={"rope_type": "default", "rope_theta": 50000.0}))
    c = ModelConfig.from_dict(_small())
    assert a == b and a.rope_scaling is None and a.rope_theta == 50000.0
    assert c.rope_theta == 10000.0


def test_yarn_without_factor_uses_the_context_ratio_as_transformers_does():
    cfg = ModelConfig.from_dict(_small(max_position_embeddings=8192, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "original_max_position_embeddings": 2048}))
    assert cfg.rope_scaling.factor == 4.0
    assert cfg.rope_scaling.beta_fast == 32.0 and cfg.rope_scaling.beta_slow == 1.0


# The shape keys, as DeepSeek-V3 ships them: a config.json must give these (no default is taken).
V3_SHAPES = dict(vocab_size=129280, hidden_size=7168, num_hidden_layers=61, num_attention_heads=128,
                 q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                 intermediate_size=18432, moe_intermediate_size=2048, n_routed_experts=256, n_shared_experts=1,
                 num_experts_per_tok=8, first_k_dense_replace=3)


def test_family_defaults_are_those_of_the_hf_implementations():
    v3 = ModelConfig.from_dict({"model_type": "deepseek_v3", **V3_SHAPES})
    assert (v3.scoring_func, v3.topk_method, v3.norm_topk_prob) == ("sigmoid", "noaux_tc", True)
    assert (v3.n_routed_experts, v3.n_group, v3.topk_group) == (256, 8, 4)
    assert (v3.routed_scaling_factor, v3.moe_layer_freq, v3.norm_topk_prob) == (2.5, 1, True)
    assert v3.rope_interleave is True and v3.tie_word_embeddings is False
    kimi = ModelConfig.from_dict({"model_type": "kimi_k2", **V3_SHAPES})
    assert (kimi.scoring_func, kimi.topk_method) == ("sigmoid", "noaux_tc")
    v2 = ModelConfig.from_dict({"model_type": "deepseek_v2", **V3_SHAPES})
    assert (v2.scoring_func, v2.topk_method, v2.norm_topk_prob) == ("softmax", "greedy", False)
    assert (v2.routed_scaling_factor, v2.n_group, v2.topk_group) == (1.0, 1, 1)


@pytest.mark.parametrize("key", sorted(V3_SHAPES))
def test_a_shape_key_is_never_defaulted(key):
    """A config.json without hidden_size (or any key a tensor's shape follows from) is refused,
    naming it, instead of taking DeepSeek-V3's value and failing later on a shape."""
    with pytest.raises(ValueError, match=f"config has no {key}"):
        ModelConfig.from_dict({k: v for k, v in V3_SHAPES.items() if k != key})


def test_null_q_lora_rank_and_unknown_keys():
    cfg = ModelConfig.from_dict(_small(q_lora_rank=None, aux_loss_alpha=0.001, ep_size=8, seq_aux=True,
                                       num_nextn_predict_layers=1, auto_map={"x": "y"}, head_dim=8))
    assert cfg.q_lora_rank is None
    assert cfg.qk_head_dim == 16


def test_the_golden_configs_parse():
    v3 = ModelConfig.from_json(os.path.join(DATA, "v3_released"))
    assert v3.rope_scaling.rope_type == "yarn" and v3.rope_interleave is True
    kimi = ModelConfig.from_json(os.path.join(DATA, "kimi_fp8", "config.json"))
    assert kimi.model_type == "kimi_k2" and kimi.weight_block_size == (16, 16)
    v2 = ModelConfig.from_json(os.path.join(DATA, "v2_group_yarn"))
    assert (v2.scoring_func, v2.topk_method) == ("softmax", "group_limited_greedy")


def test_to_dict_round_trips_and_tiny_is_valid():
    for cfg in (ModelConfig.tiny(), ModelConfig.from_json(os.path.join(DATA, "kimi_fp8"))):
        again = ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
        assert again == cfg
    with pytest.raises(Exception):
        ModelConfig.tiny().hidden_size = 3                 # frozen


def test_moe_layers_follow_first_k_dense_replace_and_moe_layer_freq():
    cfg = ModelConfig.from_dict(_small(num_hidden_layers=6, first_k_dense_replace=1, moe_layer_freq=2,
                                       intermediate_size=40))
    assert [cfg.is_moe_layer(i) for i in range(6)] == [False, False, True, False, True, False]


@pytest.mark.parametrize("change, words", [
    ({"model_type": "llama"}, "model_type"),
    ({"topk_method": "top_p"}, "topk_method"),
    ({"scoring_func": "tanh"}, "scoring_func"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"attention_bias": True}, "attention_bias"),
    ({"num_key_value_heads": 2}, "num_key_value_heads"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope type"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4}}, "rope type"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default"}}}, "per-layer"),
    ({"qk_rope_head_dim": 7}, "qk_rope_head_dim"),
    ({"n_group": 3}, "n_group"),
    ({"topk_group": 5}, "topk_group"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok"),
    ({"num_experts_per_tok": 9, "topk_method": "greedy"}, "num_experts_per_tok"),
    ({"n_group": 8, "topk_group": 4}, "two best"),
    ({"vocab_size": "96"}, "vocab_size"),
    ({"vocab_size": 0}, "vocab_size"),
    ({"norm_topk_prob": "yes"}, "norm_topk_prob"),
    ({"rms_norm_eps": -1.0}, "rms_norm_eps"),
    ({"quantization_config": {"quant_method": "gptq"}}, "quant_method"),
    ({"quantization_config": {"quant_method": "fp8", "fmt": "e5m2"}}, "fmt"),
    ({"model_type": "deepseek_v2", "norm_topk_prob": True, "routed_scaling_factor": 16.0}, "ambiguous"),
])
def test_values_the_engine_cannot_run_raise_value_error_naming_them(change, words):
    with pytest.raises(ValueError, match=words):
        ModelConfig.from_dict(_small(**change))


def test_missing_config_json(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        ModelConfig.from_json(tmp_path)


# -- compressed-tensors INT4 (Kimi K2 Thinking / K2.5 / K2.6) ------------------------------------
def _int4_config(**changes):
    import copy
    from ddtree_numba.model.config import int4_quantization_config
    with open(os.path.join(DATA, "kimi_int4", "config.json")) as f:
        d = json.load(f)
    q = copy.deepcopy(d["quantization_config"])
    for path, value in changes.items():
        node = q
        keys = path.split("/")
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    d["quantization_config"] = q
    assert int4_quantization_config(32, [])["quant_method"] == "compressed-tensors"
    return d


def test_int4_quantization_config_is_read_with_its_ignore_list():
    cfg = ModelConfig.from_dict(_int4_config())
    assert cfg.int4_group_size == 32 and cfg.model_type == "kimi_k2"
    assert cfg.is_int4("model.layers.1.mlp.experts.3.down_proj")
    for module in ("lm_head", "model.layers.0.self_attn.q_a_proj", "model.layers.1.mlp.shared_experts.up_proj",
                   "model.layers.0.mlp.gate_proj"):
        assert not cfg.is_int4(module), module
    again = ModelConfig.from_dict(cfg.to_dict())
    assert again == cfg


@pytest.mark.parametrize("path,value,match", [
    ("format", "naive-quantized", "format 'naive-quantized'"),
    ("config_groups/group_0/format", "float-quantized", "format 'float-quantized'"),
    ("config_groups/group_0/weights/num_bits", 8, "num_bits 8"),
    ("config_groups/group_0/weights/type", "float", "type 'float'"),
    ("config_groups/group_0/weights/symmetric", False, "symmetric False"),
    ("config_groups/group_0/weights/strategy", "channel", "strategy 'channel'"),
    ("config_groups/group_0/weights/group_size", 12, "group_size must be a positive multiple of 8"),
    ("config_groups/group_0/weights/actorder", "group", "actorder"),
    ("config_groups/group_0/input_activations", {"num_bits": 8}, "activation quantization"),
    ("config_groups/group_0/targets", ["Embedding"], "targets"),
    ("ignore", ["re:(unclosed"], "not a valid regex"),
    ("quant_method", "gptq", "quant_method 'gptq'"),
])
def test_int4_quantization_settings_it_cannot_run_are_named(path, value, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        ModelConfig.from_dict(_int4_config(**{path: value}))


def test_a_second_config_group_is_refused():
    d = _int4_config()
    d["quantization_config"]["config_groups"]["group_1"] = d["quantization_config"]["config_groups"]["group_0"]
    with pytest.raises(ValueError, match="one group is supported"):
        ModelConfig.from_dict(d)


def test_k25_layout_nests_the_text_model_under_text_config():
    d = _int4_config()
    nested = {"model_type": "kimi_k25", "architectures": ["KimiK25ForConditionalGeneration"],
              "quantization_config": d.pop("quantization_config"), "text_config": d}
    assert ModelConfig.from_dict(nested) == ModelConfig.from_dict(_int4_config())
