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
twin's float64 arithmetic, so the trees are bit-identical. The kernel takes a batch: lp / ids
[S, L, K], a block a sequence (``build_trees``); ``build_tree`` launches a batch of one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import config, cuda, float32, float64, int16, int32, int64, uint32, uint64

from .._checks import check_array, check_batch_build_inputs, check_build_inputs, check_int
from ..reference.tree_build import SEED_CANDIDATES, SEED_ROUNDS, TIE_SHARE, TIE_SLOTS
from ..tree import Tree
from .._device import LINEINFO, cached, check_threads, device_function, grid_dependency_after, is_device, to_device
from ._warp import (FULL as FULL_MASK, WARP_OPS, claim, hist_add, lowest_lane, warp_inclusive_scan, warp_max_u64,
                    warp_min_u64, warp_sum)

MAX_BUDGET = 1024
MAX_DEPTH = 32
THREADS = 128
LP_CACHE = 4096    # float32 entries of lp kept in shared memory (static shared stays < 48 KiB)
LP_LOADS = 4       # entries of lp a heap-build thread loads at once into that copy


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


@device_function
def _launch_budget(budget, n_budget, s):
    """Tree s's budget: ``budget``, or min(budget, the device's) when n_budget holds one for every
    tree ([1]) or one a tree ([S]) (read when the kernel runs: a replayed graph's budget of the moment)."""
    if n_budget.shape[0] > 0:
        return max(0, min(budget, n_budget[s if n_budget.shape[0] > 1 else 0]))
    return budget


@device_function
def _copy_lp(lp, dst, rc, n, t, T, vals):
    """dst[i] = lp[i // rc, i % rc] for i < n, by the T threads of a block (t this one's), len(vals)
    loads in flight a thread (``vals``: a local array); (depth, rank) stepped rather than divided
    (numba's 64-bit divisions were ~180 instructions an entry)."""
    U = vals.shape[0]
    step_d, step_r = T // rc, T % rc              # a step of T entries in (depth, rank)
    cd, cr = t // rc, t % rc
    for i0 in range(t, n, T * U):
        for u in range(U):
            if i0 + u * T < n:
                vals[u] = lp[cd, cr]
            cd += step_d
            cr += step_r
            if cr >= rc:
                cr -= rc
                cd += 1
        for u in range(U):
            if i0 + u * T < n:
                dst[i0 + u * T] = vals[u]


@device_function
def _write_root(n_score, n_parent, n_rank, n_depth):
    """Node 0's record in a heap build's shared records: the root, score 0, no parent."""
    n_score[0] = 0.0
    n_parent[0] = -1
    n_rank[0] = 0
    n_depth[0] = 0


@device_function
def _write_tree(n, n_score, n_parent, n_rank, n_depth, ids, tokens, depths, parents, ranks, scores, t, T):
    """A heap build's n nodes out of its shared records (node i: score, parent, rank, depth), by
    the T threads of a block (t this one's); parents[0] = -1 for the root."""
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


@functools.lru_cache(maxsize=None)
def _build_tree_kernel(threads):
    T = threads
    NB = MAX_BUDGET + 1
    WARPS = max(T // 32, 1)
    shuffles = WARP_OPS and T >= 32          # the simulator has none: a shared-memory tree

    @cached
    @cuda.jit
    def kernel(lp_all, ids_all, budget, n_budget, tokens_all, depths_all, parents_all, ranks_all, scores_all,
               n_nodes):
        # a block a tree: block s builds sequence s's (a single build is a batch of one)
        grid_dependency_after((lp_all, ids_all, budget, n_budget, tokens_all, depths_all, parents_all, ranks_all,
                               scores_all, n_nodes))
        b_ = cuda.blockIdx.x
        lp = lp_all[b_]
        ids = ids_all[b_]
        tokens = tokens_all[b_]
        depths = depths_all[b_]
        parents = parents_all[b_]
        ranks = ranks_all[b_]
        scores = scores_all[b_]
        t = cuda.threadIdx.x
        L = lp.shape[0]
        K = lp.shape[1]
        budget = _launch_budget(budget, n_budget, b_)   # this launch's budget (or this tree's)
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
        # lp_cache[i] = lp[i // ranks_cached, i % ranks_cached], LP_LOADS loads in flight a thread
        _copy_lp(lp, lp_cache, max(ranks_cached, 1), L * ranks_cached, t, T, cuda.local.array(LP_LOADS, float32))
        if t == 0:
            _write_root(n_score, n_parent, n_rank, n_depth)
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
                # arg-max inside each warp: the greatest score as a warp minimum of its complemented
                # order key (+ 0.0: -0.0 ties +0.0, as the float compare has it), then the lanes
                # holding it, in lane order, by path (more than one only on an exact tie); then
                # thread 0 over the warps' winners. (The shuffled _slot_better it replaces was
                # ~300 of a pop's ~720 warp instructions: ncu, H100, budget 64.)
                key = _order_key(best_score + 0.0) if best >= 0 else uint64(0)
                top = ~warp_min_u64(~key)
                # (uint32: numba's ballot is an int32, and with lane 31 set, tied & (tied - 1) below
                # then sign-extends to 64 bits: 32 phantom "lanes" 32..63 in the tie loop)
                tied = uint32(cuda.ballot_sync(FULL_MASK, best >= 0 and key == top))
                lead = lowest_lane(tied)   # (no lane: the mask's width, read as lane 0 by the
                # shuffles below; the winner is then set to -1)
                winner = cuda.shfl_sync(FULL_MASK, best, lead)
                winner_score = cuda.shfl_sync(FULL_MASK, best_score, lead)
                rest = tied & (tied - uint32(1))
                while rest != 0:           # an exact tie in score (uniform across the warp)
                    lane = lowest_lane(rest)
                    other = cuda.shfl_sync(FULL_MASK, best, lane)
                    other_score = cuda.shfl_sync(FULL_MASK, best_score, lane)
                    if _slot_better(other_score, other, winner_score, winner, f_parent, f_rank,
                                    n_parent, n_rank, n_depth):
                        winner = other
                        winner_score = other_score
                    rest &= rest - uint32(1)
                if tied == 0:              # no lane of the warp holds a slot
                    winner = -1
                best = winner
                best_score = winner_score
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
        _write_tree(n, n_score, n_parent, n_rank, n_depth, ids, tokens, depths, parents, ranks, scores, t, T)
        if t == 0:
            n_nodes[b_] = n

    return kernel


# -- the heap build with its frontier in one warp's registers (budgets up to WARP_BUDGET) ----------
# The block kernel above spends ~720 warp instructions a pop (ncu, H100), most of them thread 0's
# update of the frontier through shared memory and numba's 64-bit index arithmetic, all of them one
# dependent chain. Here the frontier lives in the warp's registers, WARP_SLOTS slots a lane: a pop
# is each lane's better slot, the warp's greatest order key (two redux.sync, or a shuffle minimum of
# the complemented keys; the tied lanes by path, only on an exact tie), a broadcast of the winner, and every lane
# computing the two new candidates' scores from lp's shared copy; the lanes owning the popped slot
# and the next free slot write them. A popped slot that has neither child nor sibling is marked
# empty (no compaction), so the slots a build appends are at most its pops: budget <= 32 x
# WARP_SLOTS. The node records (score, parent, rank, depth) go to shared memory, read only by path
# compares on ties and by the final write-out. Same float64 sums as the twin: the same tree.
WARP_SLOTS = 2      # the kernel holds exactly two slots a lane (as scalars: a local array went to local memory)
WARP_BUDGET = 32 * WARP_SLOTS
WARP_LOADS = 8      # entries of lp a lane loads at once into the shared copy
# The default rule (``_build_method``): the warp kernel up to this budget. Measured on an H100
# (forty-second session, 87e251e, tools/warp_build_ab.py): 10.4 / 19.2 / 39.3 µs at budgets 16 / 32 / 64
# against the block kernel's 12.7 / 23.7 / 47.8, on every draft (PERFORMANCE.md).
WARP_DEFAULT_UP_TO = WARP_BUDGET


@device_function
def _after_pop(s, p, r, d, q, has_child, has_sib, cs, ss, node, ws):
    """A popped frontier slot (score, parent, rank, depth, parent's score) after its pop: its first
    child (score cs) if it has one, else its next sibling (score ss), else empty (parent -1)."""
    if has_child:
        return cs, int32(node), int32(0), int32(d + 1), ws
    if has_sib:
        return ss, p, int32(r + 1), d, q
    return s, int32(-1), r, d, q


WARP_REDUX = True   # the warp's greatest key by two redux.sync (else by five shuffle rounds)


@functools.lru_cache(maxsize=None)
def _build_tree_warp_kernel(redux=True):
    """One warp a tree (grid S, 32 threads): ``build_trees``' kernel for budgets <= WARP_BUDGET.
    ``redux``: the warp's greatest order key by ``warp_max_u64`` (redux.sync), else by
    ``warp_min_u64`` of the complemented keys (shuffles)."""
    NB = WARP_BUDGET + 1
    LPC = MAX_DEPTH * WARP_BUDGET
    U = WARP_LOADS
    shuffles = WARP_OPS

    @cached
    @(cuda.jit if config.ENABLE_CUDASIM else cuda.jit(launch_bounds=(32,), lineinfo=LINEINFO))
    def kernel(lp_all, ids_all, budget, n_budget, tokens_all, depths_all, parents_all, ranks_all, scores_all,
               n_nodes):
        grid_dependency_after((lp_all, ids_all, budget, n_budget, tokens_all, depths_all, parents_all, ranks_all,
                               scores_all, n_nodes))
        b_ = cuda.blockIdx.x
        lp = lp_all[b_]
        ids = ids_all[b_]
        tokens = tokens_all[b_]
        depths = depths_all[b_]
        parents = parents_all[b_]
        ranks = ranks_all[b_]
        scores = scores_all[b_]
        lane = cuda.threadIdx.x
        # The pop loop's integers are int32 and its shared-memory indices unsigned: numba widens to
        # int64 and wraps negative indices around. That took 15 % of a pop's ~240 instructions and
        # 3.5 % of its time (ncu by SASS, H100, forty-second session): the rest is the chain itself.
        L = int32(lp.shape[0])
        K = int32(lp.shape[1])
        K1 = int32(K - 1)
        B = int32(_launch_budget(budget, n_budget, b_))   # this launch's budget (or this tree's)
        # ranks a pop can read: a popped rank r has its r earlier siblings popped before it, and no
        # candidate is pushed after the last pop, so a pushed sibling's rank r + 1 < B (and < K)
        RC = int32(max(min(K, B), 1))
        lpc = cuda.shared.array(LPC, float32)      # lpc[d * RC + r] = lp[d, r], r < RC
        n_score = cuda.shared.array(NB, float64)   # node i's path score (root: 0)
        n_parent = cuda.shared.array(NB, int16)
        n_rank = cuda.shared.array(NB, int16)
        n_depth = cuda.shared.array(NB, int16)
        c_has = cuda.shared.array(32, int32)       # the simulator's arg-max: each lane's best slot
        c_score = cuda.shared.array(32, float64)
        c_parent = cuda.shared.array(32, int32)
        c_rank = cuda.shared.array(32, int32)
        c_depth = cuda.shared.array(32, int32)
        c_pscore = cuda.shared.array(32, float64)
        c_slot = cuda.shared.array(32, int32)
        # lp's copy, U loads in flight a lane
        _copy_lp(lp, lpc, RC, L * RC if B > 0 else 0, lane, 32, cuda.local.array(U, float32))
        # the frontier: this lane's slots lane (0) and lane + 32 (1) of the build, as scalars (a local
        # array indexed in a loop went to local memory): score, parent (-1: empty), rank, depth
        # and the parent's score (a sibling's base)
        s0 = 0.0
        p0 = int32(-1)
        r0 = int32(0)
        d0 = int32(0)
        q0 = 0.0
        s1 = 0.0
        p1 = int32(-1)
        r1 = int32(0)
        d1 = int32(0)
        q1 = 0.0
        live = int32(0)                            # non-empty slots (the same in every lane)
        if L > 0 and K > 0 and B > 0:
            live = int32(1)
            if lane == 0:
                s0 = 0.0 + float64(lp[0, 0])
                p0 = int32(0)
                d0 = int32(1)
        if lane == 0:
            _write_root(n_score, n_parent, n_rank, n_depth)
        cuda.syncthreads()                         # lp's copy and the root are in
        n = int32(0)                               # nodes popped
        F = int32(1)                               # slots used
        while n < B and live > 0:
            # this lane's better slot, in the twin's order (score, then rank path)
            has = p0 >= 0
            bs = s0
            bp = p0
            br = r0
            bd = d0
            bq = q0
            bj = int32(0)
            if p1 >= 0 and (not has or (not (s1 < bs) and (
                    s1 > bs or _path_less(p1, r1, bp, br, n_parent, n_rank, n_depth)))):
                has = True
                bs = s1
                bp = p1
                br = r1
                bd = d1
                bq = q1
                bj = int32(1)
            if shuffles:
                key = _order_key(bs + 0.0) if has else uint64(0)
                top = warp_max_u64(key) if redux else ~warp_min_u64(~key)
                # (uint32: an int32 ballot with lane 31 set sign-extends in tied & (tied - 1), giving
                # phantom lanes 32..63 to the tie loop: a winner no lane owns. The forty-first
                # session's first GPU run failed on exactly that; tests/warp_emulation.py shows it)
                tied = uint32(cuda.ballot_sync(FULL_MASK, has and key == top))
                if tied == 0:                      # (live > 0 says some lane holds a slot)
                    break
                wl = lowest_lane(tied)
                wp = cuda.shfl_sync(FULL_MASK, bp, wl)
                wr = cuda.shfl_sync(FULL_MASK, br, wl)
                rest = tied & (tied - uint32(1))
                while rest != 0:                   # an exact tie in score (uniform across the warp)
                    other = lowest_lane(rest)
                    op = cuda.shfl_sync(FULL_MASK, bp, other)
                    orank = cuda.shfl_sync(FULL_MASK, br, other)
                    if _path_less(op, orank, wp, wr, n_parent, n_rank, n_depth):
                        wl = other
                        wp = op
                        wr = orank
                    rest &= rest - uint32(1)
                ws = cuda.shfl_sync(FULL_MASK, bs, wl)
                wd = cuda.shfl_sync(FULL_MASK, bd, wl)
                wq = cuda.shfl_sync(FULL_MASK, bq, wl)
                wj = cuda.shfl_sync(FULL_MASK, bj, wl)
            else:
                # the simulator has no shuffles: every lane scans the lanes' best slots in shared memory
                c_has[lane] = 1 if has else 0
                c_score[lane] = bs
                c_parent[lane] = bp
                c_rank[lane] = br
                c_depth[lane] = bd
                c_pscore[lane] = bq
                c_slot[lane] = bj
                cuda.syncthreads()                 # every lane's best slot is in
                wl = -1
                ws = 0.0
                for other in range(32):
                    if c_has[other] != 0 and _slot_better(c_score[other], other, ws, wl, c_parent, c_rank,
                                                          n_parent, n_rank, n_depth):
                        wl = other
                        ws = c_score[other]
                if wl < 0:
                    break
                wp = c_parent[wl]
                wr = c_rank[wl]
                wd = c_depth[wl]
                wq = c_pscore[wl]
                wj = c_slot[wl]
                cuda.syncthreads()                 # every lane has read c_* before the next pop rewrites them
            node = int32(n + 1)
            if lane == 0:
                un = uint32(node)
                n_score[un] = ws
                n_parent[un] = wp
                n_rank[un] = wr
                n_depth[un] = wd
            if node < B:                           # no candidate after the last pop
                has_child = wd < L
                has_sib = wr < K1
                cs = ws + float64(lpc[uint32(wd) * uint32(RC)]) if has_child else 0.0
                ss = wq + float64(lpc[uint32(wd - 1) * uint32(RC) + uint32(wr + 1)]) if has_sib else 0.0
                both = has_child and has_sib
                if lane == wl:                     # the popped slot: its first child, else its sibling
                    if wj == 0:
                        s0, p0, r0, d0, q0 = _after_pop(s0, p0, r0, d0, q0, has_child, has_sib, cs, ss, node, ws)
                    else:
                        s1, p1, r1, d1, q1 = _after_pop(s1, p1, r1, d1, q1, has_child, has_sib, cs, ss, node, ws)
                if both and lane == (F & int32(31)):   # a new slot: the sibling
                    if F < 32:
                        s0, p0, r0, d0, q0 = ss, int32(wp), int32(wr + 1), int32(wd), wq
                    else:
                        s1, p1, r1, d1, q1 = ss, int32(wp), int32(wr + 1), int32(wd), wq
                if both:
                    F = int32(F + 1)
                live = int32(live + int32(has_child) + int32(has_sib) - 1)
            n = node
            if shuffles:
                cuda.syncwarp()                    # the record is seen by every lane's path compares
            else:
                cuda.syncthreads()
        _write_tree(n, n_score, n_parent, n_rank, n_depth, ids, tokens, depths, parents, ranks, scores, lane, 32)
        if lane == 0:
            n_nodes[b_] = n

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

    def as_batch(self) -> "TreeBatchBuffers":
        """These buffers as a batch of one tree: [1, ...] views of the same memory."""
        cap = self.capacity
        return TreeBatchBuffers(self.tokens.reshape(1, cap), self.depths.reshape(1, cap),
                                self.parents.reshape(1, cap + 1), self.ranks.reshape(1, cap),
                                self.scores.reshape(1, cap), self.n_nodes)

    def to_tree(self, stream=0) -> Tree:
        """Copy the used part back as a host ``Tree``."""
        return self.as_batch().to_trees(stream)[0]


@dataclass(frozen=True)
class TreeBatchBuffers:
    """Device buffers a batched GPU build (``build_trees``) writes into, a row a sequence;
    ``n_nodes[s]`` says how many entries of row s are used."""

    tokens: object   # [S, budget]   int32
    depths: object   # [S, budget]   int32
    parents: object  # [S, budget+1] int32
    ranks: object    # [S, budget]   int32
    scores: object   # [S, budget]   float64
    n_nodes: object  # [S]           int32

    @classmethod
    def allocate(cls, trees: int, budget: int, stream=0) -> "TreeBatchBuffers":
        def arr(shape, dt):
            return cuda.device_array(shape, dt, stream=stream)
        S = trees
        return cls(arr((S, budget), np.int32), arr((S, budget), np.int32), arr((S, budget + 1), np.int32),
                   arr((S, budget), np.int32), arr((S, budget), np.float64), arr(S, np.int32))

    @property
    def trees(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def capacity(self) -> int:
        return int(self.tokens.shape[1])

    def to_trees(self, stream=0) -> list:
        """Copy the used parts back as host ``Tree``s, one a sequence."""
        n = self.n_nodes.copy_to_host(stream=stream)
        host = {f: getattr(self, f).copy_to_host(stream=stream)
                for f in ("tokens", "depths", "parents", "ranks", "scores")}
        return [Tree(tokens=host["tokens"][s, :k], depths=host["depths"][s, :k],
                     parents=host["parents"][s, :k + 1], ranks=host["ranks"][s, :k], scores=host["scores"][s, :k])
                for s, k in enumerate(int(x) for x in n)]


_NO_BUDGET = []     # an empty device array, made once: "no device budget"


def _device_budget(budget_device, trees: int = 1):
    """The launch's device budget: ``budget_device`` (int32 [1] device array, or [trees]: a
    budget a tree), checked, or an empty array (the kernels then build the host budget)."""
    if budget_device is None:
        if not _NO_BUDGET:
            _NO_BUDGET.append(cuda.device_array(0, np.int32))
        return _NO_BUDGET[0]
    check_array("budget_device", budget_device, 1, np.int32)
    if budget_device.shape[0] not in (1, trees):
        raise ValueError(f"budget_device holds {budget_device.shape[0]} budgets; give 1, or one a tree ({trees})")
    if not is_device(budget_device):
        raise ValueError("budget_device must be a device array (it is read by the kernel, for graph replay)")
    return budget_device


def _check_limits(budget: int, depths: int) -> int:
    """A checked budget and draft depth count within the kernels' limits; returns the budget."""
    if budget > MAX_BUDGET:
        raise ValueError(f"budget = {budget} is more than the kernel's MAX_BUDGET = {MAX_BUDGET}")
    if depths > MAX_DEPTH:
        raise ValueError(f"{depths} draft depths is more than the kernel's MAX_DEPTH = {MAX_DEPTH}")
    return budget


# The heap kernel's block by budget. Measured on the H200 (tools/heap_threads.py, L = 15, µs a
# build for 32 / 64 / 128 threads): budget 16 19.3 / 19.6 / 20.7, 32 35.3 / 35.9 / 39.6, 64
# 71.4 / 69.2 / 76.8, 128 152 / 142 / 151, 256 347 / 305 / 312, 1024 2314 / 1700 / 1490. A pop
# costs ~1.1-1.5 µs at any of them, and as much in one warp holding the frontier in registers
# (a kernel tried at e55be42: 19.9 / 36.9 / 84.4 / 193 µs at budgets 16 / 32 / 64 / 128, then
# removed): neither the block size nor the shared frontier is what sets it. What does: ~720 warp
# instructions a pop, issued one after another by one warp (ncu by SASS instruction, H100, budget
# 64); the warp arg-max by order keys took ~300 out (H100, default block: 16 / 32 / 64 / 128 ->
# 14.8 / 26.0 / 50.4 / 138.7 µs). Since, on an H100 (the lp copy stepped, e5d8a68; 32 / 64
# threads): budget 64 48.9 / 47.7, 128 115.4 / 132.4, 192 188.2 / 197.7, 256 271.9 / 265.5 µs:
# one warp again from 65 to 192 nodes. (The device round takes the level build from 256 nodes.)
_HEAP_THREADS = ((32, 32), (64, 64), (192, 32), (256, 64))   # (up to this budget, threads); past them THREADS


def _heap_threads(budget: int) -> int:
    """The heap kernel's threads for a build of ``budget`` nodes (``build_tree``'s default)."""
    return next((t for most, t in _HEAP_THREADS if budget <= most), THREADS)


BUILD_METHODS = ("warp", "block")


def _build_method(method, budget: int, threads) -> str:
    """The heap build's kernel: ``method`` as given, else "warp" up to WARP_DEFAULT_UP_TO nodes when
    no block size is asked for, else "block"."""
    if method is None:
        return "warp" if budget <= WARP_DEFAULT_UP_TO and threads is None else "block"
    if method not in BUILD_METHODS:
        raise ValueError(f"method must be one of {BUILD_METHODS} or None, got {method!r}")
    if method == "warp":
        if budget > WARP_BUDGET:
            raise ValueError(f"the warp build takes budgets up to WARP_BUDGET = {WARP_BUDGET}, got {budget}")
        if threads not in (None, 32):
            raise ValueError(f"the warp build runs one warp (threads 32 or None), got threads = {threads!r}")
    return method


def _launch_heap_build(lp, ids, budget, budget_device, bufs, stream, threads, method=None):
    """The heap build over device lp / ids [S, L, K] into ``TreeBatchBuffers`` bufs, a block a
    tree (inputs already checked by the launcher): the warp kernel or the block kernel
    (``_build_method``); ``threads`` None: ``_heap_threads(budget)`` for the block kernel."""
    S, L, K = lp.shape
    if K > MAX_BUDGET:
        raise ValueError(f"K = {K} ranks per depth is more than the kernel takes ({MAX_BUDGET})")
    method = _build_method(method, budget, threads)
    if method == "warp":
        if S:
            _build_tree_warp_kernel(WARP_REDUX)[S, 32, stream](
                lp, ids, budget, _device_budget(budget_device, S),
                bufs.tokens, bufs.depths, bufs.parents, bufs.ranks, bufs.scores, bufs.n_nodes)
        return
    threads = _heap_threads(budget) if threads is None else threads
    threads = check_threads(threads, hi=256)  # static shared memory: 48 KiB a block
    if S:
        _build_tree_kernel(threads)[S, threads, stream](
            lp, ids, budget, _device_budget(budget_device, S),
            bufs.tokens, bufs.depths, bufs.parents, bufs.ranks, bufs.scores, bufs.n_nodes)


def build_tree(lp, ids, budget, *, out=None, budget_device=None, stream=0, threads=None, method=None):
    """The ``budget`` best rank paths as a tree, built on the GPU.

    lp [L, K] float32 (rows descending), ids [L, K] int32, numpy or device. Returns a host
    ``Tree`` bit-identical to ``reference.build_tree``, or, when ``out`` (``TreeBuffers``)
    is given, fills it on ``stream`` and returns it without synchronising. ``budget_device``:
    an int32 [1] device array; the kernel then builds min(budget, budget_device[0]) nodes, read
    when it runs (so a captured graph replays with the budget of the moment; ``budget`` is the
    most it may be). ``method``: "warp" (the frontier in one warp's registers, budgets up to
    WARP_BUDGET) or "block" (the frontier in shared memory, any budget); None: "warp" up to
    WARP_DEFAULT_UP_TO = WARP_BUDGET nodes when ``threads`` is None, else "block". ``threads``: the
    block kernel's threads (default ``_heap_threads(budget)``: one warp up to budget 32, two to 64,
    one to 192, two to 256).
    Neither changes the tree.
    """
    budget = _check_limits(check_build_inputs(lp, ids, budget), lp.shape[0])
    L, K = lp.shape
    bufs = out if out is not None else TreeBuffers.allocate(budget, stream)
    if bufs.capacity < budget:
        raise ValueError(f"out holds {bufs.capacity} nodes; budget is {budget}")
    _launch_heap_build(to_device(lp, stream).reshape(1, L, K), to_device(ids, stream).reshape(1, L, K), budget,
                       budget_device, bufs.as_batch(), stream, threads, method)     # a batch of one
    return bufs if out is not None else bufs.to_tree(stream)


def build_trees(lp, ids, budget, *, out=None, budget_device=None, stream=0, threads=None, method=None):
    """``build_tree`` for each sequence of a batch, in one launch (a warp or a block a sequence).

    lp [S, L, K] float32 (rows descending), ids [S, L, K] int32, numpy or device. Returns S host
    ``Tree``s, each bit-identical to ``reference.build_tree`` of its sequence (the twin:
    ``reference.build_trees``), or, when ``out`` (``TreeBatchBuffers`` for at least S trees) is
    given, fills its first S rows on ``stream`` and returns it without synchronising.
    ``budget_device``: as ``build_tree``'s, one budget for every sequence, or int32 [S]: tree
    s builds min(budget, budget_device[s]) nodes (the batched device round's). ``method`` and
    ``threads``: as ``build_tree``'s (a warp or a block a sequence); they never change the trees.
    """
    budget = _check_limits(check_batch_build_inputs(lp, ids, budget), lp.shape[1])
    S = lp.shape[0]
    bufs = out if out is not None else TreeBatchBuffers.allocate(max(S, 1), budget, stream)
    if bufs.capacity < budget or bufs.trees < S:
        raise ValueError(f"out holds {bufs.trees} trees of {bufs.capacity} nodes; this build needs {S} of {budget}")
    _launch_heap_build(to_device(lp, stream), to_device(ids, stream), budget, budget_device, bufs, stream, threads,
                       method)
    return bufs if out is not None else bufs.to_trees(stream)[:S]


# -- the level-synchronous build: no pop chain (twin: reference.build_tree_levels) ---------------
# One block (``_level_threads(budget)`` threads) follows the twin step for step: per depth, a
# binary search a parent counts its children scoring >= tau (a running lower bound on the B-th best
# score); when there are at most B, those are the level (the common case). Else the selection: the
# parents sorted by score (bitonic, shared memory) give each its cap of candidate ranks; the
# candidates' B-th score (a radix select on the float64's order-preserving bits) is the level's
# threshold; binary searches and prefix sums give each parent's kept children (ties at the threshold
# in path order). The level is written in path order, and its scores, sorted, merge into the B best
# so far: tau is their B-th. A level with no node ends the loop. When those B scores are distinct
# and no other node ties the B-th, the tree is the nodes >= tau, each placed in pop order by a
# binary search of its score there. Otherwise subtree sizes (bottom-up) and preorder (top-down) by
# prefix sums, the ties at tau by a preorder bitmap, and the chosen nodes sorted by (-score,
# preorder) into pop order. Every float64 sum is the twin's, so the trees are
# bit-identical; the level data lives in a ``LevelScratch`` in global memory.
LEVEL_THREADS = 1024                      # the most threads the level build takes


def _level_threads(budget: int) -> int:
    """The level build's block for a budget: the power of two >= budget, 32 to LEVEL_THREADS.
    A level holds up to about budget x H(budget) candidates, so this is a few a thread; more
    threads only add the block's control flow and barriers (every warp runs every step)."""
    t = 32
    while t < budget and t < LEVEL_THREADS:
        t *= 2
    return t


_INT_MAX = 2**31 - 1
_NEG_INF = -np.inf
_SIGN = np.uint64(1 << 63)

if config.ENABLE_CUDASIM:
    import struct as _struct

    def _order_key(x):
        """float64 -> uint64 whose unsigned order is the float order (-0.0 just below +0.0)."""
        b = _struct.unpack("<Q", _struct.pack("<d", float(x)))[0]
        return np.uint64(~b & 0xFFFFFFFFFFFFFFFF) if b >> 63 else np.uint64(b | (1 << 63))

    def _key_value(k):
        k = int(k)
        b = k & ~(1 << 63) if k >> 63 else ~k & 0xFFFFFFFFFFFFFFFF
        return np.float64(_struct.unpack("<d", _struct.pack("<Q", b))[0])
else:
    from numba.cuda import libdevice as _libdevice

    @device_function
    def _order_key(x):
        """float64 -> uint64 whose unsigned order is the float order (-0.0 just below +0.0):
        negative x all bits flipped, else the sign bit set (branch-free: an arithmetic shift's mask)."""
        b = _libdevice.double_as_longlong(x)
        return uint64(b) ^ (uint64(b >> int64(63)) | _SIGN)

    @device_function
    def _key_value(k):
        if k >> uint64(63):
            b = k & ~_SIGN
        else:
            b = ~k
        return _libdevice.longlong_as_double(int64(b))


def _level_candidates(budget: int, ranks: int) -> int:
    """Candidate children a level can hold: sum over parent positions i < budget of
    min(ranks, budget // (i + 1)) (under budget x H(budget): 7,262 at 1024)."""
    return sum(min(ranks, budget // (i + 1)) for i in range(budget))


@dataclass(frozen=True)
class LevelScratch:
    """Global memory of the level build, for L depths and budget B (reusable across builds)."""

    score: object    # [L, B] float64: level d's nodes in path order
    parent: object   # [L, B] int32: index of the parent in level d - 1
    rank: object     # [L, B] int32
    start: object    # [L, B] int32: first child in level d + 1
    keep: object     # [L, B] int32: children kept in level d + 1
    csum: object     # [L, B + 1] int32: exclusive prefix sums of the subtree sizes
    pre: object      # [L, B] int32: preorder position (root 0)
    node: object     # [L, B] int32: node number (pop order) of chosen nodes
    cand: object     # [1, C] float64: a level's candidate scores
    flags: object    # [L * B + 2] int32: ties by preorder position, then their prefix counts
    seed: object     # [1] float64: the seed the last build computed (-inf: it computed none)

    @classmethod
    def allocate(cls, depths: int, budget: int, stream=0) -> "LevelScratch":
        L, B = max(depths, 1), max(budget, 1)

        def arr(shape, dt):
            return cuda.device_array(shape, dt, stream=stream)
        return cls(arr((L, B), np.float64), arr((L, B), np.int32), arr((L, B), np.int32), arr((L, B), np.int32),
                   arr((L, B), np.int32), arr((L, B + 1), np.int32), arr((L, B), np.int32), arr((L, B), np.int32),
                   arr((1, _level_candidates(B, B)), np.float64), arr(L * B + 2, np.int32), arr(1, np.float64))

    def fits(self, depths: int, budget: int) -> bool:
        return (self.score.shape[0] >= depths and self.score.shape[1] == budget)


# The level build raises its bound by the seed family before its first selection (``seed``; twin:
# ``reference.tree_build.family_seed``). On six demo-drafter drafts (tools/level_seed_study.py,
# CPU) it takes the selecting levels at budgets 16 / 64 / 128 / 256 / 1024 from 6 / 12 / 13 / 15 /
# 19 to 0 / 0 / 4 / 4 / 6; a draft that never selects never computes it. Measured on the H200
# (4815288, a demo-drafter draft, µs unseeded / seeded in its own block / seeded in 512 threads):
# 92 / 468 / 97 at budget 16, 111 / 344 / 137 at 64, 161 / 211 / 183 at 256, 447 / 324 / 304 at
# 1024. The seed's search (binary searches of lp in global memory) costs more than the selections
# it saves below ~1024 nodes, so by default it runs from SEED_FROM nodes, in SEED_THREADS threads:
# at 1024 threads (64 registers a thread) its code takes the kernel from 104 to ~2,300 bytes of
# spill loads (ptxas 13.0 -v), 36 at 512.
LEVEL_SEED = True
SEED_FROM = 512
SEED_THREADS = 512


@functools.lru_cache(maxsize=None)
def _build_tree_levels_kernel(threads, seed=True):
    T = threads
    NB = MAX_BUDGET
    NC = SEED_CANDIDATES - 1                  # candidates a round of the seed's search
    CG = 5                                    # ... a thread searches at once (their loads in
    G = NC // CG                              # flight together), in G groups
    FAM = 2 * MAX_DEPTH + NC                  # the seed's shared values: chain sums, lp[:, 0], candidates
    CAND = 2 * MAX_DEPTH
    SCAN = max(T, 64)                         # the scan's buffer: a partial sum per thread
    WARP = WARP_OPS and T % 32 == 0           # full-warp shuffles (not the simulator)
    NW = T // 32
    MERGE = (NB + T - 1) // T                 # entries of top a thread moves in the merge

    @device_function
    def scan(src, dst, n, tmp, t):
        """Exclusive prefix sums of src[:n] into dst[:n] (may be src); every thread returns the
        total. Each thread sums a contiguous segment; the segments are scanned with warp
        shuffles and one warp over the warps' totals (a GPU: 3 barriers), or by Hillis-Steele
        in shared memory (the simulator, which has no shuffles)."""
        per = (n + T - 1) // T
        lo = min(n, t * per)
        hi = min(n, lo + per)
        s = 0
        for i in range(lo, hi):
            s += src[i]
        if WARP:
            w = t // 32
            lane = t % 32
            x = warp_inclusive_scan(s)
            if lane == 31:
                tmp[w] = x
            cuda.syncthreads()                # every warp's total is in
            if w == 0:
                v = 0
                if lane < NW:
                    v = tmp[lane]
                v = warp_inclusive_scan(v)
                if lane < NW:
                    tmp[32 + lane] = v
            cuda.syncthreads()                # the warps' inclusive totals are in
            run = x - s
            if w > 0:
                run += tmp[32 + w - 1]
            total = tmp[32 + NW - 1]
        else:
            tmp[t] = s
            cuda.syncthreads()
            off = 1
            while off < T:
                v = 0
                if t >= off:
                    v = tmp[t - off]
                cuda.syncthreads()
                tmp[t] += v
                cuda.syncthreads()
                off *= 2
            run = tmp[t] - s
            total = tmp[T - 1]
        for i in range(lo, hi):
            v = src[i]
            dst[i] = run
            run += v
        cuda.syncthreads()                    # tmp is free again, dst is complete
        return total

    @device_function
    def upper_bound(a, n, x):
        """The first index in [0, n) with a[index] > x (a non-decreasing), else n."""
        lo = 0
        hi = n
        while lo < hi:
            mid = (lo + hi) // 2
            if a[mid] > x:
                hi = mid
            else:
                lo = mid + 1
        return lo

    @device_function
    def children_above(s, row, R, thr, strict):
        """How many ranks r < R have fl(s + row[r]) > thr (``strict``) or >= thr: a binary search
        (the sums do not increase with r)."""
        lo = 0
        hi = R
        while lo < hi:
            mid = (lo + hi) // 2
            v = s + float64(row[mid])
            if v > thr or (not strict and v == thr):
                lo = mid + 1
            else:
                hi = mid
        return lo

    @device_function
    def add_over_block(counter, i, x, t):
        """counter[i] += x for every thread's x: a warp's sum and one atomic a warp (every thread
        must call)."""
        if WARP:
            x = warp_sum(x)
            if t % 32 == 0:
                cuda.atomic.add(counter, i, x)
        else:
            cuda.atomic.add(counter, i, x)

    @device_function
    def ranked_before(a, n, x, strict):
        """How many of a[:n] (descending) are > x (``strict``) or >= x: a binary search."""
        lo = 0
        hi = n
        while lo < hi:
            mid = (lo + hi) // 2
            if a[mid] > x or (not strict and a[mid] == x):
                lo = mid + 1
            else:
                hi = mid
        return lo

    @device_function
    def path_less(lv_parent, da, ia, db, ib):
        """Node (depth index da, level index ia) before (db, ib) by rank path, a prefix first: each
        level is in path order, so the deeper one's ancestor at the other's depth settles it by
        index (equal: the shallower is its ancestor). Twin: ``reference.tree_build._path_less``."""
        a = ia
        b = ib
        d = da
        while d > db:
            a = lv_parent[d, a]
            d -= 1
        d = db
        while d > da:
            b = lv_parent[d, b]
            d -= 1
        return a < b or (a == b and da < db)

    @device_function
    def place(d, i, j, s, ids, lv_rank, lv_node, tokens, depths, ranks, scores):
        """Level node (d, i), scoring s, is node j + 1 in pop order."""
        lv_node[d, i] = j + 1
        r = lv_rank[d, i]
        tokens[j] = ids[d, r]
        depths[j] = d + 1
        ranks[j] = r
        scores[j] = s

    @device_function
    def better(ss, sk, a, b):
        """Does entry a sort before entry b: score descending, then key ascending."""
        return ss[a] > ss[b] or (ss[a] == ss[b] and sk[a] < sk[b])

    @device_function
    def bitonic(ss, sk, sp, n, t):
        """Sort entries [0, n) (n a power of two) of (ss, sk, sp) best first."""
        k = 2
        while k <= n:
            j = k // 2
            while j > 0:
                for i in range(t, n, T):
                    other = i ^ j
                    if other > i:
                        if (i & k) == 0:
                            swap = better(ss, sk, other, i)
                        else:
                            swap = better(ss, sk, i, other)
                        if swap:
                            v = ss[i]
                            ss[i] = ss[other]
                            ss[other] = v
                            w = sk[i]
                            sk[i] = sk[other]
                            sk[other] = w
                            w = sp[i]
                            sp[i] = sp[other]
                            sp[other] = w
                cuda.syncthreads()
                j //= 2
            k *= 2

    @device_function
    def bitonic_warp(ss, sk, sp, n, t):
        """``bitonic``'s sort when n <= T, a thread an entry held in registers: the stages that
        pair entries of one warp (distance < 32) exchange by shuffles, the others through shared
        memory (30 barriers for n = 1024 instead of 55, and no shared traffic in the rest)."""
        sc = _NEG_INF
        ky = _INT_MAX
        pl = 0
        if t < n:
            sc = ss[t]
            ky = sk[t]
            pl = sp[t]
        k = 2
        while k <= n:
            j = k // 2
            while j > 0:
                if j >= 32:
                    if t < n:
                        ss[t] = sc
                        sk[t] = ky
                        sp[t] = pl
                    cuda.syncthreads()                # everyone's entry is current in shared memory
                    o = t ^ j
                    osc = _NEG_INF
                    oky = _INT_MAX
                    opl = 0
                    if t < n:
                        osc = ss[o]
                        oky = sk[o]
                        opl = sp[o]
                    cuda.syncthreads()                # partners are read before anyone writes
                else:
                    osc = cuda.shfl_xor_sync(FULL_MASK, sc, j)
                    oky = cuda.shfl_xor_sync(FULL_MASK, ky, j)
                    opl = cuda.shfl_xor_sync(FULL_MASK, pl, j)
                # each lane decides alone: right for a strict order (keys are distinct). A NaN
                # score (only from device rows nobody checked) would duplicate an entry: indices
                # stay in bounds, and such a build has no defined tree anyway
                other_better = osc > sc or (osc == sc and oky < ky)
                # best first within each k-run whose bit k is 0, worst first otherwise: the lower
                # index of a pair keeps the better entry in a best-first run
                want_better = ((t & j) == 0) == ((t & k) == 0)
                if other_better == want_better:
                    sc = osc
                    ky = oky
                    pl = opl
                j //= 2
            k *= 2
        if t < n:
            ss[t] = sc
            sk[t] = ky
            sp[t] = pl
        cuda.syncthreads()                            # the sorted entries are in shared memory

    @device_function
    def sort_entries(ss, sk, sp, n, t):
        """Sort entries [0, n) (n a power of two) of (ss, sk, sp) best first."""
        if WARP and n <= T:
            bitonic_warp(ss, sk, sp, n, t)
        else:
            bitonic(ss, sk, sp, n, t)

    @device_function
    def kth_largest(vals, counts, rows, k, hist, bins, tmp, sel, low, t):
        """The k-th largest of the float64 vals[d, :counts[d]] for d < rows, with multiplicity
        (k <= their number), by a radix select on the order-preserving uint64 keys.

        First the keys' min and max: the bits above their highest difference are common to
        every key, so the passes start there (scores of one level share sign and exponent, and
        usually more). Each pass is a shared histogram of one 8-bit digit of the keys that match
        the bits decided so far, then a scan of the bins from the top to find the digit holding
        the k-th. Once that bin is needed whole, the k-th is its smallest key: one atomic-min
        pass ends the search."""
        if t == 0:
            low[0] = ~uint64(0)
            low[1] = uint64(0)
        cuda.syncthreads()                    # low is reset
        kmin = ~uint64(0)
        kmax = uint64(0)
        for d in range(rows):
            for i in range(t, counts[d], T):
                key = _order_key(vals[d, i])
                kmin = min(kmin, key)
                kmax = max(kmax, key)
        if WARP:
            kmin = warp_min_u64(kmin)
            kmax = ~warp_min_u64(~kmax)
            if t % 32 == 0:
                cuda.atomic.min(low, 0, kmin)
                cuda.atomic.max(low, 1, kmax)
        else:
            cuda.atomic.min(low, 0, kmin)
            cuda.atomic.max(low, 1, kmax)
        cuda.syncthreads()                    # the keys' range is in
        kmin = low[0]
        kmax = low[1]
        diff = kmin ^ kmax
        top = -1                              # the highest bit where some keys differ
        while top < 63 and (diff >> uint64(top + 1)) != uint64(0):
            top += 1
        if top < 0:                           # every key is the same
            cuda.syncthreads()                # low is rewritten by the next call
            return _key_value(kmin)
        decided = ~((uint64(1) << uint64(top + 1)) - uint64(1)) if top < 63 else uint64(0)
        prefix = kmax & decided
        kk = k
        shift = max(top - 7, 0)
        while True:
            for b in range(t, 256, T):
                hist[b] = 0
            cuda.syncthreads()
            for d in range(rows):
                for i in range(t, counts[d], T):
                    key = _order_key(vals[d, i])
                    if (key & decided) == prefix:
                        # concentrated digits: one atomic per bin a warp (_warp.hist_add)
                        hist_add(hist, int32((key >> uint64(shift)) & uint64(255)))
            cuda.syncthreads()
            for b in range(t, 256, T):        # the bins from the top digit down
                bins[b] = hist[255 - b]
            cuda.syncthreads()
            scan(bins, bins, 256, tmp, t)     # bins[b]: keys in the bins above digit 255 - b
            if t == 0:
                low[0] = ~uint64(0)
            for b in range(t, 256, T):
                above = bins[b]
                if above < kk and above + hist[255 - b] >= kk:
                    sel[0] = 255 - b
                    sel[1] = kk - above
                    sel[2] = 1 if hist[255 - b] == kk - above else 0
            cuda.syncthreads()
            # bits the digit overlaps with earlier ones hold the same value in every matching key
            prefix = prefix | (uint64(sel[0]) << uint64(shift))
            decided = decided | (uint64(255) << uint64(shift))
            kk = sel[1]
            if shift == 0:
                cuda.syncthreads()            # sel is rewritten by the next call
                return _key_value(prefix)
            if sel[2] != 0:                   # the whole bin is needed (uniform: sel is shared)
                for d in range(rows):
                    for base in range(0, counts[d], T):   # the same trip count in every thread
                        i = base + t
                        key = ~uint64(0)
                        if i < counts[d]:
                            key = _order_key(vals[d, i])
                            if (key & decided) != prefix:
                                key = ~uint64(0)
                        if WARP:              # the warp's minimum, then one atomic
                            key = warp_min_u64(key)
                            if t % 32 == 0 and key != ~uint64(0):
                                cuda.atomic.min(low, 0, key)
                        elif key != ~uint64(0):
                            cuda.atomic.min(low, 0, key)
                cuda.syncthreads()
                found = low[0]
                cuda.syncthreads()            # low and sel are rewritten by the next call
                return _key_value(found)
            cuda.syncthreads()                # sel is rewritten by the next pass
            shift = max(shift - 8, 0)

    @device_function
    def family_seed(lp, L, R, B, fam, cnt, low, cv, lo, hi, t):
        """The twin's ``family_seed``, the same value (the same float64 sums and candidates);
        every thread returns it (every thread must call). ``fam`` shared float64
        [2 MAX_DEPTH + NC]: the chain's sum before each depth, each depth's lp[d, 0], then a
        round's candidates; ``cnt`` shared int32 [NC]; ``cv`` / ``lo`` / ``hi`` a thread's [CG]
        candidates and search bounds. A thread takes a
        family list (d, e) and a group of CG candidates: their binary searches run side by side
        (the loads in flight together)."""
        if L == 0 or R == 0 or L * R + (L * (L - 1) // 2) * (R - 1) < B:
            return _NEG_INF
        if t == 0:
            c = 0.0
            for d in range(L):
                fam[d] = c                    # the chain to depth d - 1, in path order
                fam[MAX_DEPTH + d] = float64(lp[d, 0])
                c = c + fam[MAX_DEPTH + d]
            low[0] = ~uint64(0)
        cuda.syncthreads()
        kmin = ~uint64(0)                     # the lists' last entries: the family's lowest score
        for d in range(t, L, T):
            v = fam[d] + float64(lp[d, R - 1])
            kmin = min(kmin, _order_key(v))
            for e in range(d + 1, L):
                v = v + fam[MAX_DEPTH + e]
                kmin = min(kmin, _order_key(v))
        if WARP:
            kmin = warp_min_u64(kmin)
            if t % 32 == 0:
                cuda.atomic.min(low, 0, kmin)
        else:
            cuda.atomic.min(low, 0, kmin)
        cuda.syncthreads()
        good = _key_value(low[0])
        bad = float64(lp[0, 0])
        cuda.syncthreads()                    # low is read (kth_largest rewrites it)
        n_lists = L * (L + 1) // 2
        for _ in range(SEED_ROUNDS):
            if t == 0:                        # candidates by repeated addition, as the twin
                step = (bad - good) / SEED_CANDIDATES
                x = good
                for j in range(NC):
                    x = x + step
                    fam[CAND + j] = x
            for j in range(t, NC, T):
                cnt[j] = 0
            cuda.syncthreads()
            items = n_lists * G
            for w in range(t, items + (T - items % T) % T, T):   # the same trips in every thread
                g = w % G                     # candidates g * CG ..
                li = w // G                   # list li = (d, e): d's lists e = d .. L - 1 in turn
                d = 0
                e = li
                while d < L and e >= L - d:
                    e -= L - d
                    d += 1
                e += d
                first = 0 if e == d else 1    # (e > d: rank 0 is the chain, counted at e = d)
                n = 0
                if w < items:
                    n = R
                for j in range(CG):
                    cv[j] = fam[CAND + g * CG + j]
                    lo[j] = first
                    hi[j] = n
                live = n > first
                while live:                   # CG binary searches side by side
                    live = False
                    for j in range(CG):
                        if lo[j] < hi[j]:
                            mid = (lo[j] + hi[j]) // 2
                            v = fam[d] + float64(lp[d, mid])
                            for i in range(d + 1, e + 1):
                                v = v + fam[MAX_DEPTH + i]
                            if v >= cv[j]:
                                lo[j] = mid + 1
                            else:
                                hi[j] = mid
                            live = live or lo[j] < hi[j]
                for gg in range(G):           # every thread adds to every count (warp sums)
                    for j in range(CG):
                        add_over_block(cnt, gg * CG + j, max(lo[j] - first, 0) if gg == g else 0, t)
            cuda.syncthreads()                # every count is in
            n_ok = 0
            for j in range(NC):
                if cnt[j] >= B:               # a prefix of the candidates (they rise with j)
                    n_ok += 1
            if n_ok > 0:
                good = fam[CAND + n_ok - 1]
            if n_ok < NC:
                bad = fam[CAND + n_ok]
            cuda.syncthreads()                # fam and cnt are rewritten by the next round
        return good

    @device_function
    def select_level(lv_score, d, P, R, B, row, ss, sk, sp, a0, a1, a2, cand, one, hist, bins, tmp, sel, low,
                     t):
        """The twin's ``select_level``: level d's best B children of the P parents (scores
        lv_score[d - 1], the root's 0 at d = 0) by (-score, parent's path, rank). Leaves each
        parent's kept count in a0 and its first child in a1; returns their total (B, unless the
        rows were not sorted)."""
        NP = 1
        while NP < P:
            NP *= 2
        for i in range(t, NP, T):
            if i < P:
                ss[i] = 0.0 if d == 0 else lv_score[d - 1, i]
                sk[i] = i
            else:
                ss[i] = _NEG_INF
                sk[i] = _INT_MAX
            sp[i] = i
        cuda.syncthreads()
        sort_entries(ss, sk, sp, NP, t)
        # 1. the threshold: the B-th score of the capped candidates (the i-th best parent offers
        #    ranks r with (i + 1)(r + 1) <= B)
        for i in range(t, P, T):
            a0[i] = min(R, B // (i + 1))
        cuda.syncthreads()
        total = scan(a0, a0, P, tmp, t)
        thr = _NEG_INF
        if total >= B:
            for slot in range(t, total, T):
                i = upper_bound(a0, P, slot) - 1
                cand[0, slot] = ss[i] + float64(row[slot - a0[i]])
            if t == 0:
                one[0] = total
            cuda.syncthreads()
            thr = kth_largest(cand, one, 1, B, hist, bins, tmp, sel, low, t)
        # 2. per parent (path order): children above the threshold, ties at it in path order
        for p in range(t, P, T):
            s = 0.0 if d == 0 else lv_score[d - 1, p]
            gt = children_above(s, row, R, thr, True)
            a0[p] = gt
            a1[p] = children_above(s, row, R, thr, False) - gt
        cuda.syncthreads()
        m = B - scan(a0, a2, P, tmp, t)
        scan(a1, a2, P, tmp, t)                      # a2: ties of earlier parents
        for p in range(t, P, T):
            a0[p] = a0[p] + min(max(m - a2[p], 0), a1[p])
        cuda.syncthreads()
        return scan(a0, a1, P, tmp, t)               # a1: first child of each parent

    # launch bounds: registers capped so that a block of T (up to 1024) threads fits an SM
    @cached
    @(cuda.jit if config.ENABLE_CUDASIM else cuda.jit(launch_bounds=(T,), lineinfo=LINEINFO))
    def kernel(lp, ids, budget, n_budget, tie_slots, tokens, depths, parents, ranks, scores, n_nodes,
               lv_score, lv_parent, lv_rank, lv_start, lv_keep, lv_csum, lv_pre, lv_node, cand, flags, seed_out):
        grid_dependency_after((lp, ids, budget, n_budget, tie_slots, tokens, depths, parents, ranks, scores, n_nodes,
                               lv_score, lv_parent, lv_rank, lv_start, lv_keep, lv_csum, lv_pre, lv_node, cand, flags,
                               seed_out))
        t = cuda.threadIdx.x
        L = lp.shape[0]
        K = lp.shape[1]
        B = _launch_budget(budget, n_budget, 0)         # this launch's budget
        R = min(K, B)
        # tied nodes placed by path compares at most (the sort arrays hold up to NB); -1: the
        # twin's few_ties_limit(B). A runtime argument, not a factory's, so that every budget
        # shares one compiled kernel
        TS = min(tie_slots, NB) if tie_slots >= 0 else min(TIE_SLOTS, B // TIE_SHARE)
        row = cuda.shared.array(NB, float32)             # lp[d, :R]
        ss = cuda.shared.array(NB, float64)              # sort: scores
        sk = cuda.shared.array(NB, int32)                # sort: tie key (path index, preorder)
        sp = cuda.shared.array(NB, int32)                # sort: payload
        a0 = cuda.shared.array(NB, int32)                # per parent, path order
        a1 = cuda.shared.array(NB, int32)
        a2 = cuda.shared.array(NB, int32)
        tmp = cuda.shared.array(SCAN, int32)
        hist = cuda.shared.array(256, int32)
        bins = cuda.shared.array(256, int32)
        sel = cuda.shared.array(3, int32)
        low = cuda.shared.array(2, uint64)           # (min, max) scratch of kth_largest
        counts = cuda.shared.array(MAX_DEPTH, int32)     # nodes of each level
        one = cuda.shared.array(4, int32)
        top = cuda.shared.array(NB, float64)             # the B best scores kept so far
        mv = cuda.local.array(MERGE, float64)            # a thread's entries of the merge
        nv = cuda.local.array(MERGE, float64)
        mp = cuda.local.array(MERGE, int32)
        np_ = cuda.local.array(MERGE, int32)
        fam = cuda.shared.array(FAM, float64)            # the seed's chain sums and candidates
        cnt = cuda.shared.array(NC, int32)
        cv = cuda.local.array(CG, float64)
        slo = cuda.local.array(CG, int32)
        shi = cuda.local.array(CG, int32)
        seeded = not seed
        if t == 0:
            seed_out[0] = _NEG_INF
        for i in range(t, B, T):
            top[i] = _NEG_INF
        levels = L if (B > 0 and K > 0) else 0
        tau = _NEG_INF                                   # a lower bound on the B-th best score
        for d in range(levels):
            P = 1 if d == 0 else counts[d - 1]
            for r in range(t, R, T):
                row[r] = lp[d, r]
            cuda.syncthreads()
            # 0. the children scoring >= tau, when at most B: no selection (the common case)
            for p in range(t, P, T):
                s = 0.0 if d == 0 else lv_score[d - 1, p]
                a0[p] = children_above(s, row, R, tau, False)
            cuda.syncthreads()
            count = scan(a0, a1, P, tmp, t)              # a1: first child of each parent
            if count > B and not seeded:                 # before the first selection: the seed
                seeded = True
                fs = family_seed(lp, L, R, B, fam, cnt, low, cv, slo, shi, t)
                if t == 0:
                    seed_out[0] = fs
                tau = max(tau, fs)
                for p in range(t, P, T):
                    s = 0.0 if d == 0 else lv_score[d - 1, p]
                    a0[p] = children_above(s, row, R, tau, False)
                cuda.syncthreads()
                count = scan(a0, a1, P, tmp, t)
            if count > B:
                count = select_level(lv_score, d, P, R, B, row, ss, sk, sp, a0, a1, a2, cand, one,
                                     hist, bins, tmp, sel, low, t)
            if count > B:                                # only from rows not sorted, or NaN inside a
                if t == 0:                               # row (device inputs are not value-checked):
                    parents[0] = -1                      # an empty tree, not writes past the levels
                    n_nodes[0] = 0
                return
            for p in range(t, P, T):
                if d > 0:
                    lv_start[d - 1, p] = a1[p]
                    lv_keep[d - 1, p] = a0[p]
            if t == 0:
                counts[d] = count
            if count == 0:                               # no level below holds a node either
                levels = d
                break
            NP = 1
            while NP < count:
                NP *= 2
            for slot in range(t, NP, T):
                v = _NEG_INF
                if slot < count:
                    p = upper_bound(a1, P, slot) - 1
                    r = slot - a1[p]
                    s = 0.0 if d == 0 else lv_score[d - 1, p]
                    v = s + float64(row[r])
                    lv_score[d, slot] = v
                    lv_parent[d, slot] = p
                    lv_rank[d, slot] = r
                ss[slot] = v                             # the level's scores, to sort for tau
                sk[slot] = slot
                sp[slot] = 0
            cuda.syncthreads()
            # tau: the B-th best score kept so far. The level's scores sorted best first merge
            # into top (the B best before it): an entry's place is its index plus the other list's
            # entries before it (top's first on ties); every read before any write
            if P > 1:                                    # one parent's children come sorted
                sort_entries(ss, sk, sp, NP, t)
            for j in range(MERGE):
                i = t + j * T
                mv[j] = _NEG_INF
                nv[j] = _NEG_INF
                mp[j] = B
                np_[j] = B
                if i < B:
                    mv[j] = top[i]
                    mp[j] = i + ranked_before(ss, count, mv[j], True)
                    if i < count:
                        nv[j] = ss[i]
                        np_[j] = i + ranked_before(top, B, nv[j], False)
            cuda.syncthreads()                           # top is read
            for j in range(MERGE):
                if mp[j] < B:
                    top[mp[j]] = mv[j]
                if np_[j] < B:
                    top[np_[j]] = nv[j]
            cuda.syncthreads()                           # top holds the B best so far
            tau = max(tau, top[B - 1])
        if levels == 0:
            if t == 0:
                parents[0] = -1
                n_nodes[0] = 0
            return
        U = 0
        for d in range(levels):
            U += counts[d]
        thr = _NEG_INF
        if U > B:
            thr = tau                                    # the union's B-th best (top[B - 1])
        n = min(U, B)
        # the common case: the B best scores distinct and no other node tying the B-th. Then the
        # tree is the nodes >= thr, and a node's place in pop order is the number of top above it
        if t == 0:
            one[0] = 0
            one[1] = 0
            one[2] = 0
            one[3] = 0
        cuda.syncthreads()
        same = 0
        tied = 0                                         # tied nodes (twin: tied_count): those of
        for i in range(t, n, T):                         # top above thr equal to a neighbour ...
            s = top[i]
            if i + 1 < n and s == top[i + 1]:
                same = 1
                if s > thr:
                    tied += 1
            elif i > 0 and s == top[i - 1] and s > thr:
                tied += 1
        if same:
            one[1] = 1
        at_least = 0
        nans = 0
        for d in range(levels):
            for i in range(t, counts[d], T):
                s = lv_score[d, i]
                if s >= thr:
                    at_least += 1
                    if s == thr:                         # ... and every node scoring thr
                        tied += 1
                elif s != s:
                    nans += 1
        add_over_block(one, 0, at_least, t)
        add_over_block(one, 2, nans, t)
        add_over_block(one, 3, tied, t)
        cuda.syncthreads()
        if one[2] != 0:
            # a NaN log-prob kept as a node (device rows are not value-checked) has no place in pop
            # order, and placing by it would write past the tree: an empty tree
            if t == 0:
                parents[0] = -1
                n_nodes[0] = 0
            return
        if one[0] == n and one[1] == 0:
            for d in range(levels):
                for i in range(t, counts[d], T):
                    s = lv_score[d, i]
                    if s >= thr:
                        place(d, i, ranked_before(top, n, s, True), s, ids, lv_rank, lv_node, tokens, depths, ranks,
                              scores)
            cuda.syncthreads()                           # every node number is in
            for d in range(levels):
                for i in range(t, counts[d], T):
                    if lv_score[d, i] >= thr:
                        parents[lv_node[d, i]] = 0 if d == 0 else lv_node[d - 1, lv_parent[d, i]]
            if t == 0:
                parents[0] = -1
                n_nodes[0] = n
            return
        width = lv_score.shape[1]
        if TS > 0 and one[3] <= TS:
            # few ties (twin: _order_few_ties): an untied node sits at j0, the number of the B best
            # scores above its own; the tied ones (scoring thr, or tying another of the B best) are
            # listed in ss / sp, and each sits after the tied nodes of its score that precede it by
            # rank path (a node at thr only while that offset is below B minus the nodes above thr)
            cuda.syncthreads()                           # every thread has read one
            if t == 0:
                one[0] = 0                               # tied nodes
                one[1] = 0                               # nodes above thr
            cuda.syncthreads()
            above = 0
            for d in range(levels):
                for i in range(t, counts[d], T):
                    s = lv_score[d, i]
                    if s >= thr:
                        j0 = ranked_before(top, n, s, True)
                        if s == thr or (j0 + 1 < n and top[j0 + 1] == s):
                            slot = claim(one, 0)
                            if slot < TS:
                                ss[slot] = s
                                sp[slot] = d * width + i
                        else:
                            place(d, i, j0, s, ids, lv_rank, lv_node, tokens, depths, ranks, scores)
                        if s > thr:
                            above += 1
            add_over_block(one, 1, above, t)
            cuda.syncthreads()                           # the list and the counts are in
            n_tied = one[0]
            if n_tied <= TS:
                m = B - one[1]
                for e in range(t, n_tied, T):
                    s = ss[e]
                    de = sp[e] // width
                    ie = sp[e] - de * width
                    offset = 0
                    for f in range(n_tied):
                        if ss[f] == s and f != e:
                            df = sp[f] // width
                            if path_less(lv_parent, df, sp[f] - df * width, de, ie):
                                offset += 1
                    sk[e] = 0
                    if s > thr or offset < m:
                        place(de, ie, ranked_before(top, n, s, True) + offset, s, ids, lv_rank, lv_node,
                              tokens, depths, ranks, scores)
                        sk[e] = 1                        # in the tree
                cuda.syncthreads()                       # every node number is in
                for d in range(levels):
                    for i in range(t, counts[d], T):
                        if lv_score[d, i] > thr:
                            parents[lv_node[d, i]] = 0 if d == 0 else lv_node[d - 1, lv_parent[d, i]]
                for e in range(t, n_tied, T):
                    if sk[e] == 1 and ss[e] == thr:
                        d = sp[e] // width
                        i = sp[e] - d * width
                        parents[lv_node[d, i]] = 0 if d == 0 else lv_node[d - 1, lv_parent[d, i]]
                if t == 0:
                    parents[0] = -1
                    n_nodes[0] = n
                return
        # many ties: the key (-score, preorder), so subtree sizes and preorder first
        for i in range(t, counts[levels - 1], T):        # the deepest level has no children
            lv_start[levels - 1, i] = 0
            lv_keep[levels - 1, i] = 0
        cuda.syncthreads()
        # subtree sizes bottom-up, kept as exclusive prefix sums (children are contiguous below)
        for d in range(levels - 1, -1, -1):
            n = counts[d]
            for i in range(t, n, T):
                size = 1
                if d + 1 < levels:
                    st = lv_start[d, i]
                    size = 1 + lv_csum[d + 1, st + lv_keep[d, i]] - lv_csum[d + 1, st]
                lv_csum[d, i] = size
            cuda.syncthreads()
            total = scan(lv_csum[d], lv_csum[d], n, tmp, t)
            if t == 0:
                lv_csum[d, n] = total
            cuda.syncthreads()
        # preorder top-down: the parent's + 1 + the sizes of earlier siblings
        for d in range(levels):
            for i in range(t, counts[d], T):
                if d == 0:
                    lv_pre[d, i] = 1 + lv_csum[0, i]
                else:
                    p = lv_parent[d, i]
                    lv_pre[d, i] = lv_pre[d - 1, p] + 1 + lv_csum[d, i] - lv_csum[d, lv_start[d - 1, p]]
            cuda.syncthreads()
        # the union's best B by (-score, preorder): its B-th score, ties by a preorder bitmap
        for i in range(t, U + 2, T):
            flags[i] = 0
        if t == 0:
            one[0] = 0
            one[1] = 0
        cuda.syncthreads()
        above = 0
        for d in range(levels):
            for i in range(t, counts[d], T):
                s = lv_score[d, i]
                if s > thr:
                    above += 1
                elif s == thr:
                    flags[lv_pre[d, i]] = 1
        add_over_block(one, 0, above, t)
        cuda.syncthreads()
        scan(flags, flags, U + 2, tmp, t)
        m = B - one[0]
        for d in range(levels):
            for i in range(t, counts[d], T):
                s = lv_score[d, i]
                if s > thr or (s == thr and flags[lv_pre[d, i]] < m):
                    slot = claim(one, 1)
                    ss[slot] = s
                    sk[slot] = lv_pre[d, i]
                    sp[slot] = d * width + i
        cuda.syncthreads()
        n = one[1]
        NP = 1
        while NP < n:
            NP *= 2
        for i in range(n + t, NP, T):
            ss[i] = _NEG_INF
            sk[i] = _INT_MAX
            sp[i] = 0
        cuda.syncthreads()
        sort_entries(ss, sk, sp, NP, t)                  # pop order
        for j in range(t, n, T):
            d = sp[j] // width
            lv_node[d, sp[j] - d * width] = j + 1
        cuda.syncthreads()
        for j in range(t, n, T):
            d = sp[j] // width
            i = sp[j] - d * width
            r = lv_rank[d, i]
            tokens[j] = ids[d, r]
            depths[j] = d + 1
            ranks[j] = r
            scores[j] = ss[j]
            parents[j + 1] = 0 if d == 0 else lv_node[d - 1, lv_parent[d, i]]
        if t == 0:
            parents[0] = -1
            n_nodes[0] = n

    return kernel


def build_tree_levels(lp, ids, budget, *, out=None, scratch=None, budget_device=None, stream=0,
                      threads=None, seed=None, tie_slots=None):
    """``build_tree``'s tree by the level-synchronous kernel (no pop chain); twin:
    ``reference.build_tree_levels``, bit for bit (and so ``reference.build_tree``).

    lp [L, K] float32 (rows descending), ids [L, K] int32, numpy or device. ``scratch``: a
    ``LevelScratch`` for (L, budget) to reuse (allocated when None). Returns a host ``Tree``, or,
    when ``out`` (``TreeBuffers``) is given, fills it on ``stream`` and returns it without
    synchronising. ``budget_device``: as ``build_tree``'s. ``seed``: raise the bound by the
    seed family before the first selection (when None: ``LEVEL_SEED`` from ``SEED_FROM`` nodes,
    in blocks of up to ``SEED_THREADS``); the same tree either way. ``threads``: the block (when
    None ``_level_threads(budget)``, at most ``SEED_THREADS`` when seeding). ``tie_slots``: the
    most tied nodes placed by path compares (the twin's ``_order_few_ties``; None:
    ``few_ties_limit`` of the launch's budget, the device's when ``budget_device`` is given); more
    take subtree sizes, preorder and a sort (0: always); the kernel counts them first. The same
    tree either way.
    """
    budget = _check_limits(check_build_inputs(lp, ids, budget), lp.shape[0])
    L, K = lp.shape
    if seed is None:
        seed = LEVEL_SEED and budget >= SEED_FROM and (threads is None or threads <= SEED_THREADS)
    if threads is None:
        threads = min(_level_threads(budget), SEED_THREADS) if seed else _level_threads(budget)
    threads = check_threads(threads, hi=LEVEL_THREADS)
    bufs = out if out is not None else TreeBuffers.allocate(budget, stream)
    if bufs.capacity < budget:
        raise ValueError(f"out holds {bufs.capacity} nodes; budget is {budget}")
    if scratch is None:
        scratch = LevelScratch.allocate(L, budget, stream)
    elif not scratch.fits(L, max(budget, 1)):
        raise ValueError(f"scratch is for {scratch.score.shape[0]} depths x budget {scratch.score.shape[1]}; "
                         f"this build needs {L} x {budget}")
    sc = scratch
    tie_slots = -1 if tie_slots is None else check_int("tie_slots", tie_slots, 0, MAX_BUDGET)
    _build_tree_levels_kernel(threads, bool(seed))[1, threads, stream](
        to_device(lp, stream), to_device(ids, stream), budget, _device_budget(budget_device), tie_slots,
        bufs.tokens, bufs.depths, bufs.parents, bufs.ranks, bufs.scores, bufs.n_nodes,
        sc.score, sc.parent, sc.rank, sc.start, sc.keep, sc.csum, sc.pre, sc.node, sc.cand, sc.flags, sc.seed)
    return bufs if out is not None else bufs.to_tree(stream)
