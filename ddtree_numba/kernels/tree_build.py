"""Best-first draft-tree construction on the GPU; twin: ``reference.tree_build.build_tree``.

Shapes: L depths (<= MAX_DEPTH), K ranks per depth, N nodes (<= budget <= MAX_BUDGET).

One block runs the whole build in shared memory. The frontier (the heap of the twin) is
kept *sorted*, best first, as candidate paths (parent node, rank, score): a path's depth
is its parent's depth + 1, and its ranks are recovered by walking parents. The order is
the twin's total order (score descending, then rank path ascending; ``_path_less`` walks
two paths up to their common ancestor only when scores tie exactly). A pop is then:
thread 0 takes the head, records the node and makes its first child and next sibling;
every thread finds, among its strided entries, the one place where each new candidate
stops being beaten (the frontier is sorted, so that place is unique); every thread
copies its entries into the other half of a double buffer, shifted past the new ones.
Three barriers and O(frontier / threads) work a pop, no reduction. The ranks of lp that
fit are copied to shared memory first. Every step matches the twin's float64
arithmetic, so the trees are bit-identical.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import cuda, float32, float64, int16, int32

from ..reference.tree_build import _check_build_inputs
from ..tree import Tree
from ._launch import check_threads, device_function, to_device

MAX_BUDGET = 1024
MAX_DEPTH = 32
THREADS = 128
LP_CACHE = 2048    # float32 entries of lp kept in shared memory (static shared stays < 48 KiB)


@device_function
def _path_less(pa, ra, pb, rb, n_parent, n_rank, n_depth):
    """Is the path (ranks of pa's path, ra) lexicographically smaller than (.., pb, rb)?"""
    da = n_depth[pa] + 1
    db = n_depth[pb] + 1
    a_depth = da
    b_depth = db
    while da > db:  # lift the deeper path to the shallower depth
        ra = n_rank[pa]
        pa = n_parent[pa]
        da -= 1
    while db > da:
        rb = n_rank[pb]
        pb = n_parent[pb]
        db -= 1
    while pa != pb:  # climb together until both hang under the same node
        ra = n_rank[pa]
        pa = n_parent[pa]
        rb = n_rank[pb]
        pb = n_parent[pb]
    if ra != rb:
        return ra < rb
    return a_depth < b_depth  # one is a prefix of the other: the shorter comes first


@device_function
def _key_better(sa, pa, ra, sb, pb, rb, n_parent, n_rank, n_depth):
    """Does candidate (score sa, parent pa, rank ra) pop before (sb, pb, rb)?

    Scores decide; the rank paths are walked only on an exact tie."""
    if sa != sb:
        return sa > sb
    return _path_less(pa, ra, pb, rb, n_parent, n_rank, n_depth)


@device_function
def _lp_at(lp, lp_cache, ranks_cached, d, r):
    """lp[d, r] as float64, from the shared-memory copy when it holds that rank."""
    if r < ranks_cached:
        return float64(lp_cache[d * ranks_cached + r])
    return float64(lp[d, r])


@functools.lru_cache(maxsize=None)
def _build_tree_kernel(threads):
    T = threads
    NB = MAX_BUDGET + 1
    NB2 = 2 * NB

    @cuda.jit
    def kernel(lp, ids, budget, tokens, depths, parents, ranks, scores, n_nodes):
        t = cuda.threadIdx.x
        L = lp.shape[0]
        K = lp.shape[1]
        n_score = cuda.shared.array(NB, float64)       # node i's path score (root: 0)
        n_parent = cuda.shared.array(NB, int16)
        n_rank = cuda.shared.array(NB, int16)
        n_depth = cuda.shared.array(NB, int16)
        # the frontier, sorted best first, double-buffered: entries [base, base + F)
        f_score = cuda.shared.array(NB2, float64)   # candidate path's score
        f_parent = cuda.shared.array(NB2, int16)    # its parent node
        f_rank = cuda.shared.array(NB2, int16)      # its last rank
        lp_cache = cuda.shared.array(LP_CACHE, float32)  # lp[d, r] for r < ranks_cached
        new_score = cuda.shared.array(2, float64)      # the popped node's child and sibling,
        new_parent = cuda.shared.array(2, int32)       # better one first
        new_rank = cuda.shared.array(2, int32)
        state = cuda.shared.array(5, int32)  # (frontier size, nodes popped, new count, pos0, pos1)
        ranks_cached = min(K, LP_CACHE // max(L, 1))
        for i in range(t, L * ranks_cached, T):
            lp_cache[i] = lp[i // ranks_cached, i % ranks_cached]
        if t == 0:
            n_score[0] = 0.0
            n_parent[0] = -1
            n_rank[0] = 0
            n_depth[0] = 0
            state[0] = 0
            state[1] = 0
            if L > 0 and K > 0 and budget > 0:
                f_score[0] = 0.0 + float64(lp[0, 0])
                f_parent[0] = 0
                f_rank[0] = 0
                state[0] = 1
        cuda.syncthreads()  # root, first candidate and the lp copy are in place
        src = 0
        while True:
            F = state[0]
            n = state[1]
            if F == 0 or n == budget:
                break
            dst = NB - src
            # -- 1. thread 0 pops the head and makes its first child and next sibling
            if t == 0:
                p = int32(f_parent[src])
                r = int32(f_rank[src])
                score = f_score[src]
                d = int32(n_depth[p]) + 1
                node = n + 1
                n_score[node] = score
                n_parent[node] = p
                n_rank[node] = r
                n_depth[node] = d
                m = 0
                if d < L:
                    new_score[0] = score + _lp_at(lp, lp_cache, ranks_cached, d, 0)
                    new_parent[0] = node
                    new_rank[0] = 0
                    m = 1
                if r + 1 < K:
                    new_score[m] = n_score[p] + _lp_at(lp, lp_cache, ranks_cached, d - 1, r + 1)
                    new_parent[m] = p
                    new_rank[m] = r + 1
                    m += 1
                if m == 2 and _key_better(new_score[1], new_parent[1], new_rank[1], new_score[0],
                                          new_parent[0], new_rank[0], n_parent, n_rank, n_depth):
                    sc, pa, ra = new_score[0], new_parent[0], new_rank[0]
                    new_score[0], new_parent[0], new_rank[0] = new_score[1], new_parent[1], new_rank[1]
                    new_score[1], new_parent[1], new_rank[1] = sc, pa, ra
                state[1] = node
                state[2] = m
                state[3] = F  # default insertion points: after everything left
                state[4] = F
            cuda.syncthreads()  # the pop and the new candidates are published
            # -- 2. where each new candidate goes: the first entry it beats (the rest is sorted)
            m = state[2]
            for j in range(m):
                sk = new_score[j]
                pk = new_parent[j]
                rk = new_rank[j]
                for i in range(1 + t, F, T):
                    if not _key_better(f_score[src + i], f_parent[src + i], f_rank[src + i], sk, pk, rk,
                                       n_parent, n_rank, n_depth):
                        if i == 1 or _key_better(f_score[src + i - 1], f_parent[src + i - 1],
                                                 f_rank[src + i - 1], sk, pk, rk, n_parent, n_rank, n_depth):
                            state[3 + j] = i
            cuda.syncthreads()  # insertion points are known
            # -- 3. copy into the other buffer without the head and with the new entries in place
            pos0 = state[3]
            pos1 = state[4]
            for i in range(1 + t, F, T):
                k = dst + i - 1
                if m >= 1 and i >= pos0:
                    k += 1
                if m == 2 and i >= pos1:
                    k += 1
                f_score[k] = f_score[src + i]
                f_parent[k] = f_parent[src + i]
                f_rank[k] = f_rank[src + i]
            if t == 0:
                if m >= 1:
                    f_score[dst + pos0 - 1] = new_score[0]
                    f_parent[dst + pos0 - 1] = new_parent[0]
                    f_rank[dst + pos0 - 1] = new_rank[0]
                if m == 2:
                    f_score[dst + pos1] = new_score[1]
                    f_parent[dst + pos1] = new_parent[1]
                    f_rank[dst + pos1] = new_rank[1]
                state[0] = F - 1 + m
            src = dst
            cuda.syncthreads()  # the new frontier is complete before the next pop reads it
        n = state[1]
        for i in range(t + 1, n + 1, T):
            d = int32(n_depth[i])
            r = int32(n_rank[i])
            tokens[i - 1] = ids[d - 1, r]
            depths[i - 1] = d
            ranks[i - 1] = r
            scores[i - 1] = n_score[i]
            parents[i] = n_parent[i]
        if t == 0:
            parents[0] = -1
            n_nodes[0] = n

    return kernel


@dataclass(frozen=True)
class TreeBuffers:
    """Device buffers a GPU build writes into; ``n_nodes[0]`` says how many entries are used."""

    tokens: object   # [budget]   int32
    depths: object   # [budget]   int32
    parents: object  # [budget+1] int32
    ranks: object    # [budget]   int32
    scores: object   # [budget]   float64
    n_nodes: object  # [1]        int32, N

    @classmethod
    def allocate(cls, budget: int, stream=0) -> "TreeBuffers":
        def arr(n, dt):
            return cuda.device_array(n, dt, stream=stream)
        return cls(arr(budget, np.int32), arr(budget, np.int32), arr(budget + 1, np.int32),
                   arr(budget, np.int32), arr(budget, np.float64), arr(1, np.int32))

    @property
    def capacity(self) -> int:
        return int(self.tokens.shape[0])

    def to_tree(self, stream=0) -> Tree:
        """Copy the used part back as a host ``Tree``."""
        n = int(self.n_nodes.copy_to_host(stream=stream)[0])
        host = {f: getattr(self, f).copy_to_host(stream=stream)
                for f in ("tokens", "depths", "parents", "ranks", "scores")}
        return Tree(tokens=host["tokens"][:n], depths=host["depths"][:n],
                    parents=host["parents"][:n + 1], ranks=host["ranks"][:n],
                    scores=host["scores"][:n])


def build_tree(lp, ids, budget, *, out=None, stream=0, threads=THREADS):
    """The ``budget`` best rank paths as a tree, built on the GPU.

    lp [L, K] float32 (rows descending), ids [L, K] int32, numpy or device. Returns a host
    ``Tree`` bit-identical to ``reference.build_tree``, or, when ``out`` (``TreeBuffers``)
    is given, fills it on ``stream`` and returns it without synchronising.
    """
    budget = _check_build_inputs(lp, ids, budget)
    L, K = lp.shape
    if budget > MAX_BUDGET:
        raise ValueError(f"budget = {budget} is more than the kernel's MAX_BUDGET = {MAX_BUDGET}")
    if L > MAX_DEPTH:
        raise ValueError(f"{L} draft depths is more than the kernel's MAX_DEPTH = {MAX_DEPTH}")
    if K > MAX_BUDGET:
        raise ValueError(f"K = {K} ranks per depth is more than the kernel takes ({MAX_BUDGET})")
    check_threads(threads)
    bufs = out if out is not None else TreeBuffers.allocate(budget, stream)
    if bufs.capacity < budget:
        raise ValueError(f"out holds {bufs.capacity} nodes; budget is {budget}")
    _build_tree_kernel(threads)[1, threads, stream](
        to_device(lp, stream), to_device(ids, stream), budget,
        bufs.tokens, bufs.depths, bufs.parents, bufs.ranks, bufs.scores, bufs.n_nodes)
    return bufs if out is not None else bufs.to_tree(stream)
