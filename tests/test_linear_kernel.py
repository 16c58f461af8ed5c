"""kernels/linear.py: both GEMM kernels against the twin, against a numpy emulation of the
reduction contract bit for bit, and batch invariance (a row alone == the row in a batch).

In the simulator ``_device.fma`` is a float64 multiply-add rounded once to float32; on a GPU it
is a true fma. ``contract`` emulates whichever applies, so the bit-exact tests run on both.
"""

import importlib
import math

import numpy as np
import pytest
from numba import cuda

from conftest import REAL_GPU
from ddtree_numba import kernels as kn
from ddtree_numba import reference as ref

L = importlib.import_module("ddtree_numba.kernels.linear")
pytestmark = pytest.mark.kernels
MODE = "fma" if REAL_GPU else "sim"
KINDS = ("f32", "f16", "bf16")


# -- the contract, emulated in numpy ------------------------------------------------------------
def _fma_exact(p, c):
    """float32(p + c) rounded once, p and c float64 arrays (p an exact float32 product): the
    float64 sum rounded to odd, then to float32, is the correctly rounded float32 sum."""
    s = p + c
    b = s - p
    err = (p - (s - b)) + (c - b)                       # s + err == p + c exactly (TwoSum)
    even = (s.view(np.int64) & 1) == 0
    fix = (err != 0) & even
    s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def contract(x, w, mode=MODE):
    """x [R, K] f32, w [N, K] f32 -> [R, N] f32: KC-chunk fma chains from 0 in ascending k,
    chunk partials added in ascending order."""
    R, K = x.shape
    xd, wd = x.astype(np.float64), w.astype(np.float64)
    y = np.zeros((R, w.shape[0]), np.float32)
    for c0 in range(0, K, L.KC):
        acc = np.zeros_like(y)
        for k in range(c0, min(K, c0 + L.KC)):
            p = xd[:, k, None] * wd[None, :, k]          # exact in float64
            acc = (p + acc).astype(np.float32) if mode == "sim" else _fma_exact(p, acc.astype(np.float64))
        y = y + acc
    return y


def silu_mul(g, u):
    """g / (1 + exp(-g)) * u in float32 steps, exp in float64 rounded to float32 (the simulator's
    math.exp; a GPU's expf may differ in the last bit)."""
    e = np.vectorize(lambda v: math.exp(-float(v)), otypes=[np.float64])(g).astype(np.float32)
    return (g / (np.float32(1.0) + e)) * u


def weights(rng, shape, kind):
    """(stored, widened f32) weights of one kind; bf16 travels as uint16 bits."""
    w = (rng.standard_normal(shape) * 0.5).astype(np.float32)
    if kind == "f32":
        return w, w
    if kind == "f16":
        h = w.astype(np.float16)
        return h, h.astype(np.float32)
    b = (w.view(np.uint32) >> 16).astype(np.uint16)
    return b, (b.astype(np.uint32) << 16).view(np.float32)


def xs(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


def rows_dev(n):
    return cuda.to_device(np.array([n], np.int32))


def assert_bits(got, want):
    np.testing.assert_array_equal(got.view(np.uint32), np.asarray(want, np.float32).view(np.uint32))


def assert_twin(got, want):
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale)


def run_linear(x, w, n=None, cfg=None, accumulate=False, out=None):
    """enqueue_linear through _launch with an optional explicit tile; returns out [R, N]."""
    R, N = x.shape[0], w.shape[0]
    d_out = dev(np.full((R, N), np.nan, np.float32) if out is None else out)
    L._launch(dev(x), 0, dev(w[None]), None, d_out, 0, rows_dev(R if n is None else n), None, None,
              R, accumulate, 0, cfg)
    return d_out.copy_to_host()


def skinny(rb, tm, tn, gl, nw=2, sk=None, swiglu=False):
    """An explicit skinny tile (GPU runs use the module's own sizes)."""
    if REAL_GPU:
        return L._skinny_config(rb, "bf16", swiglu)
    return L._Skinny(rb, tm, tn, nw, sk or L._SKINNY_SK[rb], gl, 0)


# -- (a) against the twin ---------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("R,K,N", [(1, 200, 37), (3, 100, 20), (9, 130, 19), (7, 100, 12)])
def test_public_linear_matches_the_twin(rng, kind, R, K, N):
    x = xs(rng, (R, K))
    w, wf = weights(rng, (N, K), kind)
    y = kn.linear(x, w)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (R, N)
    assert_twin(y, ref.linear(x, wf))
    assert_bits(y, contract(x, wf))


def test_public_linear_device_in_device_out_and_out(rng):
    x = xs(rng, (2, 70))
    w, wf = weights(rng, (11, 70), "bf16")
    y = kn.linear(dev(x), dev(w))
    assert not isinstance(y, np.ndarray)
    assert_bits(y.copy_to_host(), contract(x, wf))
    out = dev(np.full((2, 11), np.nan, np.float32))
    assert kn.linear(x, w, out=out) is out
    assert_bits(out.copy_to_host(), contract(x, wf))


def test_public_linear_rejects_bad_input(rng):
    x = xs(rng, (2, 8))
    with pytest.raises(ValueError, match="x must have dtype float32"):
        kn.linear(x.astype(np.float64), np.zeros((3, 8), np.float32))
    with pytest.raises(ValueError, match="input features"):
        kn.linear(x, np.zeros((3, 9), np.float32))
    with pytest.raises(ValueError, match="weights must be"):
        kn.linear(x, np.zeros((3, 8), np.int32))
    with pytest.raises(ValueError, match="weight must be 2-D"):
        kn.linear(x, np.zeros((1, 3, 8), np.float32))
    with pytest.raises(ValueError, match="out has shape"):
        kn.linear(x, np.zeros((3, 8), np.float32), out=dev(np.zeros((2, 4), np.float32)))


def test_empty_shapes(rng):
    assert kn.linear(np.zeros((0, 8), np.float32), np.zeros((3, 8), np.float32)).shape == (0, 3)
    y = kn.linear(xs(rng, (2, 0)), np.zeros((3, 0), np.uint16))     # an empty sum is 0
    assert_bits(y, np.zeros((2, 3), np.float32))


# -- (b) every enqueue variant, bit for bit ---------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_accumulate_adds_into_out_with_live_rows_only(rng, kind):
    """enqueue_linear(accumulate=True): out[:n] += x[:n] @ w.T; rows n.. untouched."""
    R, n, K, N = 6, 5, 136, 21
    x = xs(rng, (R, K))
    w, wf = weights(rng, (N, K), kind)
    base = xs(rng, (R, N))
    for cfg in (None, L.TILED["small"]):
        got = run_linear(x, w, n=n, cfg=cfg, accumulate=True, out=base)
        assert_bits(got[:n], base[:n] + contract(x[:n], wf))
        assert_bits(got[n:], base[n:])
        assert_twin(got[:n], base[:n] + ref.linear(x[:n], wf))


@pytest.mark.parametrize("kind", ["bf16", "f32"])
def test_heads_projection_per_group(rng, kind):
    """enqueue_linear_heads: out[r, z*N:(z+1)*N] = x[r, z*s:z*s+K] @ w[z].T."""
    Z, K, N, s, R = 3, 72, 10, 80, 2
    x = xs(rng, (R, Z * s))
    w, wf = weights(rng, (Z, N, K), kind)
    d_out = dev(np.full((R, Z * N), np.nan, np.float32))
    L.enqueue_linear_heads(dev(x), s, dev(w), d_out, rows_dev(R))
    got = d_out.copy_to_host()
    for z in range(Z):
        assert_bits(got[:, z * N:(z + 1) * N], contract(x[:, z * s:z * s + K], wf[z]))
        assert_twin(got[:, z * N:(z + 1) * N], ref.linear(x[:, z * s:z * s + K], wf[z]))


@pytest.mark.parametrize("kind,R", [("bf16", 1), ("f16", 3), ("bf16", 9), ("f32", 2)])
def test_swiglu(rng, kind, R):
    K, I = 100, 13
    x = xs(rng, (R, K))
    wg, wgf = weights(rng, (I, K), kind)
    wu, wuf = weights(rng, (I, K), kind)
    d_out = dev(np.full((R, I), np.nan, np.float32))
    L.enqueue_swiglu(dev(x), dev(wg), dev(wu), d_out, rows_dev(R))
    got = d_out.copy_to_host()
    want = silu_mul(contract(x, wgf), contract(x, wuf))
    assert_twin(got, want)
    if not REAL_GPU:                                    # expf of a GPU may differ in the last bit
        assert_bits(got, want)


def _grouped_case(rng, kind, counts, K, N, gather):
    Z = len(counts)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    Ro = int(offsets[-1])
    x = xs(rng, (Ro + 3, K))
    row_index = rng.integers(0, Ro + 3, Ro).astype(np.int32) if gather else None
    w, wf = weights(rng, (Z, N, K), kind)
    wu, wuf = weights(rng, (Z, N, K), kind)
    return offsets, x, row_index, (w, wf), (wu, wuf)


@pytest.mark.parametrize("kind,swiglu,gather,counts", [
    ("bf16", True, True, [2, 0, 3]),       # skinny (max 3 rows), an empty group
    ("f16", False, False, [1, 4, 2]),
    ("bf16", False, True, [9, 1, 0]),      # tiled (max 9 rows: two row tiles of 8)
    ("f32", True, False, [3, 10, 1]),
])
def test_grouped_experts(rng, kind, swiglu, gather, counts):
    K, N = 90, 22
    offsets, x, row_index, (w, wf), (wu, wuf) = _grouped_case(rng, kind, counts, K, N, gather)
    Ro = int(offsets[-1])
    d_out = dev(np.full((Ro, N), np.nan, np.float32))
    L.enqueue_grouped_linear(dev(x), dev(w), d_out, dev(offsets), max(counts),
                             row_index=None if row_index is None else dev(row_index),
                             w_up=dev(wu) if swiglu else None)
    got = d_out.copy_to_host()
    for z in range(len(counts)):
        j = np.arange(offsets[z], offsets[z + 1])
        xz = x[row_index[j] if gather else j]
        want = contract(xz, wf[z])
        if swiglu:
            want = silu_mul(want, contract(xz, wuf[z]))
        if swiglu and REAL_GPU:
            assert_twin(got[j], want)
        else:
            assert_bits(got[j], want)


# -- the kernels' paths one by one, bit for bit ----------------------------------------------
@pytest.mark.skipif(REAL_GPU, reason="simulator tile shapes")
@pytest.mark.parametrize("kind,K,cfg", [
    ("bf16", 300, (8, 4, 2, 32)),     # 5 chunks over 2 groups: a round with one live group
    ("f16", 196, (16, 4, 4, 16)),     # lanes 4 x 4
    ("f32", 130, (2, 2, 1, 8)),       # 8-lane groups, 8 groups a block
    ("bf16", 70, (1, 1, 1, 32)),
    ("bf16", 98, (4, 2, 2, 16)),      # K % 4 != 0: element-wise weight loads
])
def test_skinny_tiles_are_exact(rng, kind, K, cfg):
    rb, tm, tn, gl = cfg
    R, N = min(rb, 5), 29
    x = xs(rng, (R, K))
    w, wf = weights(rng, (N, K), kind)
    assert_bits(run_linear(x, w, cfg=skinny(rb, tm, tn, gl)), contract(x, wf))


@pytest.mark.skipif(REAL_GPU, reason="simulator tile shapes")
@pytest.mark.parametrize("kind,K,R,N,name", [
    ("bf16", 200, 13, 19, "small"),   # 2 row tiles, 3 column blocks, partial last chunk
    ("f32", 66, 8, 33, "large"),
    ("f16", 75, 5, 16, "small"),      # K odd: element-wise loads
])
def test_tiled_tiles_are_exact(rng, kind, K, R, N, name):
    x = xs(rng, (R, K))
    w, wf = weights(rng, (N, K), kind)
    assert_bits(run_linear(x, w, cfg=L.TILED[name]), contract(x, wf))


def test_misaligned_weights_fall_back_to_element_loads(rng):
    """K * itemsize % 8 != 0 disables the word loads; results are the same bits."""
    x = xs(rng, (2, 66))
    w, wf = weights(rng, (7, 66), "bf16")
    assert not L._vec_ok(dev(w[None])) and L._vec_ok(dev(weights(rng, (1, 7, 64), "bf16")[0]))
    assert_bits(kn.linear(x, w), contract(x, wf))


# -- (c) batch invariance -----------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["bf16", "f32"])
def test_a_row_alone_equals_the_row_in_any_batch(rng, kind):
    """Row 0 computed with n_rows = 1 (skinny, one row), in a skinny batch of 3, in a tiled
    batch of 11 and at the end of a tiled batch: identical bits."""
    K, N = 130, 20
    x = xs(rng, (11, K))
    w, _ = weights(rng, (N, K), kind)
    alone = run_linear(x[:1], w)
    assert L._choose(1, N, K, kind, False, False).__class__ is L._Skinny
    small = run_linear(x[:3], w)
    big = run_linear(x, w)
    assert L._choose(11, N, K, kind, False, False).__class__ is L._Tiled
    last = run_linear(np.concatenate([x[1:], x[:1]]), w)
    assert_bits(small[:1], alone)
    assert_bits(big[:1], alone)
    assert_bits(last[-1:], alone)


def test_a_row_is_invariant_across_skinny_and_tiled_tiles(rng):
    x = xs(rng, (6, 128))
    w, _ = weights(rng, (16, 128), "bf16")
    want = run_linear(x[:1], w)[0]
    cfgs = [L.TILED["small"], L.TILED["mid"]]
    if not REAL_GPU:
        cfgs += [skinny(8, 4, 2, 16), skinny(2, 2, 1, 8)]
    for cfg in cfgs:
        assert_bits(run_linear(x, w, cfg=cfg)[0], want)


def test_grouped_row_matches_the_plain_projection_of_that_row(rng):
    """A token routed to expert z gives the bits of linear(token, w[z]), whatever the group's
    size and the tile (picked from max_rows, or from ``tile_rows`` with the grid still covering
    max_rows)."""
    K, N = 96, 18
    offsets, x, row_index, (w, _), _ = _grouped_case(rng, "bf16", [1, 9, 2], K, N, True)
    alone = {j: run_linear(x[row_index[j]][None], w[int(np.searchsorted(offsets, j, side="right") - 1)])[0]
             for j in (0, 11)}
    for tile_rows in (None, 2):
        d_out = dev(np.full((12, N), np.nan, np.float32))
        L.enqueue_grouped_linear(dev(x), dev(w), d_out, dev(offsets), 9, row_index=dev(row_index),
                                 tile_rows=tile_rows)
        got = d_out.copy_to_host()
        for j, want in alone.items():
            assert_bits(got[j], want)
        assert not np.isnan(got).any()
