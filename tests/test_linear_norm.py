"""The GEMM of normed rows (``kernels.linear.enqueue_linear``'s ``norm`` / ``norm_head``,
``kernels.moe.enqueue_swiglu_mlp``'s ``norm``): the norm's launch into a buffer, then the GEMM
over it. Held to ``enqueue_rms_norm`` and the plain GEMM bit for bit (each held to its twin
elsewhere) and to the twins' products within the accumulation bound.
"""

import importlib

import numpy as np
import pytest
from numba import cuda

from ddtree_numba import kernels as kn
from ddtree_numba.dtypes import from_storage
from ddtree_numba.reference.linear import accumulation_bound, enqueue_linear as twin_linear, linear
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


def assert_bits(a, b):
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("accumulate", [False, True])
def test_the_gemm_of_normed_rows_is_the_norms_launch_then_the_gemm(rng, accumulate):
    """``norm=``: scratch holds exactly ``enqueue_rms_norm``'s rows, the product the plain GEMM's
    bits over them, rows past n untouched, and the twin's product within its bound."""
    K, N, R, n = 96, 22, 9, 7
    x, gamma = case(rng, R, K)
    w = bf16_bits(rng, (N, K))
    out0 = np.arange(R * N, dtype=np.float32).reshape(R, N) / 7 if accumulate else np.full((R, N), np.nan, np.float32)
    d_x, d_n, d_g, d_w = (cuda.to_device(a) for a in (x, np.array([n], np.int32), gamma, w))
    d_out, d_scratch = cuda.to_device(out0), cuda.to_device(np.full((R, K), np.nan, np.float32))
    kn.enqueue_linear(d_x, d_w, d_out, d_n, precision="bf16", accumulate=accumulate, norm=(d_g, EPS, d_scratch))
    d_normed, d_plain = cuda.to_device(np.full((R, K), np.nan, np.float32)), cuda.to_device(out0)
    kn.enqueue_rms_norm(d_x, d_g, EPS, d_normed, d_n)
    kn.enqueue_linear(d_normed, d_w, d_plain, d_n, precision="bf16", accumulate=accumulate)
    got, normed = d_out.copy_to_host(), d_normed.copy_to_host()
    assert_bits(d_scratch.copy_to_host()[:n], normed[:n])
    assert_bits(got, d_plain.copy_to_host())
    assert_bits(got[n:], out0[n:])
    # the exact product of the kernel's normed rows, within the GEMM's bound; the twin (its own
    # norm, summed in another order: a last-bit change can flip a bf16 rounding) close to it
    exact = linear(normed[:n], from_storage(w), "bf16") + (out0[:n] if accumulate else 0)
    assert (np.abs(got[:n] - exact) <= accumulation_bound(normed[:n], from_storage(w), "bf16")).all()
    want = out0.copy()
    twin_linear(x, w, want, np.array([n], np.int32), precision="bf16", accumulate=accumulate, norm=(gamma, EPS, None))
    np.testing.assert_allclose(got[:n], want[:n], rtol=1e-2, atol=2e-2 * float(np.abs(want[:n]).max()))


def test_the_gemm_of_normed_head_rows_writes_their_norms_into_x(rng):
    """``norm_head`` (the drafter's block rows over its context rows): head's norms go into x[:H]
    (rows past H untouched), then the GEMM reads x whole: the plain GEMM's bits over
    [rms_norm(head); x[H:n]], which is the twin's product."""
    K, N, R, H, n = 96, 22, 9, 5, 8
    rest, gamma = case(rng, R, K)
    head = case(rng, H, K)[0]
    w = bf16_bits(rng, (N, K))
    x = rest.copy()
    x[:H] = np.nan
    d_x, d_h, d_n, d_g, d_w = (cuda.to_device(a) for a in (x, head, np.array([n], np.int32), gamma, w))
    d_out = cuda.to_device(np.full((R, N), np.nan, np.float32))
    kn.enqueue_linear(d_x, d_w, d_out, d_n, precision="bf16", norm=(d_g, EPS, None), norm_head=d_h)
    x_after, got = d_x.copy_to_host(), d_out.copy_to_host()
    d_normed = cuda.to_device(np.full((H, K), np.nan, np.float32))
    kn.enqueue_rms_norm(d_h, d_g, EPS, d_normed, d_n)
    assert_bits(x_after[:H], d_normed.copy_to_host())
    assert_bits(x_after[H:], rest[H:])
    d_plain = cuda.to_device(np.full((R, N), np.nan, np.float32))
    kn.enqueue_linear(cuda.to_device(x_after), d_w, d_plain, d_n, precision="bf16")
    assert_bits(got, d_plain.copy_to_host())
    exact = linear(x_after[:n], from_storage(w), "bf16")
    assert (np.abs(got[:n] - exact) <= accumulation_bound(x_after[:n], from_storage(w), "bf16")).all()
    want = np.full_like(got, np.nan)
    twin_linear(x, w, want, np.array([n], np.int32), precision="bf16", norm=(gamma, EPS, None), norm_head=head)
    np.testing.assert_allclose(got[:n], want[:n], rtol=1e-2, atol=2e-2 * float(np.abs(want[:n]).max()))


def test_the_mlp_of_normed_rows_against_its_twin(rng):
    """``enqueue_swiglu_mlp(norm=)`` as the models call it (out = x, the residual: x += mlp(rms_norm(x)))
    against ``reference.moe.enqueue_swiglu_mlp`` within the bf16 GEMMs' rounding."""
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
    # the bits of the norm's launch into a buffer, then the MLP over it (scratch holds the norms)
    d_y, d_normed = cuda.to_device(x), cuda.to_device(np.zeros((R, K), np.float32))
    kn.enqueue_rms_norm(d_y, cuda.to_device(gamma), EPS, d_normed, d_n)
    M.enqueue_swiglu_mlp(d_normed, cuda.to_device(wg), cuda.to_device(wu), cuda.to_device(wd), d_y,
                         act=cuda.to_device(np.zeros((R, I), np.float32)), n_rows=d_n, precision="bf16",
                         accumulate=True)
    assert_bits(d_scratch.copy_to_host()[:n], d_normed.copy_to_host()[:n])
    assert_bits(got, d_y.copy_to_host())
