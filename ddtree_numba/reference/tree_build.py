"""Best-first draft-tree construction (docs/DESIGN.md §1, step 3).

Shapes: L depths, K ranks per depth, N nodes besides the root.

A node is a rank path ``(r1, .., rd)``; its score is ``sum_i lp[i-1, r_i]`` summed in
float64 in path order. Popping the best path and pushing its next sibling and its first
child visits paths in the total order (score descending, then rank path ascending),
because each pushed path scores no higher than the path that pushed it and is
lexicographically larger. So the tree is exactly the ``budget`` best paths, numbered in
that order: ``enumerate_paths`` checks this by brute force.
"""

from __future__ import annotations

import heapq
import itertools

import numpy as np

from .._checks import check_build_inputs
from ..tree import Tree


def build_tree(lp: np.ndarray, ids: np.ndarray, budget: int) -> Tree:
    """The ``budget`` best rank paths as a tree, numbered in best-first pop order.

    lp [L, K] float32 (each row descending), ids [L, K] int32 -> Tree with N = min(budget,
    number of paths) nodes. The heap holds ``(-score, rank path)``: Python compares tuples
    lexicographically, which is exactly the tie rule.
    """
    budget = check_build_inputs(lp, ids, budget)
    L, K = lp.shape
    lp64 = lp.astype(np.float64)
    tokens, depths, parents, ranks, scores = [], [], [-1], [], []
    node_of_path = {(): 0}
    heap = [(-lp64[0, 0], (0,))] if L and K and budget else []
    while heap and len(tokens) < budget:
        neg, path = heapq.heappop(heap)
        score, d, r = -neg, len(path), path[-1]
        node_of_path[path] = len(tokens) + 1
        tokens.append(ids[d - 1, r]); depths.append(d); ranks.append(r); scores.append(score)
        parents.append(node_of_path[path[:-1]])
        if r + 1 < K:  # next sibling: same parent, next rank
            parent_score = scores[parents[-1] - 1] if d > 1 else 0.0
            heapq.heappush(heap, (-(parent_score + lp64[d - 1, r + 1]), path[:-1] + (r + 1,)))
        if d < L:  # first child
            heapq.heappush(heap, (-(score + lp64[d, 0]), path + (0,)))
    return Tree(
        tokens=np.asarray(tokens, np.int32),
        depths=np.asarray(depths, np.int32),
        parents=np.asarray(parents, np.int32),
        ranks=np.asarray(ranks, np.int32),
        scores=np.asarray(scores, np.float64),
    )


def enumerate_paths(lp: np.ndarray) -> list[tuple[float, tuple[int, ...]]]:
    """Every rank path with its float64 score, sorted best first (brute force, for tests).

    There are sum_d K**d paths: keep L and K small.
    """
    L, K = lp.shape
    lp64 = lp.astype(np.float64)
    out = []
    for d in range(1, L + 1):
        for path in itertools.product(range(K), repeat=d):
            s = 0.0
            for i, r in enumerate(path):
                s = s + lp64[i, r]
            out.append((s, path))
    out.sort(key=lambda sp: (-sp[0], sp[1]))
    return out
