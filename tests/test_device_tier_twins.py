"""The device tier (``kernels.<stage>.enqueue_*``) against its numpy twins of the same name
(``reference.<stage>.enqueue_*``): the same arguments, device arrays for the kernel and numpy
arrays for the twin, outputs poisoned first; rows past the live count stay as they were.

Exact where the stage does no arithmetic (seeds, row moves, gathers, masks) and for the rope; the
norm within 1e-5 relative (its sum of squares is a tree), the GEMMs within the twin's
accumulation bound (``reference.linear.accumulation_bound``: the twin sums exactly).
"""

import numpy as np
import pytest
from numba import cuda

from ddtree_numba import kernels as kn
from ddtree_numba import reference as ref
from ddtree_numba.dtypes import from_storage, to_bf16_bits
from ddtree_numba.reference.linear import accumulation_bound


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def both(fn_kernel, fn_twin, *arrays):
    """Run the kernel on device copies and the twin on numpy copies of ``arrays``; -> (kernel's,
    twin's) arrays after the calls."""
    dev = [cuda.to_device(a) for a in arrays]
    host = [a.copy() for a in arrays]
    fn_kernel(*dev)
    fn_twin(*host)
    return [d.copy_to_host() for d in dev], host


def test_round_seed():
    seed, rounds = np.array([2**63 + 12345], np.uint64), np.array([7], np.int32)
    (got,), (want,) = both(lambda o: kn.enqueue_round_seed(cuda.to_device(seed), cuda.to_device(rounds), o),
                           lambda o: ref.enqueue_round_seed(seed, rounds, o), np.zeros(1, np.uint64))
    assert got[0] == want[0] == ref.round_seed(int(seed[0]), 7)


@pytest.mark.parametrize("method,layers", [("columns", 0), ("columns", 3), ("scratch", 0)])
def test_compact_rows(rng, method, layers):
    shape = (12, 5) if not layers else (layers, 12, 5)
    rows = rng.standard_normal(shape).astype(np.float32)
    start_n, keep = np.array([3, 4], np.int32), np.array([0, 2, 5, 6, 99], np.int32)   # keep[n:] unread
    scratch = cuda.device_array((4, 5), np.float32) if method == "scratch" else None
    (got,), (want,) = both(
        lambda r: kn.enqueue_compact_rows(r, cuda.to_device(start_n), cuda.to_device(keep), n_max=4, method=method,
                                          scratch=scratch),
        lambda r: ref.enqueue_compact_rows(r, start_n, keep, n_max=4, method=method), rows)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(want[..., 3:7, :], rows[..., 3 + keep[:4], :])
    np.testing.assert_array_equal(want[..., 7:, :], rows[..., 7:, :])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.uint16])
def test_embedding(rng, dtype):
    values = rng.standard_normal((9, 6)).astype(np.float32)
    table = to_bf16_bits(values) if dtype == np.uint16 else values.astype(dtype)
    ids, n_rows = np.array([4, 0, 9, -1, 8, 3], np.int32), np.array([5], np.int32)   # 9, -1: NaN rows; row 5 past n
    out = np.full((6, 6), 3.5, np.float32)
    (got,), (want,) = both(lambda o: kn.enqueue_embedding(cuda.to_device(ids), cuda.to_device(table), o,
                                                          cuda.to_device(n_rows)),
                           lambda o: ref.enqueue_embedding(ids, table, o, n_rows), out)
    np.testing.assert_array_equal(got, want)                 # NaNs in the same places
    np.testing.assert_array_equal(want[[0, 1, 4]], from_storage(table)[[4, 0, 8]])
    assert np.isnan(want[[2, 3]]).all() and (want[5] == 3.5).all()


def test_visibility_bits():
    parents = np.array([-1, 0, 0, 1, 3, 2] + [4] * 30, np.int32)                        # 36 nodes: two words
    bits = np.full((36, 3), 0xDEADBEEF, np.uint32)                                       # a third word past the tree
    (got,), (want,) = both(lambda b: kn.enqueue_visibility_bits(cuda.to_device(parents), b),
                           lambda b: ref.enqueue_visibility_bits(parents, b), bits)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(want[:, :2], ref.visibility_bits(parents))
    assert (want[:, 2] == 0).all()


def _within(got, want, bound, untouched=None, before=None):
    assert np.all(np.abs(got.astype(np.float64) - want) <= bound), np.max(np.abs(got - want) - bound)
    if untouched is not None:
        np.testing.assert_array_equal(untouched, before)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("accumulate", [False, True])
def test_linear(rng, precision, accumulate):
    R, n, K, N = 7, 5, 80, 24
    x = rng.standard_normal((R, K)).astype(np.float32)
    w = to_bf16_bits(rng.standard_normal((N, K)).astype(np.float32) * 0.5)
    out = rng.standard_normal((R, N)).astype(np.float32)
    n_rows = np.array([n], np.int32)
    (got,), (want,) = both(lambda o: kn.enqueue_linear(cuda.to_device(x), cuda.to_device(w), o, cuda.to_device(n_rows),
                                                       precision=precision, accumulate=accumulate),
                           lambda o: ref.enqueue_linear(x, w, o, n_rows, precision=precision,
                                                               accumulate=accumulate), out)
    bound = accumulation_bound(x[:n], from_storage(w), precision)
    if accumulate:
        bound = bound + np.abs(want[:n]) * 2.0 ** -23
    _within(got[:n], want[:n], bound, got[n:], out[n:])
    np.testing.assert_array_equal(want[n:], out[n:])


def test_linear_heads(rng):
    R, n, Z, K, N, s = 6, 4, 3, 32, 16, 40
    x = rng.standard_normal((R, Z * s)).astype(np.float32)
    w = to_bf16_bits(rng.standard_normal((Z, N, K)).astype(np.float32))
    out = np.full((R, Z * N), np.nan, np.float32)
    n_rows = np.array([n], np.int32)
    (got,), (want,) = both(lambda o: kn.enqueue_linear_heads(cuda.to_device(x), s, cuda.to_device(w), o,
                                                             cuda.to_device(n_rows), precision="bf16"),
                           lambda o: ref.enqueue_linear_heads(x, s, w, o, n_rows, precision="bf16"), out)
    for z in range(Z):
        cols = slice(z * N, (z + 1) * N)
        bound = accumulation_bound(x[:n, z * s:z * s + K], from_storage(w[z]), "bf16")
        _within(got[:n, cols], want[:n, cols], bound)
    assert np.isnan(got[n:]).all() and np.isnan(want[n:]).all()


def test_swiglu_mlp(rng):
    """fp32 precision (bf16 splits: each GEMM within 1e-4 relative of float32), the residual
    accumulated: the kernel's activation and output against the twin's."""
    R, n, M, I = 6, 4, 48, 40
    x = rng.standard_normal((R, M)).astype(np.float32) * np.float32(0.3)
    g, u = (to_bf16_bits(rng.standard_normal((I, M)).astype(np.float32) * 0.2) for _ in range(2))
    d = to_bf16_bits(rng.standard_normal((M, I)).astype(np.float32) * 0.2)
    out, act = rng.standard_normal((R, M)).astype(np.float32), np.full((R, I), np.nan, np.float32)
    n_rows = np.array([n], np.int32)
    (got, got_act), (want, want_act) = both(
        lambda o, a: kn.enqueue_swiglu_mlp(cuda.to_device(x), *(cuda.to_device(m) for m in (g, u, d)), o, act=a,
                                           n_rows=cuda.to_device(n_rows), precision="fp32", accumulate=True),
        lambda o, a: ref.enqueue_swiglu_mlp(x, g, u, d, o, act=a, n_rows=n_rows, precision="fp32",
                                                accumulate=True), out, act)
    scale = np.abs(want[:n] - out[:n]).max()
    assert np.abs(got_act[:n] - want_act[:n]).max() <= 1e-4 * np.abs(want_act[:n]).max()
    assert np.abs(got[:n] - want[:n]).max() <= 1e-4 * scale
    np.testing.assert_array_equal(got[n:], out[n:])
    np.testing.assert_array_equal(want[n:], out[n:])
    assert np.isnan(got_act[n:]).all() and np.isnan(want_act[n:]).all()


def _pool(rng, total):
    """A PoolRows layout over ``total`` batch rows (three sequences, slots out of order, the last
    row in no sequence), for the kernel (device seqs) and the twin (numpy seqs)."""
    seqs = np.array([(2, 3, 0, 2), (4, 1, 3, 0), (0, 2, 4, 3)], np.int32)   # (s0, t, row0, slot); row 6: none
    assert total == 7
    return kn.PoolRows(cuda.to_device(seqs), 2 * 9, 9), kn.PoolRows(seqs, 2 * 9, 9), 4 * 2 * 9


@pytest.mark.parametrize("placement", ["row0", "pool"])
def test_rms_norm(rng, placement):
    """Two norms of one wide buffer in one launch (the second from column 6), placed after a cache
    length or into a pool's slots: the twin's bits, and only the placed rows written."""
    R, n, M, M1 = 7, 7, 6, 5
    x = rng.standard_normal((R, 14)).astype(np.float32)
    w, w1 = rng.standard_normal(M).astype(np.float32), rng.standard_normal(M1).astype(np.float32)
    if placement == "pool":
        dev_rows, host_rows, S = _pool(rng, R)
    else:
        dev_rows, host_rows, S = cuda.to_device(np.array([3], np.int32)), np.array([3], np.int32), 12
    out, out1 = np.full((S, M + 2), np.nan, np.float32), np.full((S, M1), np.nan, np.float32)
    n_rows = np.array([n], np.int32)
    (got, got1), (want, want1) = both(
        lambda o, o1: kn.enqueue_rms_norm(cuda.to_device(x), cuda.to_device(w), 1e-5, o, cuda.to_device(n_rows),
                                          out_row0=dev_rows, second=(cuda.to_device(w1), o1, 6, dev_rows)),
        lambda o, o1: ref.enqueue_rms_norm(x, w, 1e-5, o, n_rows, out_row0=host_rows, second=(w1, o1, 6, host_rows)),
        out, out1)
    for g, wt in ((got, want), (got1, want1)):                 # the kernel sums x^2 in a tree: 1e-5, as
        np.testing.assert_array_equal(np.isnan(g), np.isnan(wt))   # the launcher's twin test; NaNs
        live = ~np.isnan(wt)                                         # (rows and columns not written) alike
        assert np.abs(g[live] - wt[live]).max() <= 1e-5 * np.abs(wt[live]).max()
    assert np.isnan(want[:, M:]).all()
    assert (~np.isnan(want[:, 0])).sum() == (n if placement == "row0" else 6)   # the pool's spare row: nowhere


@pytest.mark.parametrize("placement", ["row0", "pool"])
def test_rope(rng, placement):
    """MLA's two ropes in one launch: k_pe from a kv buffer into cache rows (after a cache length,
    or into a pool's slots) and q_pe of 3 heads from strided query columns into a packed buffer,
    in place for the second job too; the twin's values within a few float32 ulps (the kernel fuses
    the rotation's multiply-adds, ``rope._rotate``; the twin rounds each product), the same rows and
    columns written."""
    R, n, C, Rd, H, D = 7, 7, 5, 4, 3, 6
    kv = rng.standard_normal((R, C + Rd)).astype(np.float32)
    q = rng.standard_normal((R, H * (D + Rd))).astype(np.float32)
    pos = rng.integers(0, 60, R).astype(np.int32)
    inv = 1.0 / 10000.0 ** (np.arange(0, Rd, 2) / Rd)
    if placement == "pool":
        dev_rows, host_rows, S = _pool(rng, R)
    else:
        dev_rows, host_rows, S = cuda.to_device(np.array([2], np.int32)), np.array([2], np.int32), 10
    cache = np.full((S, Rd), np.nan, np.float32)
    n_rows = np.array([n], np.int32)
    query = dict(groups=H, src_col0=D, src_stride=D + Rd, dst_col0=D, dst_stride=D + Rd)    # q_pe in place
    (got_k, got_q), (want_k, want_q) = both(
        lambda k, qq: kn.enqueue_rope(cuda.to_device(kv), k, cuda.to_device(pos), cuda.to_device(inv),
                                      cuda.to_device(n_rows), rdim=Rd, interleave=True, src_col0=C,
                                      attention_factor=0.75, dst_row0=dev_rows, second=dict(src=qq, dst=qq, **query)),
        lambda k, qq: ref.enqueue_rope(kv, k, pos, inv, n_rows, rdim=Rd, interleave=True, src_col0=C,
                                       attention_factor=0.75, dst_row0=host_rows, second=dict(src=qq, dst=qq, **query)),
        cache, q)
    for g, wt in ((got_k, want_k), (got_q, want_q)):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(wt))   # the same rows and columns written
        live = ~np.isnan(wt)
        assert np.abs(g[live] - wt[live]).max() <= 1e-6 * np.abs(wt[live]).max()
    np.testing.assert_array_equal(want_q[:, :D], q[:, :D])       # the non-rope columns untouched
    np.testing.assert_array_equal(got_q[:, :D], q[:, :D])
    assert not np.array_equal(want_q[:, D:D + Rd], q[:, D:D + Rd])


def test_qkv_norm_rope(rng):
    """A DFlash layer's fused per-head norm + RoPE (3 block rows, 2 of 4 context rows new): the
    twin's cache rows and in-place heads within 1e-5 relative (the norm's tree sum); values,
    untouched columns and unwritten cache rows exactly."""
    hq, hkv, dh, nb, nf, n, s0, cap = 4, 2, 10, 3, 4, 2, 5, 10
    inv_freq = ref.rope_inv_freq(dh, 10000.0)
    qkv = rng.standard_normal((nb + nf, (hq + 2 * hkv) * dh)).astype(np.float32)
    wq, wk = (rng.standard_normal(dh).astype(np.float32) for _ in range(2))
    meta = np.array([s0, n, s0 + n, nb], np.int32)
    caches = [np.full((cap, hkv * dh), -7.0, np.float32) for _ in range(2)]
    args = dict(n_q_heads=hq, n_kv_heads=hkv, interleave=False)
    (got, got_k, got_v), (want, want_k, want_v) = both(
        lambda x, k, v: kn.enqueue_qkv_norm_rope(x, cuda.to_device(meta), cuda.to_device(wq), cuda.to_device(wk), 1e-6,
                                                 cuda.to_device(inv_freq), k_cache=k, v_cache=v, **args),
        lambda x, k, v: ref.enqueue_qkv_norm_rope(x, meta, wq, wk, 1e-6, inv_freq, k_cache=k, v_cache=v, **args),
        qkv, *caches)
    normed = (hq + hkv) * dh
    for g, w in ((got[:nb, :normed], want[:nb, :normed]), (got_k, want_k)):
        assert np.abs(g - w).max() <= 1e-5 * np.abs(w).max()
    np.testing.assert_array_equal(got[:, normed:], want[:, normed:])        # the values stay
    np.testing.assert_array_equal(got[nb:], qkv[nb:])                       # context rows untouched
    np.testing.assert_array_equal(want[nb:], qkv[nb:])
    np.testing.assert_array_equal(got_v, want_v)
    np.testing.assert_array_equal(want_v[s0:s0 + n], qkv[nb:nb + n, normed:])
    assert (want_k[:s0] == -7).all() and (want_k[s0 + n:] == -7).all()


@pytest.mark.parametrize("block,masked", [(True, False), (True, True), (False, True)])
def test_gqa_attention(rng, block, masked):
    """The drafter's attention (4 query heads over 2 key/value heads): context keys, then the
    block's own (or none), under a mask (or none); the twin within 1e-5 relative (as the
    launcher's), rows past t untouched."""
    from ddtree_numba.kernels import GQAScratch
    tq, t, s, s_cap, hq, hkv, dh = 5, 4, 6, 9, 4, 2, 8
    q = rng.standard_normal((tq, hq * dh)).astype(np.float32)
    kc, vc = (rng.standard_normal((s_cap, hkv * dh)).astype(np.float32) for _ in range(2))
    kb, vb = (rng.standard_normal((tq, hkv * dh)).astype(np.float32) for _ in range(2))
    mask = rng.random((tq, s_cap + tq)) < 0.7
    mask[:, 0] = True                                            # every query sees a key
    meta, scratch = np.array([s, t], np.int32), GQAScratch(tq, hq, dh, s_cap + tq)
    args = dict(scale=0.3, scratch=scratch)
    dev = dict(k_blk=cuda.to_device(kb), v_blk=cuda.to_device(vb)) if block else {}
    host = dict(k_blk=kb, v_blk=vb) if block else {}
    out = np.full((tq, hq * dh), -3.0, np.float32)
    (got,), (want,) = both(
        lambda o: kn.enqueue_gqa_attention(cuda.to_device(q), cuda.to_device(kc), cuda.to_device(vc), o,
                                           meta=cuda.to_device(meta), mask=cuda.to_device(mask) if masked else None,
                                           **dev, **args),
        lambda o: ref.enqueue_gqa_attention(q, kc, vc, o, meta=meta, mask=mask if masked else None, **host, **args),
        out)
    assert np.abs(got[:t] - want[:t]).max() <= 1e-5 * np.abs(want[:t]).max()
    np.testing.assert_array_equal(got[t:], out[t:])
    np.testing.assert_array_equal(want[t:], out[t:])


def test_mla_attention_twin_is_the_absorbed_attention():
    """The MLA device tier's twin (it reads visibility as packed bits) against the absorbed
    attention's own steps: scores from the latent and rope parts, ``mla_mask`` of the tree's
    parents, the chunked softmax (``chunked_attention``); float32 there, so within 1e-5."""
    rng = np.random.default_rng(3)
    h, c, r, s0, t = 3, 8, 4, 40, 37                              # 37 new rows: two words of bits
    parents = np.concatenate([[-1], rng.integers(0, np.arange(1, t))]).astype(np.int32)
    q_lat, q_pe = (rng.standard_normal((t, h * d)).astype(np.float32) for d in (c, r))
    c_kv, k_pe = rng.standard_normal((s0 + t, c)).astype(np.float32), rng.standard_normal((s0 + t, r)).astype(np.float32)
    out = np.full((t, h * c), np.nan, np.float32)
    ref.enqueue_mla_attention(q_lat, q_pe, c_kv, k_pe, out, vis_bits=ref.visibility_bits(parents),
                              meta=np.array([s0, t], np.int32), scale=0.4)
    scores = (np.einsum("thc,sc->ths", q_lat.reshape(t, h, c), c_kv, dtype=np.float32)
              + np.einsum("thr,sr->ths", q_pe.reshape(t, h, r), k_pe, dtype=np.float32)) * np.float32(0.4)
    want = ref.chunked_attention(scores, ref.mla_mask(s0, t, parents), c_kv, 16).reshape(t, h * c)
    assert np.abs(out - want).max() <= 1e-5 * np.abs(want).max()
