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


def build_tree_levels(lp: np.ndarray, ids: np.ndarray, budget: int) -> Tree:
    """``build_tree``'s tree, bit for bit, by a level-synchronous algorithm with no sequential
    pop chain: the numpy twin of a parallel build (issue 15).

    Order nodes by the key (-score, rank path), the heapq's. The tree is the first ``budget`` = B
    nodes G in that order, and G is prefix-closed (a child's score is fl(parent + lp) <= the
    parent's, and on a tie the parent's path is a prefix, so smaller). Level by level:

    - S_1 = the best B depth-1 nodes; S_d = the best B of the children of S_{d-1}, where a child
      (p, r) of parent p scores fl(score(p) + lp[d-1, r]) and compares by (-score, lex(p), r),
      lex(p) the parent's rank among S_{d-1} by rank path (children of one depth compare by their
      parents' paths first, then by their own rank).
    - G_d (G at depth d) is inside S_d: G_d's parents are in G_{d-1}, inside S_{d-1} by induction;
      and a node of G has fewer than B nodes before it, so it is among the best B of any set
      holding it.
    - So G is the best B of the union of the S_d, in the key (-score, preorder), preorder being
      the rank-path order across depths (the union is a tree: a parent's preorder, then its
      children's subtrees in rank order).

    Every step is a sort or a segmented scan over at most B x min(K, B) candidates per level, L
    levels in sequence: what a GPU does with many threads a level.
    """
    budget = check_build_inputs(lp, ids, budget)
    L, K = lp.shape
    lp64 = lp.astype(np.float64)
    R = min(K, budget)                                 # ranks a parent can contribute
    levels = []                                        # per depth: score, parent (index into the level above), rank, lex
    prev_score, prev_lex = np.zeros(1), np.zeros(1, np.int64)      # the root
    for d in range(L if budget and K else 0):
        P = prev_score.shape[0]
        parent = np.repeat(np.arange(P), R)                          # [P*R]
        rank = np.tile(np.arange(R), P)                              # [P*R]
        score = (prev_score[:, None] + lp64[d, :R][None, :]).reshape(-1)   # fl(parent + lp), as the heap
        best = np.lexsort((rank, prev_lex[parent], -score))[:budget]       # key (-score, lex(p), r)
        parent, rank, score = parent[best], rank[best], score[best]
        lex = np.empty(best.shape[0], np.int64)                      # rank-path order within the level
        lex[np.lexsort((rank, prev_lex[parent]))] = np.arange(best.shape[0])
        levels.append((score, parent, rank, lex))
        prev_score, prev_lex = score, lex
    if not levels:
        return Tree(tokens=np.zeros(0, np.int32), depths=np.zeros(0, np.int32), parents=np.array([-1], np.int32),
                    ranks=np.zeros(0, np.int32), scores=np.zeros(0, np.float64))
    # preorder of the union tree: subtree sizes bottom-up, then each node's position top-down
    sizes = [np.ones(lv[0].shape[0], np.int64) for lv in levels]
    for d in range(len(levels) - 1, 0, -1):
        np.add.at(sizes[d - 1], levels[d][1], sizes[d])
    pre, parent_pre = [], np.zeros(1, np.int64)                   # the root at preorder 0
    for d, (score, parent, rank, lex) in enumerate(levels):
        order = np.argsort(lex)                                      # siblings contiguous, by rank
        before = np.zeros(order.shape[0], np.int64)                  # sizes of earlier siblings
        csum = np.cumsum(sizes[d][order]) - sizes[d][order]
        first = np.r_[True, parent[order][1:] != parent[order][:-1]]
        group_start = np.maximum.accumulate(np.where(first, np.arange(order.shape[0]), 0))
        before[order] = csum - csum[group_start]
        pre.append(parent_pre[parent] + 1 + before)
        parent_pre = pre[-1]
    # the best B of the union, in the key (-score, preorder): the nodes in pop order
    depth = np.concatenate([np.full(lv[0].shape[0], d + 1) for d, lv in enumerate(levels)])
    index = np.concatenate([np.arange(lv[0].shape[0]) for lv in levels])
    score = np.concatenate([lv[0] for lv in levels])
    order = np.lexsort((np.concatenate(pre), -score))[:budget]
    node_of = [np.zeros(lv[0].shape[0], np.int64) for lv in levels]     # level index -> node number
    for n, o in enumerate(order, start=1):
        node_of[depth[o] - 1][index[o]] = n
    tokens, depths, parents, ranks = [], [], [-1], []
    for o in order:
        d, i = int(depth[o]), int(index[o])
        _, parent, rank, _ = levels[d - 1]
        tokens.append(ids[d - 1, rank[i]]); depths.append(d); ranks.append(rank[i])
        parents.append(0 if d == 1 else int(node_of[d - 2][parent[i]]))
    return Tree(tokens=np.asarray(tokens, np.int32), depths=np.asarray(depths, np.int32),
                parents=np.asarray(parents, np.int32), ranks=np.asarray(ranks, np.int32),
                scores=score[order].astype(np.float64))


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
