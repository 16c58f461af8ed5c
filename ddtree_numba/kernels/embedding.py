"""Token embedding and the output head on the GPU; twins: ``reference.embedding.embedding`` and
``lm_head``.

Shapes: T tokens (R buffer rows, n = n_rows[0] live), M hidden size, V vocab.

Tables and head weights are stored as float32, float16, or bfloat16 carried as uint16 bits, and
widened to float32. The head is a projection like any other: it goes through
``kernels.linear.enqueue_linear`` and its reduction contract (batch invariant), not a GEMM of
its own.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import config, cuda

from .._checks import check_array
from .._device import cached, float32_out, grid_dependency_after, is_device, launcher_result, rows_device, to_device
from ._widen import WIDEN, _weight_kind
from .linear import linear

# Threads per block (one block per row; hidden 2048 = 8 columns a thread). The simulator runs
# every thread as a Python thread, so it gets a small block.
THREADS = 8 if config.ENABLE_CUDASIM else 256


@functools.lru_cache(maxsize=None)
def _embedding_kernel(kind: str):
    widen = WIDEN[kind]

    @cached
    @cuda.jit
    def kernel(ids, table, out, n_rows):
        grid_dependency_after((ids, table, out, n_rows))   # PDL: nothing before it touches global memory (_device.py)
        r = cuda.blockIdx.x
        if r >= n_rows[0]:
            return
        v = ids[r]
        V, M = table.shape
        if v < 0 or v >= V:
            # a bad id on the device (the launcher checks host ids): NaN, never a stray read
            for k in range(cuda.threadIdx.x, M, cuda.blockDim.x):
                out[r, k] = math.nan
            return
        for k in range(cuda.threadIdx.x, M, cuda.blockDim.x):
            out[r, k] = widen(table[v, k])

    return kernel


# -- the device tier (device arrays only, no checks, no allocation; docs/DESIGN.md §3) ----------

def enqueue_embedding(ids, table, out, n_rows, *, stream=0):
    """out[r] = table[ids[r]] widened to float32, for r < n_rows[0]; twin:
    ``reference.embedding.enqueue_embedding``.

    ids [R] int32 device (an id outside [0, V) gives a NaN row), table [V, M] float32 /
    float16 / uint16 (bfloat16 bits), out [R', M] float32 (R' >= n), n_rows [>= 1] int32
    device. The grid is R blocks.
    """
    if ids.shape[0] == 0:
        return
    _embedding_kernel(_weight_kind(table))[ids.shape[0], THREADS, stream](ids, table, out, n_rows)


# -- the public launchers -----------------------------------------------------------------------

def embedding(ids, table, *, out=None, stream=0):
    """Row gather ``x[t] = table[ids[t]]`` widened to float32, on the GPU.

    ids [T] int32 / int64 in [0, V), table [V, M] float32 / float16 / uint16 (bfloat16 bits)
    -> x [T, M] float32. Host ids are checked for range; numpy in, numpy out.
    """
    check_array("ids", ids, 1, (np.int32, np.int64))
    if not hasattr(table, "dtype"):
        raise ValueError(f"table must be float32, float16 or bfloat16 bits (uint16), got {type(table).__name__}")
    _weight_kind(table, "table")
    check_array("table", table, 2, table.dtype)
    v, m = table.shape
    if not is_device(ids):
        if ids.size and (ids.min() < 0 or ids.max() >= v):
            bad = ids[(ids < 0) | (ids >= v)][0]
            raise ValueError(f"ids holds {bad}, outside the vocabulary [0, {v})")
        ids = ids.astype(np.int32, copy=False)
    t = ids.shape[0]
    y = float32_out(out, (t, m), stream)
    if t and m:
        n_rows = rows_device(t, stream)
        enqueue_embedding(to_device(ids, stream), to_device(table, stream), y, n_rows, stream=stream)
    return launcher_result(y, out, ids, stream)


def lm_head(x, weight, *, precision="fp32", out=None, stream=0):
    """Logits ``x @ weight.T`` from the final-normed hidden state, on the GPU (the projection
    contract of ``kernels.linear``).

    x [T, M] float32, weight [V, M] float32 / float16 / uint16 (bfloat16 bits) -> logits
    [T, V] float32. numpy in, numpy out; device arrays in, device array out.
    """
    return linear(x, weight, precision=precision, out=out, stream=stream)
