"""Best-first draft-tree construction on the GPU; twin: ``reference.tree_build.build_tree``.

Shapes: L depths (<= MAX_DEPTH), K ranks per depth, N nodes (<= budget <= MAX_BUDGET).

One block runs the whole build in shared memory. The frontier (the heap of the twin) is an
unordered array of candidate paths, each stored as (parent node, rank, score): a path's
depth is its parent's depth + 1, and its ranks are recovered by walking parents. Each
pop is a block-wide arg-max over the frontier under the twin's total order (score
descending, then rank path ascending; ``_path_less`` walks the two paths up to their
common ancestor only when scores tie exactly): a strided scan per thread, warp shuffles,
then thread 0 over the warps' winners (a shared-memory tree in the simulator, which has
no shuffles). Thread 0 then records the node, replaces the popped slot with its first
child and appends its next sibling; the ranks of lp that fit are copied to shared memory
first, so a pop touches no global memory. Two barriers a pop. Every step matches the
twin's float64 arithmetic, so the trees are bit-identical.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import config, cuda, float32, float64, int16, int32

from .._checks import check_build_inputs
from ..tree import Tree
from .._device import check_threads, device_function, to_device

MAX_BUDGET = 1024
MAX_DEPTH = 32
THREADS = 128
LP_CACHE = 4096    # float32 entries of lp kept in shared memory (static shared stays < 48 KiB)
# Warp shuffles on a GPU; the CUDA simulator has none, so it runs the shared-memory tree.
SHUFFLES = not config.ENABLE_CUDASIM


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
def _slot_better(sa, a, sb, b, f_parent, f_rank, n_parent, n_rank, n_depth):
    """Does frontier slot a (score sa) pop before slot b (score sb)? b < 0 means none.

    Scores travel in registers; the paths are walked only on an exact tie."""
    if b < 0:
        return a >= 0
    if a < 0 or sa < sb:
        return False
    if sa > sb:
        return True
    return _path_less(f_parent[a], f_rank[a], f_parent[b], f_rank[b], n_parent, n_rank, n_depth)


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
    WARPS = max(T // 32, 1)
    shuffles = SHUFFLES and T >= 32

    @cuda.jit
    def kernel(lp, ids, budget, tokens, depths, parents, ranks, scores, n_nodes):
        t = cuda.threadIdx.x
        L = lp.shape[0]
        K = lp.shape[1]
        n_score = cuda.shared.array(NB, float64)   # node i's path score (root: 0)
        n_parent = cuda.shared.array(NB, int16)
        n_rank = cuda.shared.array(NB, int16)
        n_depth = cuda.shared.array(NB, int16)
        f_score = cuda.shared.array(NB, float64)   # frontier slot: candidate path's score
        f_parent = cuda.shared.array(NB, int16)    # its parent node
        f_rank = cuda.shared.array(NB, int16)      # its last rank
        lp_cache = cuda.shared.array(LP_CACHE, float32)  # lp[d, r] for r < ranks_cached
        red = cuda.shared.array(T, int32)
        red_score = cuda.shared.array(T, float64)
        state = cuda.shared.array(2, int32)        # (frontier size, nodes popped)
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
        while True:
            F = state[0]
            n = state[1]
            if F == 0 or n == budget:
                break
            best = -1
            best_score = 0.0
            for s in range(t, F, T):
                score = f_score[s]
                if _slot_better(score, s, best_score, best, f_parent, f_rank, n_parent, n_rank, n_depth):
                    best = s
                    best_score = score
            if shuffles:
                # arg-max inside each warp with shuffles, then thread 0 over the warps' winners
                off = 16
                while off > 0:
                    other = cuda.shfl_xor_sync(0xFFFFFFFF, best, off)
                    other_score = cuda.shfl_xor_sync(0xFFFFFFFF, best_score, off)
                    if _slot_better(other_score, other, best_score, best, f_parent, f_rank,
                                    n_parent, n_rank, n_depth):
                        best = other
                        best_score = other_score
                    off //= 2
                if t % 32 == 0:
                    red[t // 32] = best
                    red_score[t // 32] = best_score
                cuda.syncthreads()  # every warp's winner is in
                if t == 0:
                    for w in range(1, WARPS):
                        if _slot_better(red_score[w], red[w], best_score, best, f_parent, f_rank,
                                        n_parent, n_rank, n_depth):
                            best = red[w]
                            best_score = red_score[w]
            else:
                # the simulator has no shuffles: a shared-memory tree
                red[t] = best
                red_score[t] = best_score
                cuda.syncthreads()  # every thread's local best is in
                stride = T // 2
                while stride > 0:
                    if t < stride:
                        if _slot_better(red_score[t + stride], red[t + stride], red_score[t], red[t],
                                        f_parent, f_rank, n_parent, n_rank, n_depth):
                            red[t] = red[t + stride]
                            red_score[t] = red_score[t + stride]
                    cuda.syncthreads()  # this level of the arg-max tree is done
                    stride //= 2
                best = red[0]
            if t == 0:
                s = best
                p = int32(f_parent[s])
                r = int32(f_rank[s])
                score = f_score[s]
                d = int32(n_depth[p]) + 1
                node = n + 1
                n_score[node] = score
                n_parent[node] = p
                n_rank[node] = r
                n_depth[node] = d
                has_child = d < L
                has_sibling = r + 1 < K
                if has_child:  # the popped slot becomes the first child
                    f_score[s] = score + _lp_at(lp, lp_cache, ranks_cached, d, 0)
                    f_parent[s] = node
                    f_rank[s] = 0
                if has_sibling:  # the next sibling takes the popped slot or a new one
                    slot = F if has_child else s
                    f_score[slot] = n_score[p] + _lp_at(lp, lp_cache, ranks_cached, d - 1, r + 1)
                    f_parent[slot] = p
                    f_rank[slot] = r + 1
                    if has_child:
                        F += 1
                if not has_child and not has_sibling:  # the last slot fills the hole
                    F -= 1
                    f_score[s] = f_score[F]
                    f_parent[s] = f_parent[F]
                    f_rank[s] = f_rank[F]
                state[0] = F
                state[1] = node
            cuda.syncthreads()  # the pop is recorded before anyone reads the frontier
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
    budget = check_build_inputs(lp, ids, budget)
    L, K = lp.shape
    if budget > MAX_BUDGET:
        raise ValueError(f"budget = {budget} is more than the kernel's MAX_BUDGET = {MAX_BUDGET}")
    if L > MAX_DEPTH:
        raise ValueError(f"{L} draft depths is more than the kernel's MAX_DEPTH = {MAX_DEPTH}")
    if K > MAX_BUDGET:
        raise ValueError(f"K = {K} ranks per depth is more than the kernel takes ({MAX_BUDGET})")
    check_threads(threads, hi=256)  # static shared memory: 48 KiB a block
    bufs = out if out is not None else TreeBuffers.allocate(budget, stream)
    if bufs.capacity < budget:
        raise ValueError(f"out holds {bufs.capacity} nodes; budget is {budget}")
    _build_tree_kernel(threads)[1, threads, stream](
        to_device(lp, stream), to_device(ids, stream), budget,
        bufs.tokens, bufs.depths, bufs.parents, bufs.ranks, bufs.scores, bufs.n_nodes)
    return bufs if out is not None else bufs.to_tree(stream)
