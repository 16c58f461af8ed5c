"""The reference stages on hand-computed cases: routing for every scoring_func x topk_method,
rope in both layouts, YaRN constants, RMSNorm, and naive MLA == absorbed MLA."""

import math

import numpy as np
import pytest

from ddtree_numba import reference as ref

sig = lambda v: 1.0 / (1.0 + math.exp(-v))                              # noqa: E731
X = [2.0, -3.0, 1.5, 1.4]            # router logits of one token (gate weight = identity)
EYE = np.eye(4, dtype=np.float32)


def _route(scoring, method, k=2, bias=None, norm=False, scale=1.0, n_group=2, topk_group=1, x=X):
    return ref.moe_route(np.array([x], np.float32), EYE, None if bias is None else np.array(bias, np.float32),
                         scoring, method, n_group, topk_group, k, norm, scale)


def _softmax(x):
    e = [math.exp(v) for v in x]
    return [v / sum(e) for v in e]


# Groups are {0, 1} and {2, 3}. Expert 0 is the single best, but group {2, 3} is the better
# pair, so greedy, max-per-group and top-2-sum-per-group pick differently.
@pytest.mark.parametrize("scoring, method, want_ids", [
    ("softmax", "greedy", [0, 2]),
    ("sigmoid", "greedy", [0, 2]),
    ("softmax", "group_limited_greedy", [0, 1]),      # group max: 0 beats 2
    ("sigmoid", "group_limited_greedy", [0, 1]),
    ("softmax", "noaux_tc", [2, 3]),                  # group top-2 sum: {2, 3} beats {0, 1}
    ("sigmoid", "noaux_tc", [2, 3]),
])
def test_every_scoring_func_and_topk_method_by_hand(scoring, method, want_ids):
    scores = _softmax(X) if scoring == "softmax" else [sig(v) for v in X]
    bias = [0.0] * 4 if method == "noaux_tc" else None
    ids, w = _route(scoring, method, bias=bias, scale=2.5)
    assert ids.dtype == np.int32 and w.dtype == np.float32
    assert ids[0].tolist() == want_ids
    np.testing.assert_allclose(w[0], [2.5 * scores[i] for i in want_ids], rtol=1e-6)
    ids, w = _route(scoring, method, bias=bias, norm=True, scale=2.5)
    total = sum(scores[i] for i in want_ids)
    np.testing.assert_allclose(w[0], [2.5 * scores[i] / total for i in want_ids], rtol=1e-6)


def test_correction_bias_chooses_but_does_not_weigh():
    ids, w = _route("sigmoid", "noaux_tc", bias=[0.0, 0.0, 0.0, 0.1], norm=True)
    assert ids[0].tolist() == [3, 2]                  # 3 overtakes 2 by its bias
    s2, s3 = sig(1.5), sig(1.4)
    np.testing.assert_allclose(w[0], [s3 / (s2 + s3), s2 / (s2 + s3)], rtol=1e-6)
    ids, _ = _route("sigmoid", "noaux_tc", bias=[0.0, 2.0, 0.0, 0.0], k=1)
    assert ids[0].tolist() == [1]                     # a big bias moves the group and the expert
    with pytest.raises(ValueError, match="e_score_correction_bias"):
        _route("sigmoid", "noaux_tc")


def test_routing_ties_go_to_the_lower_expert_id():
    ids, _ = _route("softmax", "greedy", k=3, x=[1.0, 1.0, 1.0, 1.0])
    assert ids[0].tolist() == [0, 1, 2]
    ids, _ = _route("sigmoid", "noaux_tc", k=2, bias=[0.0] * 4, x=[0.5, 0.5, 0.5, 0.5])
    assert ids[0].tolist() == [0, 1]


def test_moe_experts_weighted_sum_by_hand():
    rng = np.random.default_rng(0)
    m, inter, e = 5, 3, 4
    x = rng.standard_normal((2, m)).astype(np.float32)
    g, u = rng.standard_normal((e, inter, m)).astype(np.float32), rng.standard_normal((e, inter, m)).astype(np.float32)
    d = rng.standard_normal((e, m, inter)).astype(np.float32)
    ids = np.array([[3, 1], [0, 3]], np.int32)
    w = np.array([[0.7, 0.2], [1.5, -0.5]], np.float32)

    def expert(j, v):
        a, b = g[j].astype(np.float64) @ v, u[j].astype(np.float64) @ v
        return d[j].astype(np.float64) @ (a / (1 + np.exp(-a)) * b)
    want = np.stack([0.7 * expert(3, x[0]) + 0.2 * expert(1, x[0]), 1.5 * expert(0, x[1]) - 0.5 * expert(3, x[1])])
    np.testing.assert_allclose(ref.moe_experts(x, ids, w, g, u, d), want, rtol=1e-5, atol=1e-5)


def test_rms_norm_by_hand():
    x = np.array([[3.0, 4.0]], np.float32)
    out = ref.rms_norm(x, np.array([1.0, 2.0], np.float32), 0.0)
    np.testing.assert_allclose(out, [[3 / math.sqrt(12.5), 8 / math.sqrt(12.5)]], rtol=1e-6)


def test_rope_layouts_by_hand():
    inv = np.array([1.0, 0.01])
    cos, sin = ref.rope_cos_sin(np.array([1]), inv)
    x = np.array([[1.0, 0.0, 0.0, 1.0]], np.float32)
    c1, s1, c2, s2 = math.cos(1), math.sin(1), math.cos(0.01), math.sin(0.01)
    # interleaved pairs (x0, x1) at frequency 1 and (x2, x3) at 0.01
    np.testing.assert_allclose(ref.rope(x, cos, sin, True), [[c1, s1, -s2, c2]], rtol=1e-6, atol=1e-7)
    # rotate-half pairs (x0, x2) at frequency 1 and (x1, x3) at 0.01
    np.testing.assert_allclose(ref.rope(x, cos, sin, False), [[c1, -s2, s1, c2]], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("interleave", [True, False])
def test_rope_scores_depend_on_relative_position_only(interleave):
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((2, 8)).astype(np.float32), rng.standard_normal((2, 8)).astype(np.float32)
    inv = ref.rope_inv_freq(8, 10000.0)

    def score(pq, pk):
        cq, sq = ref.rope_cos_sin(np.array([pq]), inv)
        ck, sk = ref.rope_cos_sin(np.array([pk]), inv)
        return float((ref.rope(q[:1], cq, sq, interleave) @ ref.rope(k[:1], ck, sk, interleave).T)[0, 0])
    assert score(7, 3) == pytest.approx(score(104, 100), rel=1e-5)
    assert score(7, 3) != pytest.approx(score(8, 3), rel=1e-3)


def test_yarn_constants_of_deepseek_v3():
    # DeepSeek-V3: factor 40, mscale = mscale_all_dim = 1, qk_head_dim 192
    m = 0.1 * math.log(40) + 1
    assert ref.yarn_get_mscale(40, 1.0) == pytest.approx(m)
    assert ref.softmax_scale(192, 40.0, 1.0) == pytest.approx(192 ** -0.5 * m * m)
    assert ref.softmax_scale(192) == pytest.approx(192 ** -0.5)
    assert ref.yarn_attention_factor(40.0, 1.0, 1.0) == pytest.approx(1.0)
    assert ref.yarn_attention_factor(40.0, None, None) == pytest.approx(m)
    inv = ref.yarn_inv_freq(64, 10000.0, 40.0, 4096, 32.0, 1.0)
    base = ref.rope_inv_freq(64, 10000.0)
    # fast dims (more than beta_fast turns in 4096 tokens) kept, slow dims divided by the factor
    low = math.floor(64 * math.log(4096 / (32 * 2 * math.pi)) / (2 * math.log(10000)))
    high = math.ceil(64 * math.log(4096 / (1 * 2 * math.pi)) / (2 * math.log(10000)))
    np.testing.assert_allclose(inv[:low + 1], base[:low + 1])
    np.testing.assert_allclose(inv[high:], base[high:] / 40.0)
    assert (inv[low + 1:high] < base[low + 1:high]).all() and (inv[low + 1:high] > base[low + 1:high] / 40).all()


@pytest.mark.parametrize("t, s, h, c, r, d, dv", [(1, 1, 1, 4, 2, 3, 5), (5, 9, 3, 16, 8, 8, 8), (7, 7, 4, 12, 6, 10, 4)])
def test_naive_and_absorbed_mla_agree(t, s, h, c, r, d, dv):
    rng = np.random.default_rng(t * 100 + s)
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    q_nope, q_pe, c_kv, k_pe, kv_b = f(t, h, d), f(t, h, r), f(s, c), f(s, r), f(h * (d + dv), c)
    parents = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, t)], np.int32)
    mask = ref.mla_mask(s - t, t, parents)
    scale = (d + r) ** -0.5
    a = ref.mla_attention_naive(q_nope, q_pe, c_kv, k_pe, kv_b, mask, scale)
    b = ref.mla_attention_absorbed(q_nope, q_pe, c_kv, k_pe, kv_b, mask, scale)
    assert a.shape == b.shape == (t, h, dv) and b.dtype == np.float32
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * np.abs(a).max())


@pytest.mark.parametrize("key_chunk", [1, 3, 8, 1000])
def test_chunked_attention_is_the_softmax_and_cuts_by_visible_index(key_chunk):
    """The GPU's chunked softmax (``chunked_attention``) is the plain one to float32 rounding, and
    a tree node's output is the bits of the same query over its path laid out contiguously (the
    chunks follow the visible index, not the cache position)."""
    rng = np.random.default_rng(key_chunk)
    t, s0, h, c = 9, 5, 2, 6
    scores = (rng.standard_normal((t, h, s0 + t)) * 3).astype(np.float32)
    values = rng.standard_normal((s0 + t, c)).astype(np.float32)
    parents = np.array([-1, 0, 0, 1, 2, 2, 3, 5, 7], np.int32)
    mask = ref.mla_mask(s0, t, parents)
    plain = np.einsum("ths,sc->thc", ref.mla._masked_softmax(scores, mask), values)
    got = ref.chunked_attention(scores, mask, values, key_chunk)
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-6)
    for i in range(t):
        keys = np.flatnonzero(mask[i])
        alone = ref.chunked_attention(scores[i:i + 1][:, :, keys], np.ones((1, len(keys)), bool), values[keys], key_chunk)
        np.testing.assert_array_equal(alone[0], got[i])


def test_mla_naive_by_hand_and_mask():
    # one head, D = R = Dv = C = 1: keys k_s = (w_uk c_s, kpe_s), values v_s = w_uv c_s
    c_kv = np.array([[1.0], [2.0], [3.0]], np.float32)
    k_pe = np.array([[0.5], [0.0], [-1.0]], np.float32)
    kv_b = np.array([[2.0], [3.0]], np.float32)                # w_uk = 2, w_uv = 3
    q_nope, q_pe = np.array([[[1.0]]], np.float32), np.array([[[1.0]]], np.float32)
    mask = np.array([[True, False, True]])
    s0, s2 = 2 * 1 + 0.5, 2 * 3 - 1.0                          # row 1 masked out
    p0 = math.exp(s0) / (math.exp(s0) + math.exp(s2))
    want = p0 * 3 * 1 + (1 - p0) * 3 * 3
    for fn in (ref.mla_attention_naive, ref.mla_attention_absorbed):
        assert fn(q_nope, q_pe, c_kv, k_pe, kv_b, mask, 1.0)[0, 0, 0] == pytest.approx(want, rel=1e-6)
    m = ref.mla_mask(2, 3, np.array([-1, 0, 0], np.int32))
    assert m.tolist() == [[True, True, True, False, False], [True, True, True, True, False],
                          [True, True, True, False, True]]
    assert ref.mla_mask(1, 2).tolist() == [[True, True, False], [True, True, True]]
