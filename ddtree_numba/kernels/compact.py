"""KV-cache compaction on the GPU; twin: ``reference.compact.compact_rows``.

Shapes: S cache rows, W row width, n accepted nodes.

``rows[start + i] = rows[start + keep[i]]`` with ``keep[i] >= i``. One thread per row in
place races (thread i reads row ``keep[i]`` while thread ``keep[i]`` writes it), so two
safe schemes:

- ``columns``: one thread per column walks the rows in increasing i. Row ``start+keep[i]``
  is read at step i, and the only writes before it went to rows ``start+i' < start+i <=
  start+keep[i]``, so nothing it reads was overwritten. One launch, no scratch; a stack of
  layers [layers, S, W] (a cache) in the same launch, a block row per layer.
- ``scratch``: gather every kept row into a scratch buffer, then copy back (two launches:
  the launch boundary is the grid-wide barrier the in-place gather lacks).

``start`` and ``n`` travel in a small device array ``start_n = (start, n)`` so a captured
CUDA graph can replay the compaction for any round.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .._checks import check_array, check_compact_inputs
from .._device import cached, ceil_div, device_function, grid_dependency_after, is_device, to_device

THREADS = 128
BLOCK_2D = (4, 64)
METHODS = ("columns", "scratch")


@device_function
def _compact_column(rows, start_n, keep, per_group, layer, c):
    """Column c of layer ``layer`` of rows [layers, S, W], in increasing i (the columns scheme);
    the layer's group g = layer // per_group takes (start, n) = start_n[g] and keep[g]."""
    if layer < rows.shape[0] and c < rows.shape[2]:
        g = layer // per_group
        start = start_n[g, 0]
        n = start_n[g, 1]
        # increasing i, four rows read before any of them is written: a row read at step i is
        # keep[i] >= i, and the writes before it reached rows below the four (a read of a row
        # from L2 is the loop's long link, and four in flight take a quarter of the chain)
        for i in range(1, n, 4):
            s0 = keep[g, i]
            s1 = keep[g, i + 1] if i + 1 < n else i + 1
            s2 = keep[g, i + 2] if i + 2 < n else i + 2
            s3 = keep[g, i + 3] if i + 3 < n else i + 3
            v0 = rows[layer, start + s0, c]
            v1 = rows[layer, start + s1, c] if s1 != i + 1 else v0
            v2 = rows[layer, start + s2, c] if s2 != i + 2 else v0
            v3 = rows[layer, start + s3, c] if s3 != i + 3 else v0
            if s0 != i:
                rows[layer, start + i, c] = v0
            if s1 != i + 1:
                rows[layer, start + i + 1, c] = v1
            if s2 != i + 2:
                rows[layer, start + i + 2, c] = v2
            if s3 != i + 3:
                rows[layer, start + i + 3, c] = v3


@cached
@cuda.jit
def _compact_rows_columns_kernel(rows, start_n, keep, per_group, rows2, per_group2, blocks):
    """rows [layers, S, W]: one thread per (column, layer) (grid y = layer), so a cache's every
    layer compacts in one launch (a pool's every slot too: layer l takes group l // per_group's
    start_n and keep); the grid's blocks from ``blocks`` on take rows2 [layers2, S2, W2] alike (a
    second array of the same rows, e.g. the rope keys beside the latents)."""
    grid_dependency_after((rows, start_n, keep, per_group, rows2, per_group2, blocks))   # PDL (_device.py)
    layer = cuda.blockIdx.y
    b = cuda.blockIdx.x
    if b < blocks:
        _compact_column(rows, start_n, keep, per_group, layer, b * cuda.blockDim.x + cuda.threadIdx.x)
    else:
        _compact_column(rows2, start_n, keep, per_group2, layer, (b - blocks) * cuda.blockDim.x + cuda.threadIdx.x)


@cached
@cuda.jit
def _compact_rows_gather_kernel(rows, start_n, keep, scratch):
    grid_dependency_after((rows, start_n, keep, scratch))   # PDL: nothing before it touches global memory (_device.py)
    i, c = cuda.grid(2)
    if i < start_n[1] and c < rows.shape[1]:
        scratch[i, c] = rows[start_n[0] + keep[i], c]


@cached
@cuda.jit
def _compact_rows_copy_back_kernel(rows, start_n, scratch):
    grid_dependency_after((rows, start_n, scratch))   # PDL: nothing before it touches global memory (_device.py)
    i, c = cuda.grid(2)
    if i < start_n[1] and c < rows.shape[1]:
        rows[start_n[0] + i, c] = scratch[i, c]


@cached
@cuda.jit
def _compact_rows_naive_kernel(rows, start_n, keep):
    """UNSAFE, kept to demonstrate the hazard: one thread per (row, column), in place."""
    grid_dependency_after((rows, start_n, keep))   # PDL: nothing before it touches global memory (_device.py)
    i, c = cuda.grid(2)
    if i < start_n[1] and c < rows.shape[1]:
        rows[start_n[0] + i, c] = rows[start_n[0] + keep[i], c]


# -- the device tier (device arrays only, no checks, no allocation; docs/DESIGN.md §3) ----------

def enqueue_compact_rows(rows, start_n, keep, *, n_max, method="columns", scratch=None, second=None, stream=0):
    """rows[start + i] = rows[start + keep[i]] for i < n, (start, n) = start_n[0:2], on the device;
    twin: ``reference.compact.enqueue_compact_rows``.

    rows [S, W] contiguous, or (``columns`` only) [layers, S, W]: every layer's rows move alike,
    in one launch (a cache's layers). start_n [2] int32 device, keep [>= n] int32 device; ``n_max``
    bounds n (it sizes the grid of the scratch scheme, whose ``scratch`` is [>= n_max, W] of rows'
    dtype). ``second`` (``columns`` only): another such array of rows' dtype ([S2, W2] or [layers2,
    S2, W2]) whose rows move alike, in the same launch (a cache's rope keys beside its latents).

    **Groups** (``columns`` only; a cache pool's slots in one launch): start_n [G, 2] and keep
    [G, >= n_g] split the layers of rows (and of ``second``) into G equal runs, run g moved by
    (start, n) = start_n[g] and keep[g].
    """
    W = rows.shape[rows.ndim - 1]          # (the simulator's shapes take no negative index)
    if method == "columns":
        stack, stack2 = (a if a.ndim == 3 else a.reshape((1,) + tuple(a.shape))
                         for a in (rows, rows if second is None else second))
        if start_n.ndim == 1:
            start_n, keep = start_n.reshape(1, 2), keep.reshape(1, keep.shape[0])
        G = start_n.shape[0]
        if keep.shape[0] != G or stack.shape[0] % G or stack2.shape[0] % G:
            raise ValueError(f"start_n gives {G} groups: keep must have {G} rows ({keep.shape[0]}) and each "
                             f"array's layers ({stack.shape[0]}, {stack2.shape[0]}) split into {G} equal runs")
        blocks = ceil_div(W, THREADS)
        grid = (blocks + (0 if second is None else ceil_div(stack2.shape[2], THREADS)),
                max(stack.shape[0], stack2.shape[0]))
        _compact_rows_columns_kernel[grid, THREADS, stream](stack, start_n, keep, stack.shape[0] // G,
                                                            stack2, stack2.shape[0] // G, blocks)
    elif method == "scratch":
        if second is not None:
            raise ValueError("second: the columns scheme compacts two arrays in one launch, not the scratch one")
        if rows.ndim != 2:
            raise ValueError(f"the scratch scheme compacts one [S, W] array, got {rows.ndim} dimensions")
        if start_n.ndim != 1:
            raise ValueError("groups (a 2-D start_n): the columns scheme, not the scratch one")
        grid = (ceil_div(n_max, BLOCK_2D[0]), ceil_div(W, BLOCK_2D[1]))
        _compact_rows_gather_kernel[grid, BLOCK_2D, stream](rows, start_n, keep, scratch)
        _compact_rows_copy_back_kernel[grid, BLOCK_2D, stream](rows, start_n, scratch)
    else:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def compact_rows(rows, start, keep, *, method="columns", scratch=None, stream=0):
    """In place ``rows[start + i] = rows[start + keep[i]]``, race-free, on the GPU.

    rows [S, W] (numpy, any strides: copied over and back; device: updated in place), start int,
    keep [n] int32 (keep[0] = 0, strictly increasing). ``method`` is ``"columns"`` or
    ``"scratch"``; the scratch scheme takes an optional ``scratch`` device array [>= n, W].
    """
    start = check_compact_inputs(rows, start, keep)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    n = keep.shape[0]
    if method == "scratch":
        if scratch is None:
            scratch = cuda.device_array((n, rows.shape[1]), rows.dtype, stream=stream)
        check_array("scratch", scratch, 2, rows.dtype)
        if scratch.shape[0] < n or scratch.shape[1] != rows.shape[1]:
            raise ValueError(f"scratch has shape {tuple(scratch.shape)}; need at least ({n}, {rows.shape[1]})")
    d_rows = to_device(rows, stream)
    start_n = to_device(np.array([start, n], np.int32), stream)
    if n and rows.shape[1]:
        enqueue_compact_rows(d_rows, start_n, to_device(keep, stream), n_max=n, method=method, scratch=scratch,
                             stream=stream)
    if not is_device(rows):
        # (a strided view, rows[:, ::2], cannot take the copy: back through a contiguous one)
        back = rows if rows.flags.c_contiguous else np.empty(rows.shape, rows.dtype)
        d_rows.copy_to_host(back, stream=stream)
        if stream:
            stream.synchronize()
        if back is not rows:
            rows[...] = back
