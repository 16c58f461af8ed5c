"""The tree-attention mask (docs/DESIGN.md §1, step 4).

Shapes: N+1 tree nodes (root included), W = ceil((N+1) / 32) words per packed row.
"""

from __future__ import annotations

import numpy as np

from .._checks import check_array, check_parents_values


def visibility(parents: np.ndarray) -> np.ndarray:
    """``vis[i, j]`` is true iff node j is node i or one of its ancestors.

    parents [N+1] int32 (``parents[0] = -1``) -> vis [N+1, N+1] bool. Because
    ``parents[i] < i``, row i is row ``parents[i]`` plus the diagonal entry.
    """
    check_array("parents", parents, 1, np.int32)
    check_parents_values(parents)
    n = parents.shape[0]
    vis = np.zeros((n, n), dtype=bool)                                # [N+1, N+1]
    for i in range(n):
        if i:
            vis[i] = vis[parents[i]]
        vis[i, i] = True
    return vis


def visibility_bits(parents: np.ndarray) -> np.ndarray:
    """The same mask packed into bit rows: bit ``j % 32`` of ``bits[i, j // 32]`` is ``vis[i, j]``.

    parents [N+1] int32 -> bits [N+1, W] uint32. This is the form tree attention reads.
    """
    vis = visibility(parents)                                         # [N+1, N+1]
    n = vis.shape[0]
    w = (n + 31) // 32
    padded = np.zeros((n, w * 32), dtype=np.uint64)
    padded[:, :n] = vis
    weights = np.uint64(1) << np.arange(32, dtype=np.uint64)          # [32]
    return (padded.reshape(n, w, 32) * weights).sum(axis=2).astype(np.uint32)  # [N+1, W]


def enqueue_visibility_bits(parents, bits, *, seqs=None, stream=0, block=None) -> None:
    """bits[:] = visibility_bits(parents), words past the tree's zero; twin of
    ``kernels.visibility.enqueue_visibility_bits`` (its signature, numpy arrays: ``block`` and
    ``stream`` are the kernel's). parents [N+1] int32, bits [N+1, W >= ceil((N+1)/32)] uint32.
    ``seqs`` [S, 4] int32 (s0, t, row0, slot) a tree: rows row0 .. row0 + t are that tree alone
    (its parents numbered within it), the other rows left as they are."""
    if seqs is None:
        seqs = np.array([[0, parents.shape[0], 0, 0]], np.int32)
        bits[:] = 0
    for _, t, row0, _ in np.asarray(seqs):
        if t:
            packed = visibility_bits(np.asarray(parents[row0:row0 + t], np.int32))   # [t, w]
            bits[row0:row0 + t] = 0
            bits[row0:row0 + t, :packed.shape[1]] = packed
