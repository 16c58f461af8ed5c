"""Glue kernels of the GPU-resident DDTree round (``decode._generate_device``): they move a
round's results from one stage's device buffers to the next stage's, so the host reads only
the accepted tokens. No arithmetic: the stages themselves are the twinned kernels.

Shapes: N tree nodes besides the root (capacity C), T workspace rows (>= C + 1), Y hidden layers
the drafter reads, M hidden size.
"""

from __future__ import annotations

from numba import cuda

THREADS = 128


@cuda.jit
def _verify_inputs_kernel(bonus, tokens, depths, tree_parents, n_nodes, start, ids, positions,
                          parents, meta):
    """The verify forward's inputs for the tree after ``bonus`` at cache row ``start``:
    ids = [bonus, tokens], positions = start + [0, depths], parents = the tree's, then a chain
    over the unused rows; meta = (start, N + 1). ``n_nodes`` [1] int32 device (0: no tree)."""
    i = cuda.grid(1)
    t = n_nodes[0] + 1
    if i < ids.shape[0]:
        if i == 0:
            ids[0] = bonus[0]
            positions[0] = start
            parents[0] = -1
            meta[0] = start
            meta[1] = t
        elif i < t:
            ids[i] = tokens[i - 1]
            positions[i] = start + depths[i - 1]
            parents[i] = tree_parents[i]
        else:
            ids[i] = 0
            positions[i] = 0
            parents[i] = i - 1


@cuda.jit
def _after_accept_kernel(keep, info, tokens, n_nodes, start, start_n, n_new, bonus, report):
    """After ``follow_tree``: start_n = (start, n) for the cache compaction, n_new = n context
    rows for the drafter, bonus = the new bonus, and report = [n, new bonus, N, accepted
    tokens...] for the host (``tokens[keep[j] - 1]``, j = 1 .. n-1)."""
    j = cuda.grid(1)
    n = info[0]
    if j == 0:
        start_n[0] = start
        start_n[1] = n
        n_new[0] = n
        bonus[0] = info[1]
        report[0] = n
        report[1] = info[1]
        report[2] = n_nodes[0]
    elif j < n:
        report[2 + j] = tokens[keep[j] - 1]


@cuda.jit
def _gather_features_kernel(hidden, layer_ids, keep, n_rows, features):
    """features[j, y*M + c] = hidden[layer_ids[y], keep[j], c] for j < n_rows[0]: the target's
    hidden states of the accepted nodes, the drafter's next context rows."""
    j, col = cuda.grid(2)
    M = hidden.shape[2]
    if j < n_rows[0] and col < features.shape[1]:
        y = col // M
        features[j, col] = hidden[layer_ids[y], keep[j], col - y * M]
