"""A GEMM over its rows' RMSNorm in one launch (``kernels.linear``'s ``norm``): the register kernel
norms each row itself (``rms_norm._warp_inv_rms``, ``_inv_rms``'s sums in a warp) and scales the raw
activations as it converts them. Held bit for bit to the two launches it replaces
(``enqueue_rms_norm`` into a buffer, then the GEMM over it), which are each held to their twins
elsewhere; the scratch buffer left untouched shows that the fold, not the fallback, ran.
"""

import importlib
import threading
import types

import numpy as np
import pytest
from numba import cuda

from conftest import REAL_GPU
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


@pytest.mark.parametrize("K, R, n", [(260, 16, 13)] + ([(1020, 8, 1), (1020, 128, 65), (2052, 32, 17)] if REAL_GPU else []))
def test_folded_norm_with_the_tile_a_launch_chooses(rng, K, R, n):
    """The tile ``_choose`` gives (on a GPU up to 16 warps splitting the chunks, four row tiles),
    K past the norm's 256 threads (chains of several terms), and past ``_NORM_FOLD_K`` (2052: the
    norm's own launch): the two-launch bits, in one launch wherever ``_folds_norm`` says so."""
    x, gamma = case(rng, R, K)
    w = bf16_bits(rng, (200, K))
    fused, scratch = run(x, gamma, w, n, "bf16", None, True)
    plain, normed = run(x, gamma, w, n, "bf16", None, False)
    assert_bits(fused, plain)
    plan = L._plan(cuda.to_device(x), 0, cuda.to_device(w).reshape(1, *w.shape), None, R, "bf16")
    if L._folds_norm(plan, 0, False, False):
        assert np.isnan(scratch).all() and K <= L._NORM_FOLD_K
    else:
        assert_bits(scratch[:n], normed[:n])
    assert L._folds_norm(plan, 0, False, False) or K > L._NORM_FOLD_K or REAL_GPU   # (the simulator: folded)


@pytest.mark.skipif(not REAL_GPU, reason="a GPU's tile rules and shared-memory limit (the simulator's tiles are small)")
def test_a_quantized_swiglu_whose_tile_has_no_room_for_the_norms_takes_the_norms_launch(rng):
    """e4m3 SwiGLU, K 1024, a few rows: the chosen tile's warps fill the 48 KiB of shared memory, so
    the fold (which needs 4 bytes a row more) is not taken; the result is the two-launch one."""
    from ddtree_numba.dtypes import BlockScaled
    K, N, R, n = 1024, 2048, 8, 8
    x, gamma = case(rng, R, K)
    data = lambda: (rng.integers(0, 2, (N, K)) << 7 | rng.integers(0, 7, (N, K)) << 3).astype(np.uint8)  # noqa: E731
    scale = lambda: (rng.random((N // 128, K // 128)) + 0.5).astype(np.float32)  # noqa: E731
    wg, wu = BlockScaled(data(), scale(), (128, 128)), BlockScaled(data(), scale(), (128, 128))
    dev = lambda w: BlockScaled(cuda.to_device(w.data), cuda.to_device(w.scale), w.block)  # noqa: E731
    d_x, d_n = cuda.to_device(x), cuda.to_device(np.array([n], np.int32))
    outs = []
    for fold in (True, False):
        d_out, d_scratch = cuda.to_device(np.zeros((R, N), np.float32)), cuda.to_device(np.zeros((R, K), np.float32))
        src = d_x
        if not fold:
            kn.enqueue_rms_norm(d_x, cuda.to_device(gamma), EPS, d_scratch, d_n)
            src = d_scratch
        L._enqueue_swiglu(src, dev(wg), dev(wu), d_out, d_n, precision="bf16",
                          norm=(cuda.to_device(gamma), EPS, d_scratch) if fold else None)
        outs.append(d_out.copy_to_host())
    assert_bits(outs[0], outs[1])


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


def run_head(head, rest, gamma, w, n, tile, fold):
    """(out, x after) of the GEMM over [rms_norm(head); rest[H:n]] (``norm_head``): ``fold``
    through ``enqueue_linear(norm_head=)`` with x's first H rows poisoned with NaN (a fold never
    reads them; the norm's own launch writes them), else the norm's launch into x[:H], then the
    GEMM over x."""
    H = head.shape[0]
    x = rest.copy()
    x[:H] = np.nan
    d_x, d_h, d_n, d_g = (cuda.to_device(a) for a in (x, head, np.array([n], np.int32), gamma))
    d_out = cuda.to_device(np.full((x.shape[0], w.shape[0]), np.nan, np.float32))
    if fold:
        kn.enqueue_linear(d_x, cuda.to_device(w), d_out, d_n, precision="bf16", tile=tile,
                          norm=(d_g, EPS, None), norm_head=d_h)
    else:
        kn.enqueue_rms_norm(d_h, d_g, EPS, d_x[:H], d_n)
        kn.enqueue_linear(d_x, cuda.to_device(w), d_out, d_n, precision="bf16", tile=tile)
    return d_out.copy_to_host(), d_x.copy_to_host()


@pytest.mark.parametrize("tile, R, H, n", [(L._Tile(1, 1, 1), 9, 5, 9),     # the head ends inside a row tile
                                           (L._Tile(1, 1, 2), 12, 8, 11),   # warps splitting the chunks
                                           (L._Tile(2, 2, 1), 20, 11, 19)])  # two row tiles, two row blocks
def test_a_folded_norm_of_the_head_rows_gives_the_two_launch_bits(rng, tile, R, H, n):
    """``norm_head`` (the drafter's block rows over its context rows): rows below H are the norm of
    norm_head's rows, the rest x's as they are; one launch gives the bits of the norm's launch
    into x[:H] followed by the GEMM over x, and the twin computes that product."""
    from ddtree_numba.reference.linear import enqueue_linear as twin_linear
    K, N = 96, 22
    rest, gamma = case(rng, R, K)
    head = case(rng, H, K)[0]
    w = bf16_bits(rng, (N, K))
    fused, x_after = run_head(head, rest, gamma, w, n, tile, True)
    plain, normed = run_head(head, rest, gamma, w, n, tile, False)
    assert np.isnan(x_after[:H]).all()             # one launch: the head's norms never written out
    assert_bits(fused, plain)
    assert not np.isnan(fused[:n]).any()
    want = np.full_like(fused, np.nan)
    twin_linear(np.concatenate([np.full((H, K), np.nan, np.float32), rest[H:]]), w, want, np.array([n], np.int32),
                precision="bf16", norm=(gamma, EPS, None), norm_head=head)
    assert_bits(want[:n], linear(normed[:n], from_storage(w), "bf16"))   # the twin computes that product
    assert (np.abs(fused[:n] - want[:n]) <= accumulation_bound(normed[:n], from_storage(w), "bf16")).all()


def test_a_head_norm_that_does_not_fold_is_written_into_the_head_rows(rng, monkeypatch):
    """Past ``_NORM_FOLD_K``: the head's norms are launched into x[:H] (scratch unused), then the
    GEMM reads x whole: the bits of the two launches."""
    K, N, R, H, n = 96, 22, 9, 5, 8
    rest, gamma = case(rng, R, K)
    head = case(rng, H, K)[0]
    w = bf16_bits(rng, (N, K))
    plain, normed = run_head(head, rest, gamma, w, n, L._Tile(1, 1, 1), False)
    monkeypatch.setattr(L, "_NORM_FOLD_K", 64)
    out, x_after = run_head(head, rest, gamma, w, n, L._Tile(1, 1, 1), True)
    assert_bits(x_after[:H], normed[:H])
    assert_bits(x_after[H:], rest[H:])
    assert_bits(out, plain)


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


class _Lanes:
    """``cuda`` for Python threads: a warp's shuffles (32 threads) or a block's barrier."""

    def __init__(self, n):
        self.barrier, self.slots = threading.Barrier(n), [None] * n

    def _exchange(self, v):
        lane = threading.current_thread().lane
        self.slots[lane] = v
        self.barrier.wait()
        seen = list(self.slots)
        self.barrier.wait()
        return lane, seen

    def shfl_down_sync(self, mask, v, off):
        lane, seen = self._exchange(v)
        return seen[lane + off] if lane + off < len(seen) else v

    def shfl_sync(self, mask, v, src):
        return self._exchange(v)[1][src]

    def syncthreads(self):
        self.barrier.wait()


def _on_threads(fn, n, call):
    """call(fn with ``cuda`` emulated for n threads, thread index) on n Python threads -> results."""
    lanes = _Lanes(n)
    g = dict(fn.__globals__, cuda=lanes, fma=lambda a, b, c: np.float32(np.float64(a) * np.float64(b) + np.float64(c)))
    f = types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
    out = [None] * n

    def body(i):
        out[i] = call(f, i)
    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for i, th in enumerate(threads):
        th.lane = i
        th.start()
    for th in threads:
        th.join()
    return out


def test_the_gpus_warp_norm_gives_the_block_norms_bits(rng):
    """The GPU branch of ``rms_norm._make_warp_inv_rms`` (256 virtual threads: 8 partials a lane,
    the tree's lower levels by shuffles), run on 32 Python threads with emulated shuffles, gives
    ``_inv_rms``'s bits with 256 threads (a block's barriers emulated), the norm kernel's on a
    GPU; and a tree of 128 threads would not (so the check sees the order)."""
    R = importlib.import_module("ddtree_numba.kernels.rms_norm")
    warp_norm = R._make_warp_inv_rms(256, warp_ops=True, device=lambda f: f)
    block_norm = getattr(R._inv_rms, "py_func", R._inv_rms)
    eps = np.float32(1e-6)
    differs = 0
    for m in (96, 260, 1020, 2052):
        for _ in range(2):
            x = (rng.standard_normal((1, m)) * np.exp(rng.uniform(-6, 6, (1, m)))).astype(np.float32)
            warp = _on_threads(warp_norm, 32, lambda f, lane: f(x, 0, 0, m, eps, lane, np.zeros(8, np.float32)))
            part = np.zeros(256, np.float32)
            block = _on_threads(block_norm, 256, lambda f, t: f(x, 0, 0, m, eps, part, t, 256))
            assert len({np.float32(v).view(np.uint32) for v in warp}) == 1       # every lane has it
            assert np.float32(warp[0]).view(np.uint32) == np.float32(block[0]).view(np.uint32), m
            part = np.zeros(128, np.float32)
            half = _on_threads(block_norm, 128, lambda f, t: f(x, 0, 0, m, eps, part, t, 128))
            differs += np.float32(half[0]).view(np.uint32) != np.float32(block[0]).view(np.uint32)
    assert differs > 0
