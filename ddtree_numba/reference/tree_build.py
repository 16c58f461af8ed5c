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

from .._checks import check_batch_build_inputs, check_build_inputs, check_int
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
    # a path's score is 0.0 (the root's) + its log-probs, as the kernels and the level build add
    # them: 0.0 + -0.0 is +0.0, so a chain of -0.0 rows scores +0.0 everywhere
    heap = [(-(0.0 + lp64[0, 0]), (0,))] if L and K and budget else []
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


def build_trees(lp: np.ndarray, ids: np.ndarray, budget: int) -> list[Tree]:
    """``build_tree`` for each sequence of a batch: lp [S, L, K] float32, ids [S, L, K] int32 ->
    S trees, in order (the kernel builds them in one launch, a block each)."""
    budget = check_batch_build_inputs(lp, ids, budget)
    return [build_tree(lp[s], ids[s], budget) for s in range(lp.shape[0])]


def _kth_largest(scores: np.ndarray, k: int) -> float:
    """The k-th largest of ``scores`` counted with multiplicity (a GPU radix-selects it); -inf
    when there are fewer than k."""
    if scores.shape[0] < k:
        return -np.inf
    return float(np.partition(scores, scores.shape[0] - k)[scores.shape[0] - k])


def select_level(prev_score: np.ndarray, row: np.ndarray, budget: int) -> np.ndarray:
    """How many children each parent keeps, c [P]: the level's best ``budget`` children in the key
    (-score, parent's path order, rank), parents given in path order with scores ``prev_score``
    [P] float64, ``row`` = lp[d, :R] float64 descending. Parent p's children score fl(s_p + row[r]),
    non-increasing in r, so each parent keeps a prefix of its ranks.

    1. Threshold T, the budget-th largest child score, from a small candidate set: with parents
       ranked by score (i = 0 the best), child (i, r) is kept as a candidate iff (i+1)(r+1) <=
       budget (at most budget x H(budget) of them: 7.5 k at 1024). Exact: every (j, r') with j <= i,
       r' <= r scores >= child (i, r) (rounding is monotone); if (i+1)(r+1) > budget, at least
       budget of those are candidates (a count of lattice points under the hyperbola), so a child
       left out never scores above the candidates' budget-th score: T is the full set's.
    2. Per parent, by binary search over all R ranks: gt_p children score > T, ge_p >= T. Every
       child above T is kept; m = budget - sum(gt) of the ties at T are kept in path order, i.e.
       parents in path order (an exclusive prefix sum of their ties) and ranks ascending.
    """
    P, R = prev_score.shape[0], row.shape[0]
    by_score = np.argsort(-prev_score, kind="stable")          # any order of equal scores works
    caps = np.minimum(R, budget // (np.arange(P) + 1))         # ranks kept of the i-th best parent
    cand = np.concatenate([prev_score[p] + row[:c] for p, c in zip(by_score, caps)]) if P else np.zeros(0)
    T = _kth_largest(cand, budget)
    child = prev_score[:, None] + row[None, :]                  # [P, R] (a GPU binary-searches instead)
    gt = (child > T).sum(axis=1)
    ge = (child >= T).sum(axis=1)
    ties = ge - gt
    m = budget - gt.sum()
    before = np.cumsum(ties) - ties                             # ties of earlier parents, path order
    return gt + np.clip(m - before, 0, ties)


def children_at_least(prev_score: np.ndarray, row: np.ndarray, tau: float) -> np.ndarray:
    """How many ranks of each parent score fl(s_p + row[r]) >= tau, c [P] (a GPU binary-searches:
    the sums do not increase with r)."""
    return (prev_score[:, None] + row[None, :] >= tau).sum(axis=1)


# The level build's seed (``family_seed``): candidates a round and rounds of its search
SEED_CANDIDATES = 16
SEED_ROUNDS = 3


def family_count(lp64: np.ndarray, R: int, v: np.ndarray) -> np.ndarray:
    """How many nodes of the seed family score >= each value of v [C] float64 -> [C] int64.

    The family: for each deviation depth d and stop depth e >= d, the paths (0, .., 0, r, 0, .., 0)
    with rank r at depth d (r >= 1 when e > d, so the chain is counted once, at e = d) and zeros
    below it to depth e. Their scores are the tree's own, summed in path order (the chain, then
    lp[d, r], then each lp[i, 0]), and fall as r grows: each (d, e) list is counted by a binary
    search (a GPU does; here every entry is summed)."""
    L = lp64.shape[0]
    v = np.asarray(v, np.float64)
    counts = np.zeros(v.shape[0], np.int64)
    chain = 0.0
    for d in range(L):
        s = chain + lp64[d, :R]                        # [R] the lists (d, e), e = d, d + 1, ...
        for e in range(d, L):
            if e > d:
                s = s + lp64[e, 0]
            first = 0 if e == d else 1
            counts += (s[first:, None] >= v[None, :]).sum(axis=0)
        chain = chain + lp64[d, 0]
    return counts


def family_seed(lp64: np.ndarray, R: int, budget: int) -> float:
    """A starting bound for the level build: a value at or below which at least ``budget`` real
    nodes score (so at or below the tree's budget-th best score, T), found without building
    anything, or -inf. The largest such value of the seed family (``family_count``) is bracketed by
    a search of ``SEED_ROUNDS`` rounds of ``SEED_CANDIDATES`` evenly spaced values, from [the
    family's lowest score, the best node's]; a candidate counts only if the family holds budget
    nodes at or above it, so any result is valid. Candidates are made by repeated addition (no
    multiply-add a compiler could fuse), so a GPU makes the same ones."""
    L = lp64.shape[0]
    if L == 0 or R == 0 or L * R + (L * (L - 1) // 2) * (R - 1) < budget:
        return -np.inf
    lows, chain = [], 0.0                              # the lists' last entries: the lowest scores
    for d in range(L):
        s = chain + lp64[d, R - 1]
        lows.append(s)
        for e in range(d + 1, L):
            s = s + lp64[e, 0]
            lows.append(s)
        chain = chain + lp64[d, 0]
    good, bad = float(min(lows)), float(lp64[0, 0])    # every family node scores >= good
    for _ in range(SEED_ROUNDS):
        step = (bad - good) / SEED_CANDIDATES
        v = np.empty(SEED_CANDIDATES - 1)
        x = good
        for j in range(SEED_CANDIDATES - 1):
            x = x + step
            v[j] = x
        ok = family_count(lp64, R, v) >= budget        # a prefix of the candidates
        n_ok = int(ok.sum())
        if n_ok:
            good = v[n_ok - 1]
        if n_ok < SEED_CANDIDATES - 1:
            bad = v[n_ok]
    return float(good)


TIE_SLOTS = 256   # at most this many tied nodes placed by path compares by default (``few_ties_limit``)
TIE_SHARE = 4     # ... and at most budget / TIE_SHARE of them by default (``few_ties_limit``)


def few_ties_limit(budget: int) -> int:
    """The default ``tie_slots`` of a level build of ``budget`` nodes: min(TIE_SLOTS, budget //
    TIE_SHARE). Path compares cost ~0.13 µs a tied node when their scores fall in a few large
    classes (an H200, logits rounded to 1/8: 252 tied nodes 51 µs at budget 256 against 30 by
    preorder; the preorder path costs ~12 µs more than no tie at 256, ~34 more at 1024), so past
    about budget / 4 of them the preorder path is the faster. Both give the same tree."""
    return min(TIE_SLOTS, budget // TIE_SHARE)


def tied_count(score: np.ndarray, top: np.ndarray, T: float) -> int:
    """How many nodes ``_order_few_ties`` calls tied: those scoring T, and those above T whose
    score another of the B best ``top`` (descending) also has. Every node above T is in ``top``,
    once, so the second are the entries of ``top`` above T equal to a neighbour: one pass over the
    level scores and one over ``top``, as the GPU counts them before choosing its path."""
    above = top > T
    dup = np.zeros(top.shape[0], bool)
    dup[1:] |= top[1:] == top[:-1]
    dup[:-1] |= top[:-1] == top[1:]
    return int((score == T).sum()) + int((above & dup).sum())


def _path_less(levels: list, da: int, ia: int, db: int, ib: int) -> bool:
    """Whether node (depth index da, level index ia) comes before (db, ib) in preorder, i.e. by
    rank path, a prefix first. Each level is laid out in path order, so the deeper node's ancestor
    at the other's depth settles it by index: equal means the shallower one is its ancestor."""
    a, b = ia, ib
    for d in range(da, db, -1):
        a = levels[d]["parent"][a]
    for d in range(db, da, -1):
        b = levels[d]["parent"][b]
    return a < b or (a == b and da < db)


def _order_few_ties(levels: list, score: np.ndarray, depth: np.ndarray, index: np.ndarray, T: float,
                    budget: int, top: np.ndarray, slots: int) -> np.ndarray | None:
    """``build_tree_levels``' pop order when a few scores tie (the common tie case, as a float32
    draft gives): no subtree sizes, no preorder, no sort. Every node scoring >= T has place j0 =
    the number of the B best scores ``top`` above its own (all nodes above it score > T, so are
    in G). A node is *tied* if it scores T or another of the B best equals its score; an untied
    one sits at j0. A tied one's offset is the number of tied nodes of its score before it by rank
    path (``_path_less``): it sits at j0 + offset, and a node at T is in G only while its offset
    is below B minus the nodes above T. None if more than ``slots`` nodes are tied (``tied_count``,
    counted first, as the GPU does; it keeps them in shared memory): then ``_order_with_ties``.
    Returns indices into ``score``."""
    count = tied_count(score, top, T)
    if count > slots:
        return None
    n = top.shape[0]
    order = np.full(n, -1, np.int64)
    tied = []
    for o in np.flatnonzero(score >= T):
        s = score[o]
        j0 = int((top > s).sum())
        if s == T or (j0 + 1 < n and top[j0 + 1] == s):
            tied.append(o)
        else:
            order[j0] = o
    assert len(tied) == count
    above = int((score > T).sum())
    for o in tied:
        s = score[o]
        offset = sum(1 for f in tied if score[f] == s and
                     _path_less(levels, depth[f] - 1, index[f], depth[o] - 1, index[o]))
        if s > T or offset < budget - above:
            order[int((top > s).sum()) + offset] = o
    return order


def _order_with_ties(levels: list, score: np.ndarray, T: float, budget: int) -> np.ndarray:
    """``build_tree_levels``' pop order when scores tie among the B best (or at the B-th): the key
    (-score, preorder). Subtree sizes bottom-up (a node's children are the contiguous run [start,
    start + keep) below), preorder top-down (the parent's + 1 + the sizes of earlier siblings; the
    root at 0); then the nodes above T, and the ties at T by preorder (a GPU flags them in a
    preorder bitmap and counts), sorted by (-score, preorder). Returns indices into ``score``."""
    last = levels[-1]["score"].shape[0]
    levels[-1]["start"], levels[-1]["keep"] = np.zeros(last, np.int64), np.zeros(last, np.int64)
    levels[-1]["size"] = np.ones(last, np.int64)
    for d in range(len(levels) - 2, -1, -1):
        below = np.r_[0, np.cumsum(levels[d + 1]["size"])]
        lv = levels[d]
        lv["size"] = 1 + below[lv["start"] + lv["keep"]] - below[lv["start"]]
    parent_pre, parent_start = np.zeros(1, np.int64), np.zeros(1, np.int64)
    for lv in levels:
        csum = np.cumsum(lv["size"]) - lv["size"]
        lv["pre"] = parent_pre[lv["parent"]] + 1 + csum - csum[parent_start[lv["parent"]]]
        parent_pre, parent_start = lv["pre"], lv["start"]
    pre = np.concatenate([lv["pre"] for lv in levels])
    tie = score == T
    flags = np.zeros(pre.max() + 2, np.int64)          # a preorder bitmap of the ties
    flags[pre[tie]] = 1
    tie_rank = np.cumsum(flags) - flags                # ties before each preorder position
    chosen = (score > T) | (tie & (tie_rank[pre] < budget - (score > T).sum()))
    order = np.flatnonzero(chosen)
    return order[np.lexsort((pre[order], -score[order]))]


def build_tree_levels(lp: np.ndarray, ids: np.ndarray, budget: int, trace: list | None = None,
                      seed: bool = True, tie_slots: int | None = None) -> Tree:
    """``build_tree``'s tree, bit for bit, by a level-synchronous algorithm with no sequential
    pop chain: the numpy twin of the parallel GPU build (issue 15), step for step. ``trace``: a list
    that receives 'filter' or 'select' for each depth (which way its level was kept), and 'seed'
    before the level that computed the seed. ``seed``: the first level that would select first
    raises tau to ``family_seed`` and counts again (False: never; the same tree either way).
    ``tie_slots``: the most tied nodes placed by ``_order_few_ties`` (0: always
    ``_order_with_ties``; None: ``few_ties_limit(budget)``; the same tree either way).

    Order nodes by the key (-score, rank path), the heapq's. The tree is the first ``budget`` = B
    nodes G in that order, and G is prefix-closed (a child's score is fl(parent + lp) <= the
    parent's, and on a tie the parent's path is a prefix, so smaller). Level by level:

    - A running bound tau <= T, the score of G's B-th node (the lowest score in G): -inf at first,
      then after each level the B-th best score of all levels kept so far (B real nodes score at
      least that, so the B-th best overall does too). At the end it is T itself.
    - S_d = the children of S_{d-1} scoring >= tau, when there are at most B of them (one binary
      search a parent: the common case, no selection). The first time there are more, tau is
      first raised to ``family_seed`` (B real nodes score at least that too) and the children
      counted again: a selection costs far more than the seed. If still more: the best B of them in the key
      (-score, parent's path, rank) (``select_level``: a threshold and its ties, no sort of the
      children). Each S_d is laid out in path order: parent p's c_p children are contiguous, from
      an exclusive prefix sum of c over the parents (themselves in path order).
    - G_d (G at depth d) is inside S_d: G_d's parents are in G_{d-1}, inside S_{d-1} by induction;
      its nodes score >= T >= tau; and a node of G has fewer than B nodes before it, so it is among
      the best B of any set holding it.
    - So G is the best B of the union of the S_d in the key (-score, preorder), preorder being the
      rank-path order across depths, and tau is now T. When the B best scores are distinct and no
      other node ties the B-th (the common case), G is the nodes scoring >= T and pop order is by
      score alone: a node's place is the number of those scores above its own. With at most
      ``tie_slots`` tied nodes (``_order_few_ties``) the same, and each tied node after the tied
      nodes of its score that precede it by rank path. Otherwise
      (``_order_with_ties``) subtree sizes bottom-up and preorder positions top-down are segmented
      sums over the contiguous children; then the nodes above T, and the ties at it by preorder;
      pop order is the sort of G by (-score, preorder). A parent's node number is its position.
    """
    budget = check_build_inputs(lp, ids, budget)
    tie_slots = few_ties_limit(budget) if tie_slots is None else check_int("tie_slots", tie_slots, 0)
    L, K = lp.shape
    lp64 = lp.astype(np.float64)
    R = min(K, budget)                                 # ranks a parent can contribute
    levels = []                                        # per depth, in path order: score, parent, rank, child start
    prev_score = np.zeros(1)                           # the root
    tau = -np.inf                                      # a lower bound on the B-th best score
    kept = np.zeros(0)                                 # every level's scores so far
    seeded = not seed
    for d in range(L if budget and K else 0):
        keep = children_at_least(prev_score, lp64[d, :R], tau)
        filtered = keep.sum() <= budget
        if not filtered and not seeded:
            seeded = True
            tau = max(tau, family_seed(lp64, R, budget))
            if trace is not None:
                trace.append("seed")
            keep = children_at_least(prev_score, lp64[d, :R], tau)
            filtered = keep.sum() <= budget
        if not filtered:
            keep = select_level(prev_score, lp64[d, :R], budget)
        if trace is not None:
            trace.append("filter" if filtered else "select")
        start = np.cumsum(keep) - keep                 # first child of each parent in S_d
        parent = np.repeat(np.arange(prev_score.shape[0]), keep)
        rank = np.arange(parent.shape[0]) - start[parent]
        score = prev_score[parent] + lp64[d, rank]     # fl(parent + lp), as the heap
        kept = np.r_[kept, score]
        if kept.shape[0] >= budget:                    # the B-th best kept so far (a GPU merges)
            tau = max(tau, _kth_largest(kept, budget))
        if score.shape[0] == 0:                        # no level below holds a node either
            break
        if levels:
            levels[-1]["start"], levels[-1]["keep"] = start, keep
        levels.append(dict(score=score, parent=parent, rank=rank))
        prev_score = score
    if not levels or levels[0]["score"].shape[0] == 0:
        return Tree(tokens=np.zeros(0, np.int32), depths=np.zeros(0, np.int32), parents=np.array([-1], np.int32),
                    ranks=np.zeros(0, np.int32), scores=np.zeros(0, np.float64))
    score = np.concatenate([lv["score"] for lv in levels])
    depth = np.concatenate([np.full(lv["score"].shape[0], d + 1) for d, lv in enumerate(levels)])
    index = np.concatenate([np.arange(lv["score"].shape[0]) for lv in levels])
    T = tau if score.shape[0] > budget else -np.inf    # the B-th best of the union (its levels' bound)
    n = min(score.shape[0], budget)
    top = -np.sort(-score)[:n]                         # the B best scores (a GPU has merged them)
    if (top[1:] != top[:-1]).all() and (score >= T).sum() == n:
        # no two of them equal, and none outside them ties the B-th: G is the nodes >= T, and a
        # node's place in pop order is the number of those scores above its own
        order = np.flatnonzero(score >= T)
        order = order[np.argsort(-score[order])]
    else:
        order = _order_few_ties(levels, score, depth, index, T, budget, top, tie_slots)
        if order is None:
            order = _order_with_ties(levels, score, T, budget)
    node_of = [np.zeros(lv["score"].shape[0], np.int64) for lv in levels]
    node_of[0] -= 1
    for n, o in enumerate(order, start=1):
        node_of[depth[o] - 1][index[o]] = n
    d, i = depth[order], index[order]
    rank = np.array([levels[a - 1]["rank"][b] for a, b in zip(d, i)], np.int64)
    parents = np.array([0 if a == 1 else node_of[a - 2][levels[a - 1]["parent"][b]] for a, b in zip(d, i)], np.int64)
    return Tree(tokens=ids[d - 1, rank].astype(np.int32), depths=d.astype(np.int32),
                parents=np.r_[-1, parents].astype(np.int32), ranks=rank.astype(np.int32),
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
