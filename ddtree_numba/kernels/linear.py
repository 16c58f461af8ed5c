"""Projections on the GPU (every GEMM of the forward); twin: ``reference.linear.linear``.

Shapes: R rows (tokens or expert slots), K input features, N output features, Z groups
(heads of a per-head projection, or experts).

**The reduction contract (batch invariance, DESIGN.md section 4).** Every output is

    y[r, n] = (((P_0 + P_1) + P_2) + ... + P_{C-1}),   P_c = fma chain over k in chunk c,

with chunks of ``KC`` consecutive k, each chain starting from 0 in ascending k
(``acc = fma(x[r, k], w[n, k], acc)``) and the chunk partials added in ascending c. Nothing in
it depends on how many rows share the launch or how the launch is tiled, so a row's result is
bit-identical alone, in a batch, or as a tree node. Every kernel in this module must produce
exactly these bits; tile shapes may change with R, the order of arithmetic may not.

Weights are stored as float32, float16, or bfloat16 carried as uint16 bit patterns (numpy has
no bfloat16), and widened to float32 in registers. Activations are float32.

Lower-level ``_enqueue_*`` functions take device arrays only, allocate nothing and read the live
row count from a device array, so a captured CUDA graph can replay them for any row count.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32

from .._checks import check_array
from .._device import bf16_to_f32, ceil_div, device_function, fma, is_device, to_device

KC = 64                    # reduction chunk of the contract above (fixed forever: changing it changes bits)
WEIGHT_DTYPES = (np.float32, np.float16, np.uint16)   # uint16 = bfloat16 bits
BLOCK = (32, 4)            # (threads along n, threads along rows)


def _weight_kind(w) -> str:
    """'f32', 'f16' or 'bf16' (uint16 storage) for a weight array; ValueError otherwise."""
    dt = np.dtype(w.dtype)
    if dt == np.float32:
        return "f32"
    if dt == np.float16:
        return "f16"
    if dt == np.uint16:
        return "bf16"
    raise ValueError(f"weights must be float32, float16 or bfloat16 bits (uint16), got {dt}")


@device_function
def _widen_f32(w):
    return w


@device_function
def _widen_f16(w):
    return float32(w)


_WIDEN = {"f32": _widen_f32, "f16": _widen_f16, "bf16": bf16_to_f32}


@device_function
def _exp(v):
    return math.exp(v)


@functools.lru_cache(maxsize=None)
def _gemm_kernel(kind: str, swiglu: bool, accumulate: bool, grouped: bool, gather: bool):
    """The generic projection, group z = blockIdx.z:

        out[j, zo*o_gs + n] (+)= sum_k x[rx, zx*x_gs + k] * w[z, n, k]     (zx = zo = z, or 0
                                                                             when the stride is 0)
    Rows of group z: without ``grouped``, j in [0, n_rows[0]) with x row rx = j; with
    ``grouped``, j in [offsets[z], offsets[z+1]) with rx = ``row_index[j]`` (``gather``) or j.
    ``swiglu``: out = silu(x . w) * (x . w_up), both chains under the contract.
    """
    widen = _WIDEN[kind]

    @cuda.jit
    def kernel(x, x_gs, w, w_up, out, o_gs, n_rows, offsets, row_index):
        n = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        local = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
        z = cuda.blockIdx.z
        N, K = w.shape[1], w.shape[2]
        if grouped:
            j = offsets[z] + local
            if j >= offsets[z + 1]:
                return
        else:
            j = local
            if j >= n_rows[0]:
                return
        if n >= N:
            return
        rx = row_index[j] if gather else j
        xc = z * x_gs
        oc = z * o_gs + n
        y = float32(0.0)
        y_up = float32(0.0)
        for k0 in range(0, K, KC):
            acc = float32(0.0)
            acc_up = float32(0.0)
            for k in range(k0, min(k0 + KC, K)):
                xv = x[rx, xc + k]
                acc = fma(xv, widen(w[z, n, k]), acc)
                if swiglu:
                    acc_up = fma(xv, widen(w_up[z, n, k]), acc_up)
            y = y + acc
            if swiglu:
                y_up = y_up + acc_up
        if swiglu:
            y = y / (float32(1.0) + _exp(-y)) * y_up
        if accumulate:
            out[j, oc] = out[j, oc] + y
        else:
            out[j, oc] = y

    return kernel


def _launch(x, x_gs, w, w_up, out, o_gs, n_rows, offsets, row_index, max_rows, accumulate, stream):
    grouped, gather = offsets is not None, row_index is not None
    kernel = _gemm_kernel(_weight_kind(w), w_up is not None, accumulate, grouped, gather)
    grid = (ceil_div(w.shape[1], BLOCK[0]), max(1, ceil_div(max_rows, BLOCK[1])), w.shape[0])
    idx = n_rows if n_rows is not None else offsets   # stands in for the unused int32 arrays
    kernel[grid, BLOCK, stream](x, x_gs, w, w if w_up is None else w_up, out, o_gs,
                                idx if n_rows is None else n_rows,
                                idx if offsets is None else offsets,
                                idx if row_index is None else row_index)


# -- enqueue API used by the GPU forward (device arrays only, no checks, no allocation) -------
# Every array is C-contiguous and 2-D except the weights ([N, K] or [Z, N, K]).

def _enqueue_linear(x, w, out, n_rows, *, accumulate=False, stream=0):
    """out[:n] (+)= x[:n] @ w.T for n = n_rows[0]. x [R, K] f32, w [N, K], out [R, N] f32,
    n_rows [>=1] int32 device; the grid is sized for R rows."""
    _launch(x, 0, w.reshape(1, *w.shape), None, out, 0, n_rows, None, None, x.shape[0],
            accumulate, stream)


def _enqueue_linear_heads(x, x_group_stride, w, out, n_rows, *, stream=0):
    """Per-group projection for r < n_rows[0] and each group z of w [Z, N, K]:
    out[r, z*N : (z+1)*N] = x[r, z*s : z*s + K] @ w[z].T with s = ``x_group_stride``.
    x [R, >= Z*s] f32, out [R, Z*N] f32 (e.g. the per-head query absorption)."""
    _launch(x, x_group_stride, w, None, out, w.shape[1], n_rows, None, None, x.shape[0],
            False, stream)


def _enqueue_swiglu(x, w_gate, w_up, out, n_rows, *, stream=0):
    """out[r] = silu(x[r] @ w_gate.T) * (x[r] @ w_up.T) for r < n_rows[0].
    x [R, K] f32, w_gate / w_up [I, K], out [R, I] f32."""
    _launch(x, 0, w_gate.reshape(1, *w_gate.shape), w_up.reshape(1, *w_up.shape), out, 0,
            n_rows, None, None, x.shape[0], False, stream)


def _enqueue_grouped(x, w, out, offsets, max_rows, *, row_index=None, w_up=None, stream=0):
    """Grouped (expert) projection: for group z, rows j in [offsets[z], offsets[z+1]):
    out[j] = f(x[row_index[j] if row_index is not None else j] @ w[z].T), f = identity, or
    SwiGLU with ``w_up``. x [Rx, K] f32, w / w_up [Z, N, K], out [Ro, N] f32, offsets [Z+1]
    int32, row_index [Ro] int32; ``max_rows`` bounds the rows of one group (sizes the grid)."""
    _launch(x, 0, w, w_up, out, 0, None, offsets, row_index, max_rows, False, stream)


# -- the public launcher (twin: reference.linear.linear) -------------------------------------

def linear(x, weight, *, out=None, stream=0):
    """``y = x @ weight.T`` on the GPU under the reduction contract above.

    x [T, K] float32, weight [N, K] float32 / float16 / uint16 (bfloat16 bits) -> y [T, N]
    float32. numpy in, numpy out; device arrays in, device array out.
    """
    check_array("x", x, 2, np.float32)
    _weight_kind(weight)
    check_array("weight", weight, 2, weight.dtype)
    t, k = x.shape
    if weight.shape[1] != k:
        raise ValueError(f"weight has {weight.shape[1]} input features but x has {k}")
    n = weight.shape[0]
    if out is None:
        y = cuda.device_array((t, n), np.float32, stream=stream)
    else:
        check_array("out", out, 2, np.float32, shape=(t, n))
        y = out
    if t and n:
        n_rows = to_device(np.array([t], np.int32), stream)
        _enqueue_linear(to_device(x, stream), to_device(weight, stream), y, n_rows, stream=stream)
    if out is None and not is_device(x):
        return y.copy_to_host(stream=stream)
    return y
