"""RMSNorm on the GPU; twin: ``reference.rms_norm.rms_norm``. And a DFlash drafter layer's
per-head q / k norm fused with its RoPE and cache append (``enqueue_qkv_norm_rope``; twin
``reference.rms_norm.head_norm_rope``), one block per (row, head), the same reduction.

Shapes: R buffer rows (n = n_rows[0] of them live), M normalized features, Wx >= M columns of
the input buffer, Wo >= M columns of the output buffer.

One block per row (``_rms_norm_kernel``). Thread t sums ``x[r, k]^2`` over k = t, t + T, ... with an fma chain in
ascending k, then a shared-memory tree halves the T partials. The order depends only on T and
M, never on the row count, so a row's norm is bit-identical alone or in a batch (docs/DESIGN.md
§4). The twin (numpy's pairwise mean) sums in another order: equal within float32 rounding, not
bit for bit.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import config, cuda, float32

from .._checks import check_array, is_real_number
from .._device import (cached, device_function, float32_out, fma, grid_dependency_after, launcher_result, rows_device,
                       to_device)
from ._warp import WARP_OPS
from .rope import _cos_sin, _dest_row, _dest_rows_args, _rotate

# Threads per block (a power of two: the tree halves it). 256 covers hidden 2048 in 8 loads a
# thread; the simulator runs every thread as a Python thread and every barrier costs it
# milliseconds, so it gets two threads (one level of the tree).
THREADS = 2 if config.ENABLE_CUDASIM else 256
# entries of a row (and of the weights) a thread of the norm holds in registers from the start:
# 8 x 256 covers hidden sizes to 2048 on a GPU; past them the rest is read where it is used
ROW_REGISTERS = 8


def _warp_reduction(T: int) -> bool:
    """Whether ``_inv_rms`` of T threads sums its tree in warp 0 (a GPU, T a multiple of 32 from
    64); read when a kernel factory builds, so that a test can build the tree's kernel too."""
    return WARP_OPS and T >= 64 and T % 32 == 0


@device_function
def _inv_rms(x, r, c0, m, eps, part, t, T, warp):
    """1 / sqrt(mean(x[r, c0 : c0 + m]^2) + eps) in float32, by the T threads of a block (t is
    this thread; ``part`` a shared float32 [T]): thread t sums x^2 over k = t, t + T, ... with an
    fma chain in ascending k, then a shared-memory tree halves the T partials. Every thread of
    the block must call it (it holds barriers); every thread gets the result. Shared with the
    fused per-head norm below so that both give a head the same bits. ``warp``
    (``_warp_reduction(T)``, a constant of the calling kernel's factory): the tree's levels in
    warp 0, the same pairing, two barriers. (In the simulator it is a plain function that must
    live in the module of the kernels calling it: the simulator swaps ``cuda`` in the kernel's own
    module only.)"""
    acc = float32(0.0)
    for k in range(t, m, T):
        v = x[r, c0 + k]
        acc = fma(v, v, acc)
    return _inv_rms_of(acc, m, eps, part, t, T, warp)


@device_function
def _inv_rms_of(acc, m, eps, part, t, T, warp):
    """``_inv_rms`` from each thread's fma chain ``acc``: the tree over the block, then the
    inverse (every thread of the block must call it; every thread gets the result)."""
    part[t] = acc
    cuda.syncthreads()  # every partial is in
    if warp:
        # the same tree in two barriers: the tree's levels of stride >= 32 reach index l < 32 from
        # the partials l + 32 k alone, so lane l of warp 0 pairs those as the tree pairs them;
        # then xor shuffles of 16 .. 1, where each lane l < s (the ones the tree updates) takes
        # lane l + s. The same additions of the same operands: the same bits as the loop below.
        if t < 32:
            vals = cuda.local.array(32, float32)
            for k in range(T // 32):
                vals[k] = part[t + 32 * k]
            h = T // 64
            while h > 0:
                for k in range(h):
                    vals[k] = vals[k] + vals[k + h]
                h //= 2
            sq = vals[0]
            off = 16
            while off > 0:
                sq = sq + cuda.shfl_xor_sync(0xFFFFFFFF, sq, off)
                off //= 2
            if t == 0:
                part[0] = sq
        cuda.syncthreads()  # the sum is in part[0]
    else:
        stride = T // 2
        while stride > 0:
            if t < stride:
                part[t] = part[t] + part[t + stride]
            cuda.syncthreads()  # this level of the tree is done before the next reads it
            stride //= 2
    # the twin's order: var = sum / M, inv = 1 / sqrt(var + eps), out = w * (x * inv)
    var = part[0] / float32(m)
    # float32() keeps the simulator (where math.sqrt returns a Python float) in float32
    return float32(float32(1.0) / float32(math.sqrt(var + eps)))


@functools.lru_cache(maxsize=None)
def _rms_norm_kernel(threads, pair=False):
    """Row r = blockIdx.x of job blockIdx.y: job 0 normalizes x[r, col0 : col0 + M] with
    ``weight`` into ``out``; with ``pair``, job 1 x[r, col1 : col1 + M1] with ``weight1`` into
    ``out1`` (two norms of one buffer in one launch: MLA's query and kv latents)."""
    T = threads
    WARP = _warp_reduction(T)
    U = ROW_REGISTERS

    @cached
    @cuda.jit
    def kernel(x, weight, eps, out, n_rows, col0, mode0, row0_0, seqs0, slot_rows0, layer_row0_0,
               weight1, out1, col1, mode1, row0_1, seqs1, slot_rows1, layer_row0_1):
        grid_dependency_after((x, weight, eps, out, n_rows, col0, mode0, row0_0, seqs0, slot_rows0, layer_row0_0,
                               weight1, out1, col1, mode1, row0_1, seqs1, slot_rows1, layer_row0_1))
        r = cuda.blockIdx.x
        t = cuda.threadIdx.x
        second = pair and cuda.blockIdx.y == 1
        w, dst, c0 = (weight1, out1, col1) if second else (weight, out, col0)
        M = w.shape[0]
        # this thread's first U entries of the row and of the weights, loaded before what they
        # would otherwise wait on (the live-row test, the destination row, the reduction): one
        # trip to memory, not three. The grid keeps r < x.shape[0]. (The same values in the same
        # fma chain and products: the same bits.)
        xs = cuda.local.array(U, float32)
        ws = cuda.local.array(U, float32)
        for u in range(U):
            if t + u * T < M:
                xs[u] = x[r, c0 + t + u * T]
                ws[u] = w[t + u * T]
        if r >= n_rows[0]:
            return  # the whole block leaves together: no thread is left at a barrier
        part = cuda.shared.array(T, float32)
        if second:
            ro = _dest_row(r, mode1, row0_1, seqs1, slot_rows1, layer_row0_1)
        else:
            ro = _dest_row(r, mode0, row0_0, seqs0, slot_rows0, layer_row0_0)
        if ro < 0:
            return  # a row of no sequence: the whole block leaves together
        acc = float32(0.0)
        for u in range(U):                      # ascending k, as _inv_rms: its chain's bits
            if t + u * T < M:
                acc = fma(xs[u], xs[u], acc)
        for k in range(t + U * T, M, T):
            v = x[r, c0 + k]
            acc = fma(v, v, acc)
        inv = _inv_rms_of(acc, M, eps, part, t, T, WARP)
        for u in range(U):
            if t + u * T < M:
                dst[ro, t + u * T] = ws[u] * (xs[u] * inv)
        for k in range(t + U * T, M, T):
            dst[ro, k] = w[k] * (x[r, c0 + k] * inv)

    return kernel


MAX_HEAD_DIM = 256          # the fused per-head norm stages one head in shared memory


@functools.lru_cache(maxsize=None)
def _qkv_norm_rope_kernel(threads):
    """Block (r, g): head g of row r of a stacked q | k | v projection, rows [0, B) the block's
    and rows [B, B + n) new context rows (``enqueue_qkv_norm_rope``)."""
    T = threads
    WARP = _warp_reduction(T)

    @cached
    @cuda.jit
    def kernel(qkv, meta, q_norm, k_norm, eps, inv_freq, interleave, n_q, n_kv, k_cache_all, v_cache_all, single):
        # meta [S, 4] = (s0, n, c0, B) a sequence: rows [0, S B) are the S blocks (sequence z's rows
        # [z B, (z + 1) B)), then the context rows, sequence z's n at [S B + c0, S B + c0 + n)
        # (``single``: one sequence, c0 taken as 0), written into k_cache_all[z] / v_cache_all[z]
        grid_dependency_after((qkv, meta, q_norm, k_norm, eps, inv_freq, interleave, n_q, n_kv, k_cache_all,
                               v_cache_all, single))
        r = cuda.blockIdx.x
        g = cuda.blockIdx.y
        nb = meta[0, 3]                 # block rows a sequence
        blocks = nb * meta.shape[0]     # every sequence's block rows
        z = -1
        if r < blocks:
            if g >= n_q + n_kv:
                return                  # a block row's values stay where they are
            z = r // nb
            j = r - z * nb
            s0, n = meta[z, 0], meta[z, 1]
            pos = s0 + n + j
            c = 0
        else:
            if g < n_q:
                return                  # a context row's query
            cc = r - blocks             # the context row, among all sequences'
            for y in range(meta.shape[0]):
                off = 0 if single else meta[y, 2]
                if off <= cc and cc < off + meta[y, 1]:
                    z = y
            if z < 0:
                return                  # past every sequence's new context rows
            s0 = meta[z, 0]
            c = cc - (0 if single else meta[z, 2])
            pos = s0 + c
        k_cache = k_cache_all[z]
        v_cache = v_cache_all[z]
        # (every return above is block-uniform: no thread is left at a barrier)
        t = cuda.threadIdx.x
        part = cuda.shared.array(T, float32)
        head = cuda.shared.array((1, MAX_HEAD_DIM), float32)
        dh = q_norm.shape[0]
        c0 = g * dh
        if g < n_q + n_kv:              # a query or key head: normed, then rotated
            w = q_norm if g < n_q else k_norm
            inv = _inv_rms(qkv, r, c0, dh, eps, part, t, T, WARP)
            for k in range(t, dh, T):
                head[0, k] = w[k] * (qkv[r, c0 + k] * inv)      # rms_norm's expression
            cuda.syncthreads()          # the normed head is staged (and fully read) before writes
            r2 = dh // 2
            for i in range(t, r2, T):
                cs, sn = _cos_sin(pos, inv_freq[i], 1.0)
                if r < blocks:          # the block's q and k, rotated in place
                    _rotate(head, 0, 0, qkv, r, c0, i, r2, interleave, cs, sn)
                else:                   # a context key, rotated into the cache row s0 + c
                    _rotate(head, 0, 0, k_cache, s0 + c, (g - n_q) * dh, i, r2, interleave, cs, sn)
        else:                           # a context value, copied into the cache row s0 + c
            for k in range(t, dh, T):
                v_cache[s0 + c, (g - n_q - n_kv) * dh + k] = qkv[r, c0 + k]

    return kernel


# -- the device tier (device arrays only, no checks, no allocation; docs/DESIGN.md §3) ----------

def enqueue_rms_norm(x, weight, eps, out, n_rows, *, src_col0=0, out_row0=None, second=None, stream=0):
    """out[row0 + r, :M] = rms_norm(x[r, c0 : c0 + M]) for r < n_rows[0], M = weight.shape[0], c0 =
    ``src_col0`` (e.g. the kv latent of a stacked q | kv projection); twin:
    ``reference.rms_norm.enqueue_rms_norm`` (over ``reference.rms_norm.rms_norm``).

    x [R, Wx >= c0 + M] float32, weight [M] float32, eps float, out [>= row0 + n, Wo >= M] float32
    (columns past M untouched), n_rows [>= 1] int32 device, out_row0 [>= 1] int32 device (row0 =
    out_row0[0], e.g. the cache length) or None (row0 = 0), or a ``PoolRows`` (row r to its
    sequence's row of a flattened cache pool: a batch's latents into every slot in one launch).
    ``second`` = (weight1, out1, src_col1, out_row1: None, a row0 array or a ``PoolRows``): a second norm of the same rows of x, of the M1 =
    weight1.shape[0] columns from ``src_col1`` (e.g. the kv latent of a stacked [T, Q + C + R]
    buffer), with the same eps, in the same launch (each row's bits as if alone). The grid is R
    blocks (x 2 with ``second``).
    """
    if x.shape[0] == 0:
        return
    if second is None:
        weight1, out1, col1, row1 = weight, out, 0, None
    else:
        weight1, out1, col1, row1 = second
    _rms_norm_kernel(THREADS, second is not None)[(x.shape[0], 1 if second is None else 2), THREADS, stream](
        x, weight, np.float32(eps), out, n_rows, int(src_col0), *_dest_rows_args(out_row0, n_rows),
        weight1, out1, int(col1), *_dest_rows_args(row1, n_rows))


def enqueue_qkv_norm_rope(qkv, meta, q_norm, k_norm, eps, inv_freq, *, n_q_heads, n_kv_heads,
                          interleave, k_cache, v_cache, stream=0):
    """Qwen3 attention's per-head q / k norm and RoPE (a DFlash drafter layer), over one stacked
    q | k | v projection of the block rows and the new context rows, in one launch; twin:
    ``reference.rms_norm.enqueue_qkv_norm_rope`` (``reference.rms_norm.head_norm_rope`` per head).

    qkv [B + Nf, (Hq + 2 Hkv) * Dh] float32: rows [0, B) the block (positions s0 + n + j), rows
    [B, B + n) the new context rows (positions s0 + c); meta [>= 4] int32 device = (s0, n, _,
    B); q_norm / k_norm [Dh] float32; inv_freq [Dh/2] float64; k_cache / v_cache [S_cap,
    Hkv*Dh] float32 (this layer's). The block's q and k heads are normed and rotated in place
    (its v untouched); a context row's key is normed and rotated into k_cache[s0 + c] and its
    value copied into v_cache[s0 + c] (its query ignored). Each head's bits equal
    ``enqueue_rms_norm`` over a [rows * heads, Dh] view then ``enqueue_rope`` (the same
    reduction, ``_inv_rms``; the same rotation). The grid is (B + Nf) x (Hq + 2 Hkv) blocks.

    **A batch of sequences** (the batched device round's drafts): meta [S, 4] int32 device =
    (s0, n, c0, B) a sequence, k_cache / v_cache [S, S_cap, Hkv*Dh] (a drafter cache pool's
    layer); qkv's rows [0, S B) are the S blocks, sequence z's at [z B, (z + 1) B), then the
    context rows, sequence z's n of them at S B + c0 + [0, n), into k_cache[z] / v_cache[z].
    """
    if q_norm.shape[0] > MAX_HEAD_DIM:        # the one check: shared memory stages a head
        raise ValueError(f"head dim {q_norm.shape[0]} exceeds MAX_HEAD_DIM = {MAX_HEAD_DIM}")
    if qkv.shape[0] == 0:
        return
    single = meta.ndim == 1
    if single:
        meta, k_cache, v_cache = meta[:4].reshape(1, 4), k_cache.reshape(1, *k_cache.shape), \
            v_cache.reshape(1, *v_cache.shape)
    _qkv_norm_rope_kernel(THREADS)[(qkv.shape[0], n_q_heads + 2 * n_kv_heads), THREADS, stream](
        qkv, meta, q_norm, k_norm, np.float32(eps), inv_freq, bool(interleave), int(n_q_heads),
        int(n_kv_heads), k_cache, v_cache, single)


# -- the public launcher ----------------------------------------------------------------------

def rms_norm(x, weight, eps, *, out=None, stream=0):
    """``weight * x / sqrt(mean(x^2) + eps)`` per row, on the GPU.

    x [T, M] float32, weight [M] float32, eps float >= 0 -> [T, M] float32. numpy in, numpy
    out; device arrays in, device array out (or ``out`` [T, M] float32, filled and returned).
    """
    check_array("x", x, 2, np.float32)
    t, m = x.shape
    check_array("weight", weight, 1, np.float32, shape=(m,))
    if not is_real_number(eps) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"eps must be a finite number >= 0, got {eps!r}")
    y = float32_out(out, (t, m), stream)
    if t and m:
        n_rows = rows_device(t, stream)
        enqueue_rms_norm(to_device(x, stream), to_device(weight, stream), float(eps), y, n_rows,
                          stream=stream)
    return launcher_result(y, out, x, stream)
