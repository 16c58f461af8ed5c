"""The DFlash drafter's numpy forward: against a slow independent implementation written the
way z-lab/dflash writes it, its context cache, non-causal block attention, loading and refusals."""

import json
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

import ddtree_numba as dd
from ddtree_numba.model import random_drafter
from ddtree_numba.model.drafter import DrafterConfig, NumpyDrafter, drafter_shapes
from ddtree_numba.reference.gqa import gqa_attention

DATA = os.path.join(os.path.dirname(__file__), "data")


@pytest.fixture(scope="module")
def target():
    return dd.load_target(os.path.join(DATA, "v3_noaux_tc"))


def _features(rng, n, drafter):
    y, m = len(drafter.target_layer_ids), drafter.config.hidden_size
    return rng.standard_normal((n, y, m)).astype(np.float32)


def _slow_dflash(drafter, features, block_ids):
    """DFlashDraftModel.forward over the whole context at once, in float64, head by head:
    K/V from ``[ctx; block]`` concatenated before the projections, rotate-half rope over the
    positions ``0 .. n+B-1`` with the queries taking the last B, repeat_kv for GQA."""
    cfg, w = drafter.config, drafter.w
    eps, dh = cfg.rms_norm_eps, cfg.head_dim
    f64 = {k: v.astype(np.float64) for k, v in w.items()}

    def norm(x, g):
        return g * x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)

    def rot(x, pos):
        inv = 1.0 / cfg.rope_theta ** (np.arange(0, dh, 2) / dh)
        ang = np.concatenate([pos[:, None] * inv] * 2, axis=-1)[:, None, :]     # [T, 1, Dh]
        half = np.concatenate([-x[..., dh // 2:], x[..., :dh // 2]], axis=-1)
        return x * np.cos(ang) + half * np.sin(ang)

    n, b = features.shape[0], block_ids.shape[0]
    pos = np.arange(n + b, dtype=np.float64)
    target = norm(features.reshape(n, -1).astype(np.float64) @ f64["fc.weight"].T, f64["hidden_norm.weight"])
    x = drafter.target.embed_tokens[block_ids].astype(np.float64)
    g = cfg.num_attention_heads // cfg.num_key_value_heads
    for i in range(cfg.num_hidden_layers):
        a, p = f"layers.{i}.self_attn.", f"layers.{i}."
        h = norm(x, f64[p + "input_layernorm.weight"])
        q = (h @ f64[a + "q_proj.weight"].T).reshape(b, -1, dh)
        both = np.concatenate([target, h])
        k = (both @ f64[a + "k_proj.weight"].T).reshape(n + b, -1, dh)
        v = (both @ f64[a + "v_proj.weight"].T).reshape(n + b, -1, dh)
        q = rot(norm(q, f64[a + "q_norm.weight"]), pos[-b:])
        k = rot(norm(k, f64[a + "k_norm.weight"]), pos)
        o = np.zeros_like(q)
        for head in range(q.shape[1]):
            s = q[:, head] @ k[:, head // g].T * dh ** -0.5                  # [B, n + B], no mask
            e = np.exp(s - s.max(-1, keepdims=True))
            o[:, head] = (e / e.sum(-1, keepdims=True)) @ v[:, head // g]
        x = x + o.reshape(b, -1) @ f64[a + "o_proj.weight"].T
        h = norm(x, f64[p + "post_attention_layernorm.weight"])
        gt, up = h @ f64[p + "mlp.gate_proj.weight"].T, h @ f64[p + "mlp.up_proj.weight"].T
        x = x + (gt / (1 + np.exp(-gt)) * up) @ f64[p + "mlp.down_proj.weight"].T
    return norm(x, f64["norm.weight"])


@pytest.mark.parametrize("layers, heads, kv_heads, block", [(1, 4, 2, 5), (2, 4, 4, 3), (2, 6, 1, 7)])
def test_forward_matches_a_slow_independent_implementation(target, rng, layers, heads, kv_heads, block):
    d = random_drafter(target, num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=kv_heads, block_size=block, target_layer_ids=(0, 1, 2),
                       seed=layers)
    feats = _features(rng, 9, d)
    ids = rng.integers(0, 96, block)
    got = d.forward(feats, ids, d.new_cache(16))
    np.testing.assert_allclose(got, _slow_dflash(d, feats, ids), rtol=1e-4, atol=1e-4)
    logits = d.draft(feats, int(ids[0]), d.new_cache(16))
    assert logits.shape == (block - 1, 96) and logits.dtype == np.float32


def test_context_cache_grows_by_context_rows_only(target, rng):
    """Feeding the context in pieces (the block between them discarded) gives the same draft as
    feeding it at once: block K/V never enter the cache."""
    d = random_drafter(target, block_size=6, seed=3)
    feats = _features(rng, 11, d)
    whole = d.new_cache(20)
    a = d.draft(feats, 5, whole)
    parts = d.new_cache(20)
    d.draft(feats[:4], 17, parts)
    d.draft(feats[4:4], 2, parts)                               # an empty update is fine
    d.draft(feats[4:10], 40, parts)
    b = d.draft(feats[10:], 5, parts)
    assert whole.length == parts.length == 11
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_block_attention_is_not_causal(target, rng):
    d = random_drafter(target, block_size=5, seed=4)
    feats = _features(rng, 3, d)
    ids = np.array([4, 95, 95, 95, 95])
    base = d.forward(feats, ids, d.new_cache(8))
    ids2 = ids.copy()
    ids2[-1] = 7
    other = d.forward(feats, ids2, d.new_cache(8))
    assert np.abs(other[0] - base[0]).max() > 1e-3             # the first row sees the last token


def test_gqa_attention_repeats_kv_heads(rng):
    q = rng.standard_normal((3, 6, 4)).astype(np.float32)
    k = rng.standard_normal((5, 2, 4)).astype(np.float32)
    v = rng.standard_normal((5, 2, 4)).astype(np.float32)
    full = gqa_attention(q, np.repeat(k, 3, axis=1), np.repeat(v, 3, axis=1), 0.5)
    np.testing.assert_allclose(gqa_attention(q, k, v, 0.5), full, rtol=1e-6, atol=1e-6)
    mask = np.tril(np.ones((3, 5), bool), 2)
    np.testing.assert_allclose(gqa_attention(q, k, v, 0.5, mask)[0],
                               gqa_attention(q[:1], k[:3], v[:3], 0.5)[0], rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="not a multiple"):
        gqa_attention(q[:, :5], k, v, 0.5)


def _save(d, path, prefix="", dtype=np.float32, drop=None):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(d.config.to_dict(), f)
    tensors = {prefix + n: w.astype(dtype) for n, w in d.w.items() if n != drop}
    save_file(tensors, os.path.join(path, "model.safetensors"))


@pytest.mark.parametrize("prefix", ["", "model."])
def test_load_drafter_round_trip(target, rng, tmp_path, prefix):
    d = random_drafter(target, num_hidden_layers=2, seed=5)
    _save(d, tmp_path / "d", prefix)
    e = dd.load_drafter(tmp_path / "d", target)
    assert e.config == d.config and e.block_size == 8 and e.target_layer_ids == (0, 2)
    feats = _features(rng, 4, d)
    np.testing.assert_array_equal(e.draft(feats, 3, e.new_cache(8)), d.draft(feats, 3, d.new_cache(8)))


def test_load_drafter_refusals(target, tmp_path):
    d = random_drafter(target, seed=6)
    _save(d, tmp_path / "missing", drop="layers.0.self_attn.k_norm.weight")
    with pytest.raises(ValueError, match="missing tensor layers.0.self_attn.k_norm.weight"):
        dd.load_drafter(tmp_path / "missing", target)
    with pytest.raises(ValueError, match="not a directory"):
        dd.load_drafter(tmp_path / "nowhere", target)
    base = d.config.to_dict()
    bad = [
        (dict(dflash_config=None), "dflash_config"),
        (dict(block_size=1), "block_size must be >= 2"),
        (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope type 'yarn'"),
        (dict(attention_bias=True), "attention_bias"),
        (dict(num_key_value_heads=3), "not a multiple"),
    ]
    for change, words in bad:
        cfg = dict(base, **change)
        if change.get("dflash_config", 0) is None:
            del cfg["dflash_config"]
        with pytest.raises(ValueError, match=words):
            DrafterConfig.from_dict(cfg)
    weights = {n: np.zeros(s, np.float32) for n, s in drafter_shapes(d.config).items()}
    for change, words in [(dict(hidden_size=16), "hidden_size 16 differs"),
                          (dict(target_layer_ids=(0, 3)), "outside the target's 3 layers"),
                          (dict(mask_token_id=96), "mask_token_id 96")]:
        cfg = DrafterConfig(**{**d.config.__dict__, **change})
        w = {n: np.zeros(s, np.float32) for n, s in drafter_shapes(cfg).items()}
        with pytest.raises(ValueError, match=words):
            NumpyDrafter(cfg, w, target)
    weights["fc.weight"] = np.zeros((32, 32), np.float32)
    with pytest.raises(ValueError, match="fc.weight has shape"):
        NumpyDrafter(d.config, weights, target)


def test_forward_input_checks(target):
    d = random_drafter(target)
    cache = d.new_cache(4)
    with pytest.raises(ValueError, match="features"):
        d.forward(np.zeros((2, 1, 32), np.float32), np.array([1]), cache)
    with pytest.raises(ValueError, match="block token id out of range"):
        d.forward(np.zeros((2, 2, 32), np.float32), np.array([96]), cache)
    with pytest.raises(ValueError, match="drafter cache overflow"):
        d.forward(np.zeros((5, 2, 32), np.float32), np.array([1]), cache)
    with pytest.raises(ValueError, match="bonus"):
        d.draft(np.zeros((1, 2, 32), np.float32), -1, cache)
    assert cache.length == 0


def test_forward_matches_hf_qwen3_modules_golden(target):
    """tools/make_drafter_goldens.py: DFlash built from transformers' Qwen3 modules (bf16
    weights), two drafts sharing a DynamicCache cropped back to the context between them."""
    path = os.path.join(DATA, "drafters", "dflash_v3_noaux_tc")
    g = np.load(os.path.join(path, "expected.npz"))
    d = dd.load_drafter(path, target)
    assert d.block_size == 6 and d.target_layer_ids == (0, 2) and d.mask_token_id == 95
    split, feats = int(g["split"]), g["features"]
    hid, drafts = d.new_cache(32), d.new_cache(32)
    for call, (lo, hi) in enumerate([(0, split), (split, feats.shape[0])]):
        block = g[f"block{call}"]
        np.testing.assert_allclose(d.forward(feats[lo:hi], block, hid), g[f"hidden{call}"], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(d.draft(feats[lo:hi], int(block[0]), drafts), g[f"logits{call}"],
                                   rtol=1e-4, atol=1e-4)
    assert hid.length == drafts.length == feats.shape[0]
