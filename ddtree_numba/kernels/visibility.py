"""The tree-attention mask on the GPU; twins: ``reference.visibility``.

Shapes: N+1 tree nodes (root included), W = ceil((N+1) / 32) words per packed row.

Since ``parents[i] < i``, the ancestors of i form a decreasing chain: entry (i, j) walks
from i up while the node is above j, and is set iff it lands on j. At most one walk of
the tree's depth per thread, no shared state.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, uint32

from .._checks import check_array, check_parents_values
from .._device import cached, ceil_div, grid_dependency_after, is_device, to_device

BLOCK = (16, 16)


@cached
@cuda.jit
def _visibility_kernel(parents, vis):
    grid_dependency_after((parents, vis))   # PDL: nothing before it touches global memory (_device.py)
    i, j = cuda.grid(2)
    n = parents.shape[0]
    if i < n and j < n:
        a = i
        while a > j:
            a = parents[a]
        vis[i, j] = a == j


@cached
@cuda.jit
def _visibility_bits_kernel(parents, bits):
    grid_dependency_after((parents, bits))   # PDL: nothing before it touches global memory (_device.py)
    i, w = cuda.grid(2)
    n = parents.shape[0]
    if i < n and w < bits.shape[1]:
        lo = 32 * w
        word = uint32(0)
        a = i
        while a >= lo:  # ancestors decrease: stop once below this word
            if a < lo + 32:
                word |= uint32(1) << uint32(a - lo)
            a = parents[a]
        bits[i, w] = word


def _launch(kernel, parents, cols, dtype, out, stream, block):
    check_array("parents", parents, 1, np.int32)
    check_parents_values(parents)
    n = parents.shape[0]
    if out is None:
        out_dev = cuda.device_array((n, cols), dtype, stream=stream)
    else:
        check_array("out", out, 2, dtype, shape=(n, cols))
        out_dev = out
    if n:
        grid = (ceil_div(n, block[0]), ceil_div(cols, block[1]))
        kernel[grid, block, stream](to_device(parents, stream), out_dev)
    if out is None and not is_device(parents):
        return out_dev.copy_to_host(stream=stream)
    return out_dev


@cached
@cuda.jit
def _pooled_visibility_bits_kernel(parents, seqs, bits):
    """``_visibility_bits_kernel`` for a batch's rows: row r of sequence z (row0 <= r < row0 + t,
    seqs[z] = (s0, t, row0, slot)) is node r - row0 of the tree whose parents are
    parents[row0 .. row0 + t) (numbered within the tree), and its bits are over that tree's
    nodes; a row in no sequence is left as it is."""
    grid_dependency_after((parents, seqs, bits))   # PDL: nothing before it touches global memory (_device.py)
    r, w = cuda.grid(2)
    if r < bits.shape[0] and w < bits.shape[1]:
        for z in range(seqs.shape[0]):
            row0 = seqs[z, 2]
            if row0 <= r and r < row0 + seqs[z, 1]:
                lo = 32 * w
                word = uint32(0)
                a = r - row0
                while a >= lo:  # ancestors decrease: stop once below this word
                    if a < lo + 32:
                        word |= uint32(1) << uint32(a - lo)
                    a = parents[row0 + a]
                bits[r, w] = word


def enqueue_visibility_bits(parents, bits, *, seqs=None, stream=0, block=BLOCK):
    """bits[i] = the packed ancestor mask of node i, from device arrays (no checks, no allocation);
    twin: ``reference.visibility.enqueue_visibility_bits``. parents [N+1] int32, bits [N+1, W] uint32.

    ``seqs`` [S, 4] int32 (s0, t, row0, slot) a sequence: several trees side by side (a batch's
    verify rows, ``CudaTarget.forward_batch``): rows row0 .. row0 + t of parents are a tree over
    its own nodes (parents[row0] = -1, parents[row0 + i] < i), and rows row0 .. row0 + t of bits
    its own mask, as ``bits`` of that tree alone; rows in no sequence are not written."""
    grid = (ceil_div(bits.shape[0], block[0]), ceil_div(bits.shape[1], block[1]))
    if seqs is None:
        _visibility_bits_kernel[grid, block, stream](parents, bits)
    else:
        _pooled_visibility_bits_kernel[grid, block, stream](parents, seqs, bits)


def visibility(parents, *, out=None, stream=0, block=BLOCK):
    """``vis[i, j]`` iff node j is node i or its ancestor: parents [N+1] int32 -> [N+1, N+1] bool."""
    return _launch(_visibility_kernel, parents, parents.shape[0], np.bool_, out, stream, block)


def visibility_bits(parents, *, out=None, stream=0, block=BLOCK):
    """The mask packed in bit rows: parents [N+1] int32 -> bits [N+1, W] uint32."""
    return _launch(_visibility_bits_kernel, parents, (parents.shape[0] + 31) // 32, np.uint32,
                   out, stream, block)
