"""RMSNorm, RoPE, embedding and lm_head kernels against their numpy twins, and the enqueue API the
GPU forward calls (row offsets, column strides, live rows < buffer rows, in place)."""

import numpy as np
import pytest
from numba import cuda

from ddtree_numba import kernels as kn
from ddtree_numba import reference as ref
from ddtree_numba.kernels import enqueue_embedding, enqueue_rms_norm, enqueue_rope

pytestmark = pytest.mark.kernels

POISON = np.float32(-12345.0)


def assert_rel(got, want, tol=1e-5):
    """max |got - want| <= tol * max |want| (a relative error over the whole array)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    scale = max(float(np.abs(want).max(initial=0.0)), 1e-30)
    err = float(np.abs(got.astype(np.float64) - want).max(initial=0.0))
    assert err <= tol * scale, f"relative error {err / scale:.3g} > {tol}"


def i32(*values):
    return cuda.to_device(np.array(values, np.int32))


def widen(w):
    """The float32 values a kernel sees for stored weights (uint16 = bfloat16 bits)."""
    if w.dtype == np.uint16:
        return (w.astype(np.uint32) << 16).view(np.float32)
    return w.astype(np.float32)


def stored(rng, shape, kind):
    w = rng.standard_normal(shape).astype(np.float32)
    if kind == "f32":
        return w
    if kind == "f16":
        return w.astype(np.float16)
    return (w.view(np.uint32) >> 16).astype(np.uint16)        # bf16 by truncation


def yarn(rdim=12):
    inv = ref.yarn_inv_freq(rdim, 10000.0, 40.0, 4096, beta_fast=32.0, beta_slow=1.0)
    return inv, ref.yarn_attention_factor(40.0, 1.0, 0.707)


# -- RMSNorm --------------------------------------------------------------------------------

@pytest.mark.parametrize("t, m", [(1, 5), (7, 33), (3, 100)])
def test_rms_norm_matches_twin(rng, t, m):
    x = (rng.standard_normal((t, m)) * rng.uniform(0.1, 10, (t, 1))).astype(np.float32)
    w = rng.standard_normal(m).astype(np.float32)
    got = kn.rms_norm(x, w, 1e-6)
    assert isinstance(got, np.ndarray)
    assert_rel(got, ref.rms_norm(x, w, 1e-6))
    d = kn.rms_norm(cuda.to_device(x), cuda.to_device(w), 1e-6)       # device in, device out
    assert not isinstance(d, np.ndarray)
    np.testing.assert_array_equal(d.copy_to_host(), got)


@pytest.mark.parametrize("threads", [64, 256])
def test_rms_norm_reduction_by_warps_has_the_trees_bits(rng, monkeypatch, threads):
    """``_inv_rms``'s GPU branch (warp 0 pairs the partials as the tree's levels of stride >= 32
    pair them, then xor shuffles of 16 .. 1) against the shared-memory tree at the same block size:
    the same bits. In emulated warps (tests/warp_emulation.py), or on a GPU both compiled (the
    tree's kernel built with ``WARP_OPS`` off); rows whose squares span many magnitudes, so that
    another pairing would round differently."""
    import importlib

    from conftest import REAL_GPU
    from warp_emulation import gpu_branch
    rn = importlib.import_module("ddtree_numba.kernels.rms_norm")
    monkeypatch.setattr(rn, "THREADS", threads)
    x = (rng.standard_normal((6, 700)) * np.exp(rng.uniform(-6, 6, (6, 700)))).astype(np.float32)
    w = rng.standard_normal(700).astype(np.float32)

    def norm(warp_ops):
        monkeypatch.setattr(rn, "WARP_OPS", warp_ops)
        rn._rms_norm_kernel.cache_clear()
        try:
            return kn.rms_norm(x, w, 1e-6)
        finally:
            rn._rms_norm_kernel.cache_clear()

    if REAL_GPU:
        tree, warps = norm(False), norm(True)
    else:
        tree = norm(False)
        with gpu_branch(monkeypatch, rn, "_rms_norm_kernel"):
            warps = kn.rms_norm(x, w, 1e-6)
    np.testing.assert_array_equal(warps.view(np.uint32), tree.view(np.uint32))


def test_rms_norm_enqueue_offsets_wide_input_and_live_rows(rng):
    m, n, R = 10, 4, 6
    x = rng.standard_normal((R, m + 3)).astype(np.float32)             # a [T, C+R]-style buffer
    w = rng.standard_normal(m).astype(np.float32)
    out0 = np.full((12, m + 2), POISON, np.float32)                    # wider than M, poisoned
    d_out = cuda.to_device(out0)
    enqueue_rms_norm(cuda.to_device(x), cuda.to_device(w), 1e-5, d_out, i32(n), out_row0=i32(5))
    got = d_out.copy_to_host()
    want = out0.copy()
    want[5:5 + n, :m] = ref.rms_norm(x[:n, :m], w, 1e-5)
    assert_rel(got[5:5 + n, :m], want[5:5 + n, :m])
    got[5:5 + n, :m] = want[5:5 + n, :m]
    np.testing.assert_array_equal(got, want)                           # everything else untouched
    # batch invariance: the same row alone, and without an offset, gives the same bits
    d_one = cuda.to_device(np.full((R, m), POISON, np.float32))
    enqueue_rms_norm(cuda.to_device(x[2:]), cuda.to_device(w), 1e-5, d_one, i32(1))
    np.testing.assert_array_equal(d_one.copy_to_host()[0], d_out.copy_to_host()[7, :m])


def test_two_norms_of_one_buffer_in_one_launch_give_each_norm_alone(rng):
    """``second=``: MLA's q_a and kv latents, side by side in one buffer, normed in one launch
    (the second from its column offset into rows after a cache offset): each equals its own
    launch bit for bit, and nothing else is written."""
    q, c, r, n, R = 6, 5, 3, 3, 4
    x = rng.standard_normal((R, q + c + r)).astype(np.float32)        # [T, Q + C + R]
    wq, wc = (rng.standard_normal(k).astype(np.float32) for k in (q, c))
    dx = cuda.to_device(x)
    out_q, out_c = np.full((R, q), POISON, np.float32), np.full((9, c), POISON, np.float32)
    dq, dc = cuda.to_device(out_q), cuda.to_device(out_c)
    enqueue_rms_norm(dx, cuda.to_device(wq), 1e-6, dq, i32(n), second=(cuda.to_device(wc), dc, q, i32(4)))
    alone_q, alone_c = cuda.to_device(out_q), cuda.to_device(np.full((R, c), POISON, np.float32))
    enqueue_rms_norm(dx, cuda.to_device(wq), 1e-6, alone_q, i32(n))
    enqueue_rms_norm(cuda.to_device(np.ascontiguousarray(x[:, q:q + c])), cuda.to_device(wc), 1e-6, alone_c, i32(n))
    want_q, want_c = alone_q.copy_to_host(), out_c.copy()
    want_c[4:4 + n] = alone_c.copy_to_host()[:n]
    np.testing.assert_array_equal(dq.copy_to_host(), want_q)
    np.testing.assert_array_equal(dc.copy_to_host(), want_c)
    assert_rel(want_c[4:4 + n], ref.rms_norm(x[:n, q:q + c], wc, 1e-6))


def test_qkv_norm_rope_is_each_heads_norm_then_rope(rng):
    """A DFlash layer's fused q / k norm + RoPE over one stacked q | k | v projection (block rows,
    then new context rows): the block's q and k heads equal ``enqueue_rms_norm`` over a per-head
    view then ``enqueue_rope`` bit for bit, in place, its v untouched; a context row's key lands
    normed and rotated in the cache row s0 + c and its value copied there; nothing else written.
    And all of it within rounding of the twin, ``reference.rms_norm.head_norm_rope``."""
    # dh / 2 odd: a rotated pair's two values are staged by different threads, in the simulator too
    hq, hkv, dh, nb, nf, n, s0, cap, eps = 4, 2, 10, 3, 4, 2, 5, 10, 1e-6
    inv_freq = ref.rope_inv_freq(dh, 10000.0)
    qkv = rng.standard_normal((nb + nf, (hq + 2 * hkv) * dh)).astype(np.float32)
    wq, wk = (rng.standard_normal(dh).astype(np.float32) for _ in range(2))
    k_cache = np.full((cap, hkv * dh), POISON, np.float32)
    v_cache = np.full((cap, hkv * dh), POISON, np.float32)
    d_qkv, d_k, d_v = cuda.to_device(qkv), cuda.to_device(k_cache), cuda.to_device(v_cache)
    meta = i32(s0, n, s0 + n, nb, nb - 1, nb + n)
    kn.enqueue_qkv_norm_rope(d_qkv, meta, cuda.to_device(wq), cuda.to_device(wk), eps, cuda.to_device(inv_freq),
                             n_q_heads=hq, n_kv_heads=hkv, interleave=False, k_cache=d_k, v_cache=d_v)
    got, got_k, got_v = d_qkv.copy_to_host(), d_k.copy_to_host(), d_v.copy_to_host()

    def alone(x, w, heads, positions):          # the two launches the fused one replaces
        rows = x.shape[0]
        d = cuda.to_device(np.ascontiguousarray(x))
        enqueue_rms_norm(d.reshape(rows * heads, dh), cuda.to_device(w), eps, d.reshape(rows * heads, dh),
                         i32(rows * heads))
        enqueue_rope(d, d, cuda.to_device(np.asarray(positions, np.int32)), cuda.to_device(inv_freq), i32(rows),
                     rdim=dh, interleave=False, groups=heads, src_stride=dh, dst_stride=dh)
        return d.copy_to_host()

    nq, nk = hq * dh, hkv * dh
    blk_pos, ctx_pos = np.arange(s0 + n, s0 + n + nb), np.arange(s0, s0 + n)
    want = qkv.copy()
    want[:nb, :nq] = alone(qkv[:nb, :nq], wq, hq, blk_pos)
    want[:nb, nq:nq + nk] = alone(qkv[:nb, nq:nq + nk], wk, hkv, blk_pos)
    want_k, want_v = k_cache.copy(), v_cache.copy()
    want_k[s0:s0 + n] = alone(qkv[nb:nb + n, nq:nq + nk], wk, hkv, ctx_pos)
    want_v[s0:s0 + n] = qkv[nb:nb + n, nq + nk:]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_k, want_k)
    np.testing.assert_array_equal(got_v, want_v)

    def twin(x, w, heads, positions):
        cos, sin = ref.rope_cos_sin(positions, inv_freq)
        return ref.head_norm_rope(x.reshape(-1, heads, dh), w, eps, cos, sin, interleave=False).reshape(x.shape)
    assert_rel(got[:nb, :nq], twin(qkv[:nb, :nq], wq, hq, blk_pos))
    assert_rel(got_k[s0:s0 + n], twin(qkv[nb:nb + n, nq:nq + nk], wk, hkv, ctx_pos))
    big = cuda.to_device(np.ones(300, np.float32))               # a head past MAX_HEAD_DIM (256)
    with pytest.raises(ValueError, match="MAX_HEAD_DIM"):
        kn.enqueue_qkv_norm_rope(d_qkv, meta, big, big, eps, cuda.to_device(inv_freq), n_q_heads=hq,
                                 n_kv_heads=hkv, interleave=False, k_cache=d_k, v_cache=d_v)


# -- RoPE -----------------------------------------------------------------------------------

@pytest.mark.parametrize("freqs", ["default", "yarn"])
def test_rope_cos_sin_matches_twin(rng, freqs):
    inv, af = (ref.rope_inv_freq(12, 10000.0), 1.0) if freqs == "default" else yarn()
    positions = rng.integers(0, 5000, 9).astype(np.int64)
    cos, sin = kn.rope_cos_sin(positions, inv, af)
    want_cos, want_sin = ref.rope_cos_sin(positions, inv, af)
    assert_rel(cos, want_cos, 1e-6)
    assert_rel(sin, want_sin, 1e-6)
    c32, _ = kn.rope_cos_sin(positions.astype(np.int32), inv, af)
    np.testing.assert_array_equal(c32, cos)


@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize("shape", [(5, 8), (3, 4, 12), (2, 3, 2, 6)])
def test_rope_matches_twin(rng, interleave, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    positions = rng.integers(0, 3000, shape[0])
    inv, af = yarn()
    inv = inv[: shape[-1] // 2] if shape[-1] // 2 <= inv.shape[0] else ref.rope_inv_freq(shape[-1], 10000.0)
    cos, sin = ref.rope_cos_sin(positions, inv, af)
    got = kn.rope(x, cos, sin, interleave)
    want = ref.rope(x, cos, sin, interleave)
    assert_rel(got, want)
    assert not np.array_equal(got, x)
    d_x = cuda.to_device(x)                                            # in place on the device
    kn.rope(d_x, cuda.to_device(cos), cuda.to_device(sin), interleave, out=d_x)
    np.testing.assert_array_equal(d_x.copy_to_host(), got)


def test_rope_layouts_differ(rng):
    x = rng.standard_normal((3, 8)).astype(np.float32)
    cos, sin = ref.rope_cos_sin(np.arange(1, 4), ref.rope_inv_freq(8, 10000.0))
    assert not np.allclose(kn.rope(x, cos, sin, True), kn.rope(x, cos, sin, False))


@pytest.mark.parametrize("interleave, Rd", [(True, 12), (False, 12), (True, 24)])
def test_enqueue_rope_q_heads_into_contiguous_buffer(rng, interleave, Rd):
    # Rd 24: more pairs (12) than the simulator's 8 threads, so a thread's second angle and pair
    # are exercised too
    T, H, D, n = 5, 3, 3, 4
    q = rng.standard_normal((T, H * (D + Rd))).astype(np.float32)     # heads of [nope | rope]
    positions = rng.integers(0, 4000, T).astype(np.int32)
    inv, af = yarn(Rd)
    dst0 = np.full((T + 2, H * Rd), POISON, np.float32)
    d_dst = cuda.to_device(dst0)
    enqueue_rope(cuda.to_device(q), d_dst, cuda.to_device(positions), cuda.to_device(inv), i32(n), rdim=Rd,
                 groups=H, src_col0=D, src_stride=D + Rd, dst_stride=Rd, attention_factor=af, interleave=interleave)
    got = d_dst.copy_to_host()
    cos, sin = ref.rope_cos_sin(positions[:n], inv, af)
    want = ref.rope(q[:n].reshape(n, H, D + Rd)[:, :, D:], cos, sin, interleave).reshape(n, H * Rd)
    assert_rel(got[:n], want)
    np.testing.assert_array_equal(got[n:], dst0[n:])                   # rows past n untouched
    # the same bits as the public rope on the kernel's own cos / sin
    kc, ks = kn.rope_cos_sin(positions[:n], inv, af)
    np.testing.assert_array_equal(
        got[:n], kn.rope(np.ascontiguousarray(q[:n].reshape(n, H, D + Rd)[:, :, D:]), kc, ks,
                         interleave).reshape(n, H * Rd))


@pytest.mark.parametrize("interleave", [True, False])
def test_enqueue_rope_k_pe_into_cache_rows(rng, interleave):
    T, C, Rd, n, s0 = 6, 5, 8, 3, 4
    kv = rng.standard_normal((T, C + Rd)).astype(np.float32)          # [c_kv | k_pe]
    positions = (s0 + np.arange(T)).astype(np.int32)
    inv = ref.rope_inv_freq(Rd, 10000.0)
    cache0 = np.full((10, Rd), POISON, np.float32)
    d_cache = cuda.to_device(cache0)
    enqueue_rope(cuda.to_device(kv), d_cache, cuda.to_device(positions), cuda.to_device(inv), i32(n), rdim=Rd,
                 src_col0=C, interleave=interleave, dst_row0=i32(s0))
    got = d_cache.copy_to_host()
    cos, sin = ref.rope_cos_sin(positions[:n], inv)
    assert_rel(got[s0:s0 + n], ref.rope(kv[:n, C:], cos, sin, interleave))
    np.testing.assert_array_equal(got[:s0], cache0[:s0])
    np.testing.assert_array_equal(got[s0 + n:], cache0[s0 + n:])


def test_two_ropes_in_one_launch_give_each_rope_alone(rng):
    """``second=``: MLA's rope key (into cache rows after s0) and every head's rope query, at the
    same positions, in one launch: each equals its own launch bit for bit; nothing else written."""
    T, H, D, C, Rd, n, s0 = 5, 3, 2, 4, 12, 3, 2
    kv = rng.standard_normal((T, C + Rd)).astype(np.float32)            # [c_kv | k_pe]
    q = rng.standard_normal((T, H * (D + Rd))).astype(np.float32)      # heads of [nope | rope]
    positions = (s0 + np.arange(T)).astype(np.int32)
    inv, af = yarn()
    d_kv, d_q, d_pos, d_inv = (cuda.to_device(a) for a in (kv, q, positions, inv))
    cache0, qpe0 = np.full((9, Rd), POISON, np.float32), np.full((T, H * Rd), POISON, np.float32)
    outs = []
    for paired in (True, False):
        d_cache, d_qpe = cuda.to_device(cache0), cuda.to_device(qpe0)
        key = dict(rdim=Rd, src_col0=C, dst_row0=i32(s0), attention_factor=af, interleave=True)
        query = dict(groups=H, src_col0=D, src_stride=D + Rd, dst_stride=Rd)
        if paired:
            enqueue_rope(d_kv, d_cache, d_pos, d_inv, i32(n), **key, second=dict(src=d_q, dst=d_qpe, **query))
        else:
            enqueue_rope(d_kv, d_cache, d_pos, d_inv, i32(n), **key)
            enqueue_rope(d_q, d_qpe, d_pos, d_inv, i32(n), rdim=Rd, attention_factor=af, interleave=True, **query)
        outs.append((d_cache.copy_to_host(), d_qpe.copy_to_host()))
    for got, alone in zip(*outs):
        np.testing.assert_array_equal(got, alone)
    cache, qpe = outs[0]
    np.testing.assert_array_equal(cache[:s0], cache0[:s0])
    np.testing.assert_array_equal(cache[s0 + n:], cache0[s0 + n:])
    np.testing.assert_array_equal(qpe[n:], qpe0[n:])
    cos, sin = ref.rope_cos_sin(positions[:n], inv, af)
    assert_rel(qpe[:n], ref.rope(q[:n].reshape(n, H, D + Rd)[:, :, D:], cos, sin, True).reshape(n, H * Rd))
    with pytest.raises(ValueError, match="second takes"):
        enqueue_rope(d_kv, cuda.to_device(cache0), d_pos, d_inv, i32(n), **key, second=dict(src=d_q, dst=d_q, group=2))


def test_pool_rows_write_each_sequence_into_its_slot_and_layer(rng):
    """``kernels.PoolRows``: a batch's rows (three sequences, slots out of order, other cache
    lengths) normed and rotated straight into a flattened [slots, L, S, W] pool, layer 1 of 2, in
    one launch each: every row lands where its own sequence's launch (``out_row0`` / ``dst_row0``
    = its cache length, into its slot's layer) puts it, with the same bits, and nothing else of
    the pool is written."""
    slots, L, S, C, Rd = 4, 2, 9, 5, 4
    layout = [(3, 2, 2), (1, 4, 0), (2, 3, 3)]          # (t, s0, slot) a sequence
    total = sum(t for t, _, _ in layout) + 1               # a spare row of no sequence at the end
    seqs, row0 = [], 0
    for t, s0, slot in layout:
        seqs.append((s0, t, row0, slot))
        row0 += t
    kv = rng.standard_normal((total, C + Rd)).astype(np.float32)
    w = rng.standard_normal(C).astype(np.float32)
    pos = rng.integers(0, 50, total).astype(np.int32)
    inv = 1.0 / 10000.0 ** (np.arange(0, Rd, 2) / Rd)
    n = i32(row0 + 1)                                       # the spare row is live too: it must go nowhere
    layer = 1
    rows = kn.PoolRows(cuda.to_device(np.array(seqs, np.int32)), L * S, layer * S)
    pool_c = cuda.to_device(np.full((slots * L * S, C), np.nan, np.float32))
    pool_k = cuda.to_device(np.full((slots * L * S, Rd), np.nan, np.float32))
    enqueue_rms_norm(cuda.to_device(kv), cuda.to_device(w), 1e-5, pool_c, n, out_row0=rows)
    enqueue_rope(cuda.to_device(kv), pool_k, cuda.to_device(pos), cuda.to_device(inv), n, rdim=Rd, src_col0=C,
                 interleave=True, dst_row0=rows)
    got_c = pool_c.copy_to_host().reshape(slots, L, S, C)
    got_k = pool_k.copy_to_host().reshape(slots, L, S, Rd)
    want_c = np.full_like(got_c, np.nan)
    want_k = np.full_like(got_k, np.nan)
    for s0, t, r0, slot in seqs:                           # each sequence's own launch into its own cache
        cache_c = cuda.to_device(np.full((S, C), np.nan, np.float32))
        cache_k = cuda.to_device(np.full((S, Rd), np.nan, np.float32))
        enqueue_rms_norm(cuda.to_device(kv[r0:r0 + t]), cuda.to_device(w), 1e-5, cache_c, i32(t), out_row0=i32(s0))
        enqueue_rope(cuda.to_device(kv[r0:r0 + t]), cache_k, cuda.to_device(pos[r0:r0 + t]), cuda.to_device(inv),
                     i32(t), rdim=Rd, src_col0=C, interleave=True, dst_row0=i32(s0))
        want_c[slot, layer] = cache_c.copy_to_host()
        want_k[slot, layer] = cache_k.copy_to_host()
    np.testing.assert_array_equal(got_c.view(np.uint32), want_c.view(np.uint32))
    np.testing.assert_array_equal(got_k.view(np.uint32), want_k.view(np.uint32))
    assert np.isfinite(got_c[2, 1, 2:5]).all() and np.isnan(got_c[1]).all()   # slot 2's rows, slot 1 idle


@pytest.mark.parametrize("interleave", [True, False])
def test_enqueue_rope_in_place(rng, interleave):
    T, H, D, Rd, n = 4, 2, 2, 6, 3
    q = rng.standard_normal((T, H * (D + Rd))).astype(np.float32)
    positions = rng.integers(0, 100, T).astype(np.int32)
    inv, af = yarn()
    inv = inv[: Rd // 2]
    d_q = cuda.to_device(q)
    enqueue_rope(d_q, d_q, cuda.to_device(positions), cuda.to_device(inv), i32(n), rdim=Rd, groups=H,
                 src_col0=D, src_stride=D + Rd, dst_col0=D, dst_stride=D + Rd, attention_factor=af,
                 interleave=interleave)
    got = d_q.copy_to_host().reshape(T, H, D + Rd)
    q3 = q.reshape(T, H, D + Rd)
    cos, sin = ref.rope_cos_sin(positions[:n], inv, af)
    assert_rel(got[:n, :, D:], ref.rope(q3[:n, :, D:], cos, sin, interleave))
    np.testing.assert_array_equal(got[:n, :, :D], q3[:n, :, :D])       # the nope part untouched
    np.testing.assert_array_equal(got[n:], q3[n:])


# -- embedding and lm_head --------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["f32", "f16", "bf16"])
def test_embedding_matches_twin(rng, kind):
    table = stored(rng, (11, 13), kind)
    ids = rng.integers(0, 11, 7)
    for ids_ in (ids.astype(np.int32), ids.astype(np.int64)):
        got = kn.embedding(ids_, table)
        np.testing.assert_array_equal(got, ref.embedding(ids_, widen(table)))
    d = kn.embedding(cuda.to_device(ids.astype(np.int32)), cuda.to_device(table))
    np.testing.assert_array_equal(d.copy_to_host(), got)


@pytest.mark.parametrize("kind", ["f32", "bf16"])
def test_enqueue_embedding_live_rows(rng, kind):
    table = stored(rng, (9, 6), kind)
    ids = np.array([3, 0, 8, 3, 5], np.int32)
    out0 = np.full((7, 6), POISON, np.float32)
    d_out = cuda.to_device(out0)
    enqueue_embedding(cuda.to_device(ids), cuda.to_device(table), d_out, i32(3))
    got = d_out.copy_to_host()
    np.testing.assert_array_equal(got[:3], widen(table)[ids[:3]])
    np.testing.assert_array_equal(got[3:], out0[3:])
    bad = cuda.to_device(np.full((1, 6), POISON, np.float32))         # a bad id on the device
    enqueue_embedding(cuda.to_device(np.array([9], np.int32)), cuda.to_device(table), bad, i32(1))
    assert np.isnan(bad.copy_to_host()).all()


@pytest.mark.parametrize("kind", ["f32", "f16", "bf16"])
def test_lm_head_matches_twin(rng, kind):
    x = rng.standard_normal((5, 70)).astype(np.float32)               # K off the chunk size
    w = stored(rng, (19, 70), kind)
    got = kn.lm_head(x, w)
    assert_rel(got, ref.lm_head(x, widen(w)))
    np.testing.assert_array_equal(kn.lm_head(x[2:3], w), got[2:3])     # alone == in the batch


# -- bad input --------------------------------------------------------------------------------

def test_bad_input_raises_value_errors(rng):
    x = rng.standard_normal((3, 8)).astype(np.float32)
    cos, sin = ref.rope_cos_sin(np.arange(3), ref.rope_inv_freq(8, 10000.0))
    cases = [
        (lambda: kn.rms_norm(x, np.ones(7, np.float32), 1e-6), "weight"),
        (lambda: kn.rms_norm(x.astype(np.float64), np.ones(8, np.float32), 1e-6), "x"),
        (lambda: kn.rms_norm(x, np.ones(8, np.float32), -1.0), "eps"),
        (lambda: kn.rope(x[:, :7], cos, sin, True), "even"),
        (lambda: kn.rope(x, cos[:2], sin, True), "cos"),
        (lambda: kn.rope(x, cos, sin, 1), "interleave"),
        (lambda: kn.rope(x[0], cos, sin, True), "2-D"),
        (lambda: kn.rope_cos_sin(np.arange(3.0), np.ones(4)), "positions"),
        (lambda: kn.rope_cos_sin(np.arange(3), np.ones(4), float("nan")), "attention_factor"),
        (lambda: kn.embedding(np.array([0, 8]), np.ones((8, 4), np.float32)), "outside the vocabulary"),
        (lambda: kn.embedding(np.array([-1]), np.ones((8, 4), np.float32)), "outside the vocabulary"),
        (lambda: kn.embedding(np.array([0]), np.ones((8, 4), np.float64)), "table"),
        (lambda: kn.lm_head(x, np.ones((5, 7), np.float32)), "input features"),
        (lambda: kn.lm_head(x, np.ones((5, 8), np.int8)), "weight must be"),
    ]
    for call, words in cases:
        with pytest.raises(ValueError, match=words):
            call()


def test_qkv_norm_rope_of_a_batch_gives_each_sequence_its_own_launchs_bits(rng):
    """A batch of drafts (meta [S, 4] = (s0, n, c0, B), a cache pool's layer [S, S_cap, W]): the S
    blocks first, then the context rows packed (c0 each, one sequence with none); each sequence's
    rows and cache rows the bits of its own launch; nothing else written; the twin agrees."""
    hq, hkv, dh, nb, cap, eps = 2, 1, 6, 3, 9, 1e-6
    inv_freq = ref.rope_inv_freq(dh, 10000.0)
    seqs = [(4, 2), (0, 0), (1, 3)]                         # (s0, n) a sequence
    S, width = len(seqs), (hq + 2 * hkv) * dh
    c0 = np.cumsum([0] + [n for _, n in seqs])[:-1]
    meta = np.array([[s0, n, c, nb] for (s0, n), c in zip(seqs, c0)], np.int32)
    qkv = rng.standard_normal((S * nb + sum(n for _, n in seqs) + 2, width)).astype(np.float32)
    wq, wk = (rng.standard_normal(dh).astype(np.float32) for _ in range(2))
    cache = np.full((S, cap, hkv * dh), POISON, np.float32)
    d_qkv, d_k, d_v = cuda.to_device(qkv), cuda.to_device(cache), cuda.to_device(cache)
    args = dict(n_q_heads=hq, n_kv_heads=hkv, interleave=False)
    kn.enqueue_qkv_norm_rope(d_qkv, cuda.to_device(meta), cuda.to_device(wq), cuda.to_device(wk), eps,
                             cuda.to_device(inv_freq), k_cache=d_k, v_cache=d_v, **args)
    got, got_k, got_v = d_qkv.copy_to_host(), d_k.copy_to_host(), d_v.copy_to_host()
    for z, (s0, n) in enumerate(seqs):                      # each sequence alone: block, then context rows
        rows = np.concatenate([np.arange(z * nb, (z + 1) * nb), S * nb + c0[z] + np.arange(n)])
        one = cuda.to_device(np.ascontiguousarray(qkv[rows]))
        k1, v1 = cuda.to_device(cache[z]), cuda.to_device(cache[z])
        kn.enqueue_qkv_norm_rope(one, i32(s0, n, s0 + n, nb), cuda.to_device(wq), cuda.to_device(wk), eps,
                                 cuda.to_device(inv_freq), k_cache=k1, v_cache=v1, **args)
        np.testing.assert_array_equal(got[rows].view(np.uint32), one.copy_to_host().view(np.uint32))
        np.testing.assert_array_equal(got_k[z].view(np.uint32), k1.copy_to_host().view(np.uint32))
        np.testing.assert_array_equal(got_v[z].view(np.uint32), v1.copy_to_host().view(np.uint32))
    np.testing.assert_array_equal(got[-2:], qkv[-2:])       # rows past every sequence's: untouched
    want, want_k, want_v = qkv.copy(), cache.copy(), cache.copy()
    ref.enqueue_qkv_norm_rope(want, meta, wq, wk, eps, inv_freq, k_cache=want_k, v_cache=want_v, **args)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_k, want_k, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got_v, want_v)
