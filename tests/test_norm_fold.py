"""A GEMM over its rows' RMSNorm in one launch (``kernels.linear``'s ``norm``): the register kernel
norms each row itself (``rms_norm._warp_inv_rms``, ``_inv_rms``'s sums in a warp) and scales the raw
activations as it converts them. Held bit for bit to the two launches it replaces
(``enqueue_rms_norm`` into a buffer, then the GEMM over it), which are each held to their twins
elsewhere; the scratch buffer left untouched shows that the fold, not the fallback, ran.
"""

import importlib

import numpy as np
import pytest
from numba import cuda

from ddtree_numba import kernels as kn
from ddtree_numba.dtypes import from_storage
from ddtree_numba.reference.linear import accumulation_bound, linear
from ddtree_numba.reference.moe import enqueue_swiglu_mlp as twin_swiglu_mlp

L = importlib.import_module("ddtree_numba.kernels.linear")
M = importlib.import_module("ddtree_numba.kernels.moe")
pytestmark = pytest.mark.kernels
EPS = 1e-6


def bf16_bits(rng, shape):
    w = (rng.standard_normal(shape) * 0.5).astype(np.float32)
    return (w.view(np.uint32) >> 16).astype(np.uint16)


def case(rng, R, K):
    """Rows of varied scale (so that each row's norm matters) and a norm weight."""
    x = rng.standard_normal((R, K)).astype(np.float32) * rng.uniform(0.1, 8.0, (R, 1)).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, K).astype(np.float32)
    return x, gamma


def run(x, gamma, w, n, precision, tile, fold, w_up=None, accumulate=False):
    """(out, scratch) of the GEMM over rms_norm(x[:n]): ``fold`` through ``norm=`` (scratch
    poisoned with NaN), else the norm's own launch into scratch then the GEMM."""
    R, K = x.shape
    N = w.shape[0]
    d_x, d_n = cuda.to_device(x), cuda.to_device(np.array([n], np.int32))
    out0 = np.arange(R * N, dtype=np.float32).reshape(R, N) / 7 if accumulate else np.full((R, N), np.nan, np.float32)
    d_out, d_scratch = cuda.to_device(out0), cuda.to_device(np.full((R, K), np.nan, np.float32))
    d_w, d_g = cuda.to_device(w), cuda.to_device(gamma)
    d_up = None if w_up is None else cuda.to_device(w_up)
    norm = (d_g, EPS, d_scratch) if fold else None
    src = d_x
    if not fold:
        kn.enqueue_rms_norm(d_x, d_g, EPS, d_scratch, d_n)
        src = d_scratch
    if w_up is None:
        kn.enqueue_linear(src, d_w, d_out, d_n, precision=precision, accumulate=accumulate, tile=tile, norm=norm)
    else:
        L._enqueue_swiglu(src, d_w, d_up, d_out, d_n, precision=precision, tile=tile, norm=norm)
    return d_out.copy_to_host(), d_scratch.copy_to_host()


def assert_bits(a, b):
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("tile, R, n", [(L._Tile(1, 1, 1), 9, 5),      # a partial row tile
                                        (L._Tile(1, 1, 2), 9, 9),      # warps splitting the chunks
                                        (L._Tile(2, 2, 1), 20, 19)])   # two row tiles, two row blocks
def test_folded_norm_gives_the_bits_of_the_norms_own_launch(rng, precision, tile, R, n):
    K, N = 96, 22                                  # a partial second chunk
    x, gamma = case(rng, R, K)
    w = bf16_bits(rng, (N, K))
    for accumulate in (False, True):
        fused, scratch = run(x, gamma, w, n, precision, tile, True, accumulate=accumulate)
        plain, _ = run(x, gamma, w, n, precision, tile, False, accumulate=accumulate)
        assert np.isnan(scratch).all()             # one launch: the norm was never written out
        assert_bits(fused, plain)
        assert not np.isnan(fused[:n]).any()


@pytest.mark.parametrize("tile", [L._Tile(1, 1, 2), L._Tile(2, 2, 1)])
def test_folded_norm_in_a_swiglu_gives_the_two_launch_bits(rng, tile):
    K, I, R, n = 64, 20, 12, 11
    x, gamma = case(rng, R, K)
    wg, wu = bf16_bits(rng, (I, K)), bf16_bits(rng, (I, K))
    fused, scratch = run(x, gamma, wg, n, "bf16", tile, True, w_up=wu)
    plain, _ = run(x, gamma, wg, n, "bf16", tile, False, w_up=wu)
    assert np.isnan(scratch).all()
    assert_bits(fused, plain)


def test_a_norm_that_does_not_fold_takes_its_own_launch(rng, monkeypatch):
    """Past ``_NORM_FOLD_K`` inputs (and on the staged kernel) the norm is launched into scratch
    first: scratch then holds exactly ``enqueue_rms_norm``'s rows, and the product its bits."""
    K, N, R, n = 96, 22, 9, 7
    x, gamma = case(rng, R, K)
    w = bf16_bits(rng, (N, K))
    plain, normed = run(x, gamma, w, n, "bf16", L._Tile(1, 1, 1), False)
    monkeypatch.setattr(L, "_NORM_FOLD_K", 64)
    out, scratch = run(x, gamma, w, n, "bf16", L._Tile(1, 1, 1), True)
    assert_bits(scratch[:n], normed[:n])
    assert_bits(out, plain)
    monkeypatch.setattr(L, "_NORM_FOLD_K", 1024)
    staged = L.TILES["staged"]
    out, scratch = run(x, gamma, w, n, "bf16", staged, True)
    assert_bits(scratch[:n], normed[:n])
    assert_bits(out, run(x, gamma, w, n, "bf16", staged, False)[0])


def test_folded_norm_mlp_against_its_twin(rng):
    """``enqueue_swiglu_mlp(norm=)`` as the models call it (out = x, the residual: x += mlp(rms_norm(x)))
    against ``reference.moe.enqueue_swiglu_mlp`` within the bf16 GEMMs' bound."""
    K, I, R, n = 64, 24, 6, 5
    x, gamma = case(rng, R, K)
    wg, wu, wd = bf16_bits(rng, (I, K)), bf16_bits(rng, (I, K)), bf16_bits(rng, (K, I))
    d_x = cuda.to_device(x)
    d_n = cuda.to_device(np.array([n], np.int32))
    d_act, d_scratch = cuda.to_device(np.zeros((R, I), np.float32)), cuda.to_device(np.zeros((R, K), np.float32))
    M.enqueue_swiglu_mlp(d_x, cuda.to_device(wg), cuda.to_device(wu), cuda.to_device(wd), d_x, act=d_act,
                         n_rows=d_n, precision="bf16", accumulate=True,
                         norm=(cuda.to_device(gamma), EPS, d_scratch))
    want, act = x.copy(), np.zeros((R, I), np.float32)
    twin_swiglu_mlp(want, wg, wu, wd, want, act=act, n_rows=np.array([n], np.int32), precision="bf16",
                               accumulate=True, norm=(gamma, EPS, None))
    got = d_x.copy_to_host()
    assert_bits(got[n:], x[n:])                    # rows past n untouched
    np.testing.assert_allclose(got[:n], want[:n], rtol=1e-2, atol=5e-2 * float(np.abs(want[:n]).max()))
    # the folded product against the twin GEMM of the norm kernel's rows, within the accumulation
    # bound (the twin's own norm sums in another order: a last-bit change flips bf16 roundings)
    w = bf16_bits(rng, (10, K))
    fused, _ = run(x, gamma, w, n, "bf16", L._Tile(1, 1, 1), True)
    normed = run(x, gamma, w, n, "bf16", L._Tile(1, 1, 1), False)[1][:n]
    want = linear(normed, from_storage(w), "bf16")
    assert (np.abs(fused[:n] - want) <= accumulation_bound(normed, from_storage(w), "bf16")).all()
