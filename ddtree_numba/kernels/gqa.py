"""Grouped-query attention on the GPU, as the DFlash drafter uses it; twin:
``reference.gqa.gqa_attention``.

Shapes: T queries (Tq the buffer's rows, t of them live), Hq query heads, Hkv key/value heads,
G = Hq / Hkv heads per group, Dh head dim, S_cap context rows of the drafter cache (s live),
B block rows (the block's own keys: one per query).

The drafter's block queries attend, without a mask, to the context keys (rows [0, s) of the
cache) and then to the block's own keys: key j of the sequence is context row j for j < s and
block row j - s after it. Query row (i, h) reads key/value head g = h // G.

**Reduction order.** The keys are cut at fixed positions: splits of ``SPLIT`` keys, each cut
into tiles of ``KT`` keys (``_tiles``; constants, never chosen from the row count). One block
owns one split, one group and RM of its (query, head) rows; per tile it

1. stages the tile's keys and values in shared memory together, one trip to memory (once for
   the RM rows: every head of the group and every query of the block reads them; the values go
   over the keys' buffer after the scores where their own buffer would not fit, ``_early_v``),
   computes the scores as fma chains over d ascending, times ``scale``;
2. takes the tile's row max m_t, the running max m' = max(m, m_t), and p = exp(score - m');
3. rescales its running sum and output by exp(m - m') and adds the tile's keys in ascending
   order: l = l + p, o = fma(p, v, o).

The splits of a row are then merged in ascending order (``_combine``): M = max m_c, l = chain of
l_c * exp(m_c - M), o = chain of o_c * exp(m_c - M), out = o / l; by the last block of a (group,
row block) to finish its split (an arrival counter each, ``GQAScratch.arrive``), so the attention
is one launch; or (``fuse=False``) by a second launch, ``_gqa_combine_kernel``: the same bits.
Without a mask, ``_gqa_warp_kernel`` computes the same splits with the same arithmetic from one
block a (group, few rows): its warps take the splits, the block merges them (H100: 1.2-1.4x faster
a launch at one sequence, 1.2-1.8x at 4-16, ``_warp_tiles``). It is the default for a batch of
sequences; one sequence's launches keep the split kernel, faster in whole rounds
(``WARP_FROM_SEQUENCES``).
A row's arithmetic is a function of its query and the key sequence only: its bits do not
depend on how many rows share the launch or where the row sits (docs/DESIGN.md §4). The
twin normalizes p before p @ v and sums in numpy's order: equal within float32 rounding.

Sizes are read from a device ``meta`` = (s, t) so a captured CUDA graph replays the launch for
any context length; the grid is sized from the arrays' shapes (the maxima).
"""

from __future__ import annotations

import functools
import math
from collections import namedtuple

import numpy as np
from numba import config, cuda, float32

from .._checks import check_array, is_real_number
from .._device import (cached, ceil_div, device_function, float32_out, fma, grid_dependency_after, launcher_result,
                       nonneg, to_device)
from ._warp import FULL, WARP_OPS

_SIM = bool(config.ENABLE_CUDASIM)
THREADS = 8 if _SIM else 128          # combine kernel: threads per block
_SMEM_MAX = 48 * 1024                 # static shared memory per block

# RM (query rows, head-major within a query) x KT keys per tile; TM x TN scores per thread;
# NT threads; TX2 lanes along Dh in p @ v (each thread TM2 = RM / (NT / TX2) rows x
# ceil(Dh / TX2) dims of the output); SPLIT keys per block (a multiple of KT).
_Tiles = namedtuple("_Tiles", "RM KT TM TN NT TX2 SPLIT")


def _gpu_tiles(dh: int, batched: bool = False) -> _Tiles:
    """H200 tiles: splits of 32 keys in tiles of 32 (a block's tiles run one after another, each
    a chain of barriers, so short splits are what spread a drafter's few hundred context keys over
    the SMs: at 128-key splits the demo drafter's attention took ~65 µs a layer on 24 blocks).
    Up to Dh 64, 256 threads on 16 rows, a thread 1 x 2 scores (tools/tune_tiles.py on the H200:
    the demo drafter's attention 21.1 -> 15.3 µs a layer); to Dh 128, 128 threads on 32 rows x 32
    keys; past it 16 x 16, to stay under 48 KiB (Q [Dh, RM] and K / V [Dh, KT] staged). Several
    sequences in one launch (``batched``, S > 1: their blocks fill the SMs already) take 32 rows a
    block up to Dh 64, so that a block's staged keys serve twice the rows (H100, tools/tune_tiles.py
    --sequences 8, the demo drafter's attention over 8 slots: 68.2 -> 51.8 µs; at one sequence the
    32-row tile is 25.7 against 17.6 µs, and the batched round of one slot took 19 µs more with
    it, tools/batch_gap.py, so a batched launch of one sequence keeps the 16-row tile)."""
    if dh <= 64 and batched:
        return _Tiles(32, 32, 2, 2, 256, 32, 32)
    if dh <= 64:
        return _Tiles(16, 32, 1, 2, 256, 32, 32)
    if dh <= 128:
        return _Tiles(32, 32, 2, 4, 128, 32, 32)
    return _Tiles(16, 16, 1, 2, 128, 32, 32)


# The simulator runs every thread as a Python thread: 8 threads, 4 rows x 4 keys, splits of
# 8 keys, so tiny shapes still cross row blocks, tiles, splits and partial tiles.
_SIM_TILES = _Tiles(4, 4, 1, 2, 8, 4, 8)


def _tiles(dh: int, batched: bool = False) -> _Tiles:
    return _SIM_TILES if _SIM else _gpu_tiles(dh, batched)


def _smem_floats(dh, cfg, early_v=False) -> int:
    """Floats of shared memory a block of ``_gqa_split_kernel`` declares (``early_v``: the values
    in a buffer of their own, staged with the keys)."""
    tpr = cfg.NT // cfg.RM
    return dh * (cfg.RM + 1) + max(dh * (cfg.KT + 1), cfg.KT * dh) + cfg.RM * (cfg.KT + 1) \
        + cfg.RM * tpr + 3 * cfg.RM + (cfg.KT * dh if early_v else 0)


def _early_v(dh, cfg) -> bool:
    """Stage a tile's values with its keys (one trip to memory instead of two) where their own
    buffer still fits the block's static shared memory."""
    return 4 * _smem_floats(dh, cfg, True) <= _SMEM_MAX


# A row's first COMBINE_SPLITS partials are loaded at once, before the merge's arithmetic: its
# loads wait on nothing, so they are one trip to memory. In a loop over a run-time count each
# load waited behind the previous step's exp and fma chain, a dependent trip to L2 per split
# (11 at the demo drafter's ~330 keys). Splits past these are read in the loop as before.
COMBINE_SPLITS = 4 if _SIM else 16


@device_function
def _combine(o_part, ml_part, out, a0, row, d, Hq, n_split):
    """out of query row ``row`` (= i * Hq + h) of the run of rows from a0 (out row a0 + i, partial
    row a0 * Hq + row), dim d: its n_split splits' partials merged in ascending order (module
    docstring); NaN when the row saw no key, as the twin."""
    DH = o_part.shape[2]
    i = row // Hq
    pr = a0 * Hq + row
    m_first = cuda.local.array(COMBINE_SPLITS, float32)   # the first splits' (m, l, o), loaded at once
    l_first = cuda.local.array(COMBINE_SPLITS, float32)
    o_first = cuda.local.array(COMBINE_SPLITS, float32)
    for c in range(COMBINE_SPLITS):
        if c < n_split:
            m_first[c] = ml_part[c, pr, 0]
            l_first[c] = ml_part[c, pr, 1]
            o_first[c] = o_part[c, pr, d]
    big = float32(-math.inf)
    for c in range(COMBINE_SPLITS):
        if c < n_split:
            big = max(big, m_first[c])
    for c in range(COMBINE_SPLITS, n_split):
        big = max(big, ml_part[c, pr, 0])
    if big == float32(-math.inf):                          # the row sees no key: NaN, as the twin
        out[a0 + i, (row - i * Hq) * DH + d] = float32(math.nan)
        return
    lsum = float32(0.0)
    acc = float32(0.0)
    for c in range(COMBINE_SPLITS):                        # splits ascending: the first ones,
        if c < n_split:
            w = float32(math.exp(m_first[c] - big))        # 1 for a single split: exact
            lsum = fma(l_first[c], w, lsum)
            acc = fma(o_first[c], w, acc)
    for c in range(COMBINE_SPLITS, n_split):               # then the rest
        w = float32(math.exp(ml_part[c, pr, 0] - big))
        lsum = fma(ml_part[c, pr, 1], w, lsum)
        acc = fma(o_part[c, pr, d], w, acc)
    out[a0 + i, (row - i * Hq) * DH + d] = acc / lsum


@functools.lru_cache(maxsize=None)
def _gqa_split_kernel(DH, RM, KT, TM, TN, NT, TX2, SPLIT, has_blk, has_mask, fuse, G):
    """Partial attention of one split (blockIdx.x), one key/value group g (blockIdx.y) and
    query rows rr in [RM * blockIdx.z, ...) of the group's t * G rows (rr = i * G + (h - g*G)).
    G (query heads a key/value head) is a constant, as DH: a row's query and head are then a
    multiply and a shift, not a 64-bit division (numba's integers are int64).

    Writes, for row = i * Hq + h: o_part[split, row, :] (unnormalized output),
    ml_part[split, row] = (running max, running sum). Keys: context rows [0, s) of
    k_ctx / v_ctx [S_cap, Hkv*Dh], then (``has_blk``) the t block rows of k_blk / v_blk
    [Tq, Hkv*Dh]. ``has_mask``: key j is seen by query i only where mask[i, j]. ``fuse``: the
    last of a (group, row block)'s split blocks to finish merges their partials into out
    (``arrive`` [>= Hkv * row blocks] int32, zero between launches: it counts the arrivals and the
    last one resets it); else ``_gqa_combine_kernel`` does, in a launch of its own.
    """
    TX, TY = KT // TN, RM // TM
    TY2 = NT // TX2
    TM2, TN2 = RM // TY2, ceil_div(DH, TX2)
    TPR = NT // RM                       # threads sharing a row in the softmax step
    assert TX * TY == NT and TX * TN == KT and TY * TM == RM
    assert NT % TX2 == 0 and TY2 * TM2 == RM and NT % RM == 0 and SPLIT % KT == 0
    QS, KS, PS = RM + 1, KT + 1, KT + 1  # padded shared strides: transposed stores spread over banks
    KV = max(DH * KS, KT * DH)           # the keys [d, key], then the values [key, d], of a tile
    # array sizes as constants (the compiler takes no expression for a shape)
    N_SQ, N_SP, N_PART, N_SM = DH * QS, RM * PS, RM * TPR, 2 * RM
    N_ACC, N_O = TM * TN, TM2 * TN2
    NEG = -math.inf
    EARLY_V = _early_v(DH, _Tiles(RM, KT, TM, TN, NT, TX2, SPLIT))
    N_SV = KT * DH if EARLY_V else 1
    N_QIT = ceil_div(RM * DH, NT)        # staging loads a thread: the queries,
    KB = min(ceil_div(KT * DH, NT), 4)   # the keys' (and values') in batches of KB loads in flight
    N_KB = ceil_div(ceil_div(KT * DH, NT), KB)

    @device_function
    def combine_block(o_all, ml_all, out_all, a0, r0, rows, g, Hq, n_split, tid):
        """``_combine`` of every output of the block's rows (``fuse``)."""
        for e in range(tid, RM * DH, NT):
            r = r0 + e // DH
            if r < rows:
                i = r // G
                _combine(o_all, ml_all, out_all, a0, i * Hq + g * G + r - i * G, e % DH, Hq, n_split)

    # Up to Dh 32, two blocks an SM (registers capped at 65536 / (2 NT), which it fits without a
    # spill): past ~130 blocks (the demo drafter's ~450 keys) one block an SM ran in two waves
    # (tools/gqa_keys.py, 520 keys: 27.8 against 22.7 µs at 127 registers). Larger heads spill
    # under that cap, so they keep the compiler's choice.
    @cached
    @(cuda.jit if config.ENABLE_CUDASIM else cuda.jit(launch_bounds=(NT, 2) if DH <= 32 else (NT,)))
    def kernel(q_all, k_ctx_all, v_ctx_all, k_blk_all, v_blk_all, mask, meta, per_seq, n_rb, scale, o_all, ml_all,
               out_all, arrive):
        # Sequence z = blockIdx.z // n_rb (its row block the rest): its queries, block keys and
        # outputs are the z-th run of per_seq rows of q / k_blk / v_blk / out (from row a0), its
        # context keys k_ctx_all[z], its partials the z-th run of per_seq * Hq rows, (s, t) =
        # meta[z]. One sequence (the drafter's own draft) is a batch of one. The runs are offsets,
        # not slices: a slice of each of seven arrays was ~400 instructions before the first load.
        grid_dependency_after((q_all, k_ctx_all, v_ctx_all, k_blk_all, v_blk_all, mask, meta, per_seq, n_rb, scale,
                               o_all, ml_all, out_all, arrive))
        # (indices through nonneg: known >= 0, so no sign fix-ups in the loads' addresses)
        bz = nonneg(cuda.blockIdx.z)
        zq = nonneg(bz // n_rb)
        a0 = nonneg(zq * per_seq)
        k_ctx = k_ctx_all[zq]
        v_ctx = v_ctx_all[zq]
        s = meta[zq, 0]
        t = meta[zq, 1]
        n_keys = s + t if has_blk else s
        Hq = q_all.shape[1] // DH
        rows = t * G
        g = nonneg(cuda.blockIdx.y)
        r0 = (bz - zq * n_rb) * RM
        key_lo = nonneg(cuda.blockIdx.x) * SPLIT
        tid = nonneg(cuda.threadIdx.x)
        n_split = (n_keys + SPLIT - 1) // SPLIT
        if fuse and (n_keys == 0 or n_split > cuda.gridDim.x):
            # no key at all: NaN rows, as the twin. More keys than the grid was sized for (meta
            # past the buffers: device sizes are not checked): NaN rows too, and no arrival, which
            # would leave a counter that never reaches its last split (every later launch wrong)
            if key_lo == 0 and r0 < rows:
                combine_block(o_all, ml_all, out_all, a0, r0, rows, g, Hq, 0, tid)
            return
        if key_lo >= n_keys or r0 >= rows:
            return  # the whole block leaves together: no thread is left at a barrier
        key_hi = min(key_lo + SPLIT, n_keys)
        tx, ty = tid % TX, tid // TX         # scores: keys tx + TX*j, rows ty + TY*m
        tx2, ty2 = tid % TX2, tid // TX2     # p @ v: dims tx2 + TX2*j, rows ty2 + TY2*m
        prow, ppart = tid // TPR, tid % TPR  # softmax: row prow, keys ppart + TPR*u
        sq = cuda.shared.array(N_SQ, float32)      # [d, row] queries of the block's rows
        skv = cuda.shared.array(KV, float32)          # [d, key] keys (then [key, d] values: not EARLY_V)
        sv = cuda.shared.array(N_SV, float32)         # [key, d] values (EARLY_V; else over skv)
        vbuf = sv if EARLY_V else skv
        sp = cuda.shared.array(N_SP, float32)      # [row, key] scores, then p
        spart = cuda.shared.array(N_PART, float32)  # [row, part] partial maxima of a tile
        salpha = cuda.shared.array(RM, float32)       # [row] rescale of the running sums
        sm = cuda.shared.array(N_SM, float32)       # [2, row] running max, double-buffered
        acc = cuda.local.array(N_ACC, float32)
        a = cuda.local.array(TM, float32)
        b = cuda.local.array(TN, float32)
        o = cuda.local.array(N_O, float32)
        lsum = cuda.local.array(TM2, float32)
        vb = cuda.local.array(TN2, float32)
        # Staging loads first, stores after: a store to shared memory between two loads through
        # generic pointers (which may alias it) kept each load waiting for the one before, ~10
        # trips to memory a block; loaded into registers at constant indices, they go out together
        qv = cuda.local.array(N_QIT, float32)
        kv = cuda.local.array(KB, float32)
        vv = cuda.local.array(KB, float32)
        for it in range(N_QIT):              # d fastest: coalesced reads of a query row
            e = tid + it * NT
            rr = e // DH
            r = r0 + rr
            val = float32(0.0)
            if e < RM * DH and r < rows:
                i = r // G
                val = q_all[a0 + i, (g * G + r - i * G) * DH + e - rr * DH]
            qv[it] = val
        for rr in range(tid, RM, NT):
            sm[rr] = float32(NEG)
        for m in range(TM2):
            lsum[m] = float32(0.0)
            for j in range(TN2):
                o[m * TN2 + j] = float32(0.0)
        cur = 0
        for key0 in range(key_lo, key_hi, KT):
            nk = min(KT, key_hi - key0)
            for bt in range(N_KB):
                for it in range(KB):             # d fastest: coalesced reads of a key row
                    e = tid + (bt * KB + it) * NT
                    kk = e // DH
                    d = e - kk * DH
                    j = key0 + kk
                    val = float32(0.0)
                    vval = float32(0.0)
                    if e < KT * DH and kk < nk:
                        if j < s:
                            val = k_ctx[j, g * DH + d]
                            if EARLY_V:
                                vval = v_ctx[j, g * DH + d]
                        else:
                            val = k_blk_all[a0 + nonneg(j - s), g * DH + d]
                            if EARLY_V:
                                vval = v_blk_all[a0 + nonneg(j - s), g * DH + d]
                    kv[it] = val
                    vv[it] = vval
                if key0 == key_lo and bt == 0:
                    for it in range(N_QIT):
                        e = tid + it * NT
                        if e < RM * DH:
                            rr = e // DH
                            sq[(e - rr * DH) * QS + rr] = qv[it]
                for it in range(KB):
                    e = tid + (bt * KB + it) * NT
                    if e < KT * DH:
                        kk = e // DH
                        d = e - kk * DH
                        skv[d * KS + kk] = kv[it]
                        if EARLY_V:
                            sv[kk * DH + d] = vv[it]
            cuda.syncthreads()  # the keys (values) and, the first time, the queries are staged
            for u in range(TM * TN):
                acc[u] = float32(0.0)
            for d in range(DH):                  # one fma chain per score, d ascending
                for m in range(TM):
                    a[m] = sq[d * QS + ty + TY * m]
                for j in range(TN):
                    b[j] = skv[d * KS + tx + TX * j]
                for m in range(TM):
                    for j in range(TN):
                        acc[m * TN + j] = fma(a[m], b[j], acc[m * TN + j])
            for m in range(TM):
                rr = ty + TY * m
                for j in range(TN):
                    kk = tx + TX * j
                    sc = acc[m * TN + j] * scale
                    if kk >= nk:
                        sc = float32(NEG)
                    elif has_mask:
                        r = r0 + rr
                        if r < rows and not mask[r // G, key0 + kk]:
                            sc = float32(NEG)
                    sp[rr * PS + kk] = sc
            cuda.syncthreads()  # the scores are in; the keys are no longer read
            if not EARLY_V:
                for e in range(tid, KT * DH, NT):    # the values over the keys' buffer
                    kk = e // DH
                    d = e - kk * DH
                    j = key0 + kk
                    val = float32(0.0)
                    if kk < nk:
                        if j < s:
                            val = v_ctx[j, g * DH + d]
                        else:
                            val = v_blk_all[a0 + nonneg(j - s), g * DH + d]
                    skv[kk * DH + d] = val
            pm = float32(NEG)
            for kk in range(ppart, KT, TPR):
                pm = max(pm, sp[prow * PS + kk])
            spart[prow * TPR + ppart] = pm
            cuda.syncthreads()  # the partial maxima and the values are in
            mt = float32(NEG)
            for u in range(TPR):                 # max is exact: any order gives the same bits
                mt = max(mt, spart[prow * TPR + u])
            m_old = sm[cur * RM + prow]
            m_new = max(m_old, mt)
            if m_new == float32(NEG):            # nothing seen yet by this row (masks only)
                alpha = float32(1.0)
                for kk in range(ppart, KT, TPR):
                    sp[prow * PS + kk] = float32(0.0)
            else:
                alpha = float32(math.exp(m_old - m_new))   # 0 on the row's first keys
                for kk in range(ppart, KT, TPR):
                    sp[prow * PS + kk] = float32(math.exp(sp[prow * PS + kk] - m_new))
            if ppart == 0:
                salpha[prow] = alpha
                sm[(1 - cur) * RM + prow] = m_new
            cuda.syncthreads()  # p, the rescales and the new maxima are in
            for m in range(TM2):
                al = salpha[ty2 + TY2 * m]
                # (a written fma with +0: rounded here, as the product, never fused by ptxas into
                # the first key's add below, so every kernel and copy of this loop gets these bits)
                lsum[m] = fma(lsum[m], al, float32(0.0))
                for j in range(TN2):
                    o[m * TN2 + j] = o[m * TN2 + j] * al
            for kk in range(nk):                 # ascending keys; padded keys never enter
                for j in range(TN2):
                    d = tx2 + TX2 * j
                    vb[j] = vbuf[kk * DH + d] if d < DH else float32(0.0)
                for m in range(TM2):
                    pv = sp[(ty2 + TY2 * m) * PS + kk]
                    lsum[m] = lsum[m] + pv
                    for j in range(TN2):
                        o[m * TN2 + j] = fma(pv, vb[j], o[m * TN2 + j])
            cuda.syncthreads()  # every thread is done with p and the values of this tile
            cur = 1 - cur
        split = cuda.blockIdx.x
        for m in range(TM2):
            rr = ty2 + TY2 * m
            r = r0 + rr
            if r < rows:
                i = r // G
                row = i * Hq + g * G + r - i * G
                for j in range(TN2):
                    d = tx2 + TX2 * j
                    if d < DH:
                        o_all[split, a0 * Hq + row, d] = o[m * TN2 + j]
                if tx2 == 0:
                    ml_all[split, a0 * Hq + row, 0] = sm[cur * RM + rr]
                    ml_all[split, a0 * Hq + row, 1] = lsum[m]
        if fuse:
            # the (group, row block)'s last split to finish merges them, as topk's fused merge:
            # the barrier orders the block's writes before thread 0's fence and arrival; the last
            # arrival's fence orders its block's reads after every other block's writes
            slot = g * cuda.gridDim.z + cuda.blockIdx.z
            cuda.syncthreads()                  # the block's partials are written
            if tid == 0:
                cuda.threadfence()
                arrived = cuda.atomic.add(arrive, slot, 1)
                if arrived == n_split - 1:
                    cuda.threadfence()
                    arrive[slot] = 0            # for the next launch (a replayed graph)
                salpha[0] = float32(1.0) if arrived == n_split - 1 else float32(0.0)   # (free now)
            cuda.syncthreads()                  # the arrival's verdict is in
            if salpha[0] == float32(1.0):
                combine_block(o_all, ml_all, out_all, a0, r0, rows, g, Hq, n_split, tid)

    return kernel


# -- one block a (group, row block), every split of its rows: no arrival, no second wave ---------

# RW query rows (head-major within a query, as RM) a block, NW warps; neither changes a bit. The
# simulator has no warps, so 8 of its threads stand in for one (the kernel's warp path only syncs
# and shares through shared memory there). (Two variants were measured slower and removed, the
# thirty-fifth session, code at 20573ae: a tile's keys staged through shared memory, SK, 30.3
# against 18.3 µs a launch at 330 keys; the merge's partials loaded at once, CU, no faster.)
_WarpTiles = namedtuple("_WarpTiles", "RW NW")
_LANES = 8 if _SIM else 32
WARP_MAX_DH = 64                     # larger heads keep the split kernel (a lane's key row in registers)
# Launches of fewer sequences take the split kernel by default. Alone the warp kernel is faster at
# one sequence too (12.9 against 16.2 µs a launch, a draft 119.3 against 126.7 µs: thirty-fifth
# session), but in whole demo rounds it was ~7.5 µs a round slower (tools/round_ab.py, H100,
# thirty-sixth session: 619.1 against 615.8 µs with it on side A, 622.1 against 610.3 with it on
# side B; the sides' own bias ~4 µs cancels in the two runs). Batches keep it: in batched rounds of
# 8 it is ~11 µs a round faster (round_ab --batch 8 both ways: 929.6 against 940.8, 927.4 against
# 938.3 µs).
WARP_FROM_SEQUENCES = 2
# One sequence's launches without ``fuse``: True merges the splits in their last block (one
# launch), False in a merge launch of its own (the same bits). The forty-eighth session's H100
# call timed one launch each way in a graph (tools/gqa_keys.py): the two launches 1.4-2.8 µs
# faster at 48 / 330 / 1,000 keys; whole drafts and rounds not yet (tools/draft_ab.py, and
# tools/round_ab.py --knob ddtree_numba.kernels.gqa.FUSE_MERGE=False both ways), so the default stays.
FUSE_MERGE = True


def _check_warp_tiles(wt, dh: int, kt: int) -> None:
    """A ``_WarpTiles`` the kernel can take: RW, NW >= 1, at most 1024 threads, KT <= a warp's
    lanes, its static shared memory within 48 KiB; else a ValueError that says which."""
    if not isinstance(wt, _WarpTiles) or min(wt.RW, wt.NW) < 1:
        raise ValueError(f"warp_tiles must be a _WarpTiles with RW, NW >= 1, got {wt!r}")
    if wt.NW * _LANES > 1024 or kt > _LANES:
        raise ValueError(f"warp_tiles {wt}: {wt.NW * _LANES} threads a block (at most 1024), KT {kt} (at most {_LANES})")
    smem = 4 * (wt.RW * dh + wt.NW * wt.RW * kt)
    if smem > _SMEM_MAX:
        raise ValueError(f"warp_tiles {wt}: {smem} bytes of shared memory at head dim {dh} (at most {_SMEM_MAX})")


def _warp_tiles(dh: int, rows: int) -> _WarpTiles:
    """The tiles of ``_gqa_warp_kernel`` for ``rows`` = (key/value groups) x (query rows of a group,
    t * G) x (sequences): NW 12 warps (11 splits at the demo's ~330 keys: one pass), and the fewest
    rows a block (1, 2, 4, 8) that keep the grid within one block an SM (at 384 threads and ~170
    registers an SM holds one). On an H100 (thirty-fifth session, ``tools/tune_tiles.py --only gqa
    --sequences S``, the demo drafter's 4 groups x 32 rows, 330 + 16 keys), the best of RW 1-8 x NW
    8 / 12 / 16 at every S, and µs a launch against the split kernel's best tile: S 1 (RW 1) 13.05
    against 13.87, S 4 (RW 4) 16.07 against 28.54, S 8 (RW 8) 28.28 against 41.23, S 16 (RW 8) 54.97
    against 63.33. Heads past 32 dims (not measured) keep 4 warps. The simulator: 2 x 2."""
    if _SIM:
        return _WarpTiles(2, 2)
    rw = 1
    while rw < 8 and ceil_div(rows, rw) > _sm_count():
        rw *= 2
    return _WarpTiles(rw, 12 if dh <= 32 else 4)


@functools.lru_cache(maxsize=None)
def _sm_count() -> int:
    """The current GPU's multiprocessors."""
    return cuda.get_current_device().MULTIPROCESSOR_COUNT


@functools.lru_cache(maxsize=None)
def _gqa_warp_kernel(DH, RW, NW, KT, SPLIT, has_blk, G):
    """The fused split kernel's bits (``_gqa_split_kernel`` with ``fuse``, no mask) from one block
    a key/value group g (blockIdx.x) and RW of its t * G query rows (blockIdx.y, with the
    sequence as there): warp w computes the partials of splits w, w + NW, ... with the split
    kernel's arithmetic (the same cuts, the same fma chains, the same online max and rescale per
    tile of KT keys), writes them to the scratch as it does, and after a barrier the block
    merges its rows' splits with ``_combine``. What goes: the arrival counter and its fences, the
    last block's merge after every other split block, and the block-wide barriers between the
    steps of a tile (a warp owns its split: it syncs only itself).

    A tile: lane = key for the scores (DH fma chains over d ascending, RW rows at once, the lane's
    key row from memory), the tile's max by shuffles (exact in any order), p to shared memory;
    lane = dim for p @ v (the tile's value rows in registers, loaded with the keys).
    """
    W = _LANES
    TPS = SPLIT // KT                    # tiles a split
    DL = ceil_div(DH, W)                 # output dims a lane
    NT = NW * W
    assert KT <= W and SPLIT % KT == 0
    NEG = -math.inf
    N_Q, N_P = RW * DH, NW * RW * KT
    N_V, N_O = KT * DL, RW * DL

    if _SIM:
        def warp_sync():
            cuda.syncthreads()           # (every warp takes the same trips through the loops)
    else:
        @cuda.jit(device=True, forceinline=True)
        def warp_sync():
            cuda.syncwarp()

    # Past 256 threads a block the registers must be capped to launch at all (the default 384: at
    # most 170); up to it the compiler's own choice (178 at RW 4, NW 8 before the indices went
    # through nonneg; launch bounds of 256 made it 234). With nonneg the demo's tile (RW 1, NW 12)
    # takes 139 (ptxas 13.0), where it took 168 with 64 bytes spilled
    @cached
    @(cuda.jit(launch_bounds=(NT,)) if not _SIM and NT > 256 else cuda.jit)
    def kernel(q_all, k_ctx_all, v_ctx_all, k_blk_all, v_blk_all, meta, per_seq, n_rb, max_split, scale, o_all,
               ml_all, out_all):
        grid_dependency_after((q_all, k_ctx_all, v_ctx_all, k_blk_all, v_blk_all, meta, per_seq, n_rb, max_split,
                               scale, o_all, ml_all, out_all))
        # (indices through nonneg: known >= 0, so no sign fix-ups in the loads' addresses)
        by = nonneg(cuda.blockIdx.y)
        zq = nonneg(by // n_rb)
        a0 = nonneg(zq * per_seq)
        k_ctx = k_ctx_all[zq]
        v_ctx = v_ctx_all[zq]
        s = meta[zq, 0]
        t = meta[zq, 1]
        n_keys = s + t if has_blk else s
        Hq = q_all.shape[1] // DH
        rows = t * G
        g = nonneg(cuda.blockIdx.x)
        r0 = (by - zq * n_rb) * RW
        tid = nonneg(cuda.threadIdx.x)
        if r0 >= rows:
            return                       # the whole block leaves together
        n_split = (n_keys + SPLIT - 1) // SPLIT
        if n_keys == 0 or n_split > max_split:
            n_split = 0                  # NaN rows, as the split kernel (no key; meta past the buffers)
        lane, warp = tid % W, tid // W
        sq = cuda.shared.array(N_Q, float32)    # [row, d] the block's queries
        sp = cuda.shared.array(N_P, float32)    # [warp, row, key] a tile's scores (simulator), then p
        kreg = cuda.local.array(DH, float32)    # the lane's key row
        vreg = cuda.local.array(N_V, float32)   # [key, dims of the lane] the tile's values
        acc = cuda.local.array(RW, float32)
        sc = cuda.local.array(RW, float32)
        mrow = cuda.local.array(RW, float32)    # running max
        alpha = cuda.local.array(RW, float32)
        lrow = cuda.local.array(RW, float32)    # running sum
        o = cuda.local.array(N_O, float32)      # [row, dims of the lane] running output
        for e in range(tid, N_Q, NT):
            rr = e // DH
            r = r0 + rr
            val = float32(0.0)
            if r < rows:
                i = r // G
                val = q_all[a0 + i, (g * G + r - i * G) * DH + e - rr * DH]
            sq[e] = val
        cuda.syncthreads()               # the queries are staged
        pw = warp * RW * KT
        for base in range(0, n_split, NW):
            split = base + warp
            for u in range(RW):
                mrow[u] = float32(NEG)
                lrow[u] = float32(0.0)
                for jd in range(DL):
                    o[u * DL + jd] = float32(0.0)
            for tile in range(TPS):
                key0 = nonneg(split * SPLIT + tile * KT)
                nk = min(KT, n_keys - key0) if split < n_split else 0   # <= 0: no key (the loop's end)
                j = key0 + lane
                for d in range(DH):
                    kreg[d] = float32(0.0)
                if lane < nk:
                    if j < s:
                        for d in range(DH):
                            kreg[d] = k_ctx[j, g * DH + d]
                    else:
                        jb = a0 + nonneg(j - s)
                        for d in range(DH):
                            kreg[d] = k_blk_all[jb, g * DH + d]
                # the values, lane = dim: a tile wholly in the context or in the block picks its
                # array once (one straddles them at most)
                for kk in range(N_V):
                    vreg[kk] = float32(0.0)
                if key0 + nk <= s:
                    for kk in range(KT):
                        for jd in range(DL):
                            d = lane + W * jd
                            if kk < nk and (DH % W == 0 or d < DH):
                                vreg[kk * DL + jd] = v_ctx[key0 + kk, g * DH + d]
                elif key0 >= s:
                    b0 = a0 + nonneg(key0 - s)
                    for kk in range(KT):
                        for jd in range(DL):
                            d = lane + W * jd
                            if kk < nk and (DH % W == 0 or d < DH):
                                vreg[kk * DL + jd] = v_blk_all[b0 + kk, g * DH + d]
                else:
                    for kk in range(KT):
                        jj = key0 + kk
                        for jd in range(DL):
                            d = lane + W * jd
                            if kk < nk and (DH % W == 0 or d < DH):
                                if jj < s:
                                    vreg[kk * DL + jd] = v_ctx[jj, g * DH + d]
                                else:
                                    vreg[kk * DL + jd] = v_blk_all[a0 + nonneg(jj - s), g * DH + d]
                for u in range(RW):
                    acc[u] = float32(0.0)
                for d in range(DH):              # one fma chain per score, d ascending
                    kd = kreg[d]
                    for u in range(RW):
                        acc[u] = fma(sq[u * DH + d], kd, acc[u])
                for u in range(RW):
                    x = acc[u] * scale
                    sc[u] = x if lane < nk else float32(NEG)
                if WARP_OPS:                     # the tile's max a row: exact in any order
                    for u in range(RW):
                        mt = sc[u]
                        for sh in (16, 8, 4, 2, 1):
                            mt = max(mt, cuda.shfl_xor_sync(FULL, mt, sh))
                        acc[u] = mt
                else:
                    if lane < KT:
                        for u in range(RW):
                            sp[pw + u * KT + lane] = sc[u]
                    warp_sync()
                    for u in range(RW):
                        mt = float32(NEG)
                        for kk in range(KT):
                            mt = max(mt, sp[pw + u * KT + kk])
                        acc[u] = mt
                    warp_sync()                  # every lane has read the scores
                if nk > 0:                       # (a tile past the keys changes nothing)
                    for u in range(RW):
                        m_old = mrow[u]
                        m_new = max(m_old, acc[u])
                        if m_new == float32(NEG):    # (scores of -inf only)
                            al = float32(1.0)
                            pu = float32(0.0)
                        else:
                            al = float32(math.exp(m_old - m_new))   # 0 on the row's first keys
                            pu = float32(math.exp(sc[u] - m_new))
                        mrow[u] = m_new
                        alpha[u] = al
                        if lane < KT:
                            sp[pw + u * KT + lane] = pu
                warp_sync()                      # p is in
                if nk > 0:
                    for u in range(RW):
                        lrow[u] = fma(lrow[u], alpha[u], float32(0.0))   # (as the split kernel's lsum)
                        for jd in range(DL):
                            o[u * DL + jd] = o[u * DL + jd] * alpha[u]
                    for kk in range(KT):         # ascending keys; padded keys never enter
                        if kk < nk:
                            for u in range(RW):
                                pv = sp[pw + u * KT + kk]
                                lrow[u] = lrow[u] + pv
                                for jd in range(DL):
                                    o[u * DL + jd] = fma(pv, vreg[kk * DL + jd], o[u * DL + jd])
                warp_sync()                      # every lane is done with p
            if split < n_split:
                for u in range(RW):
                    r = r0 + u
                    if r < rows:
                        i = r // G
                        row = a0 * Hq + i * Hq + g * G + r - i * G
                        for jd in range(DL):
                            d = lane + W * jd
                            if d < DH:
                                o_all[split, row, d] = o[u * DL + jd]
                        if lane == 0:
                            ml_all[split, row, 0] = mrow[u]
                            ml_all[split, row, 1] = lrow[u]
        cuda.syncthreads()               # the block's partials are written
        for e in range(tid, N_Q, NT):
            r = r0 + e // DH
            if r < rows:
                i = r // G
                _combine(o_all, ml_all, out_all, a0, i * Hq + g * G + r - i * G, e % DH, Hq, n_split)

    return kernel


@cached
@cuda.jit
def _gqa_combine_kernel(o_part, ml_part, meta, split, has_blk, out):
    """out[i, h*Dh + d] = ``_combine`` of query row i * Hq + h, dim d, for query i < t (the
    split kernel's ``fuse=False``); one thread per output element."""
    grid_dependency_after((o_part, ml_part, meta, split, has_blk, out))   # PDL (_device.py)
    idx = cuda.grid(1)
    DH = o_part.shape[2]
    if idx >= o_part.shape[1] * DH:
        return
    row = idx // DH
    Hq = out.shape[1] // DH
    t = meta[1]
    if row // Hq >= t:
        return
    n_keys = meta[0] + t if has_blk else meta[0]
    _combine(o_part, ml_part, out, 0, row, idx - row * DH, Hq, (n_keys + split - 1) // split)


class GQAScratch:
    """Device scratch of the split partials, preallocated once and shared by every layer.

    o [splits, Tq*Hq, Dh] float32 (unnormalized outputs), ml [splits, Tq*Hq, 2] float32
    (running max, running sum), for queries up to ``max_rows`` and keys up to ``max_keys``
    (context capacity plus block rows); ``mask`` a [1, 1] bool placeholder for unmasked launches;
    ``arrive`` [Tq*Hq] int32 zeros: the fused merge's arrival counters (a (group, row block) holds
    a row at least), zero again after every launch.
    """

    def __init__(self, max_rows: int, heads: int, head_dim: int, max_keys: int, stream=0):
        splits = max(1, ceil_div(max_keys, _tiles(head_dim).SPLIT))
        rows = max(1, max_rows * heads)
        self.max_keys = max_keys
        self.o = cuda.device_array((splits, rows, head_dim), np.float32, stream=stream)
        self.ml = cuda.device_array((splits, rows, 2), np.float32, stream=stream)
        self.mask = cuda.to_device(np.ones((1, 1), np.bool_), stream=stream)
        self.arrive = cuda.to_device(np.zeros(rows, np.int32), stream=stream)


# -- the device tier (device arrays only, no checks, no allocation; docs/DESIGN.md §3) ----------

def enqueue_gqa_attention(q, k_ctx, v_ctx, out, *, meta, scale, scratch, k_blk=None, v_blk=None, mask=None,
                          tiles=None, fuse=None, method=None, warp_tiles=None, stream=0):
    """out[i, h*Dh:(h+1)*Dh] = softmax_j(scale * q[i, h] . key_j) @ value_j for i < t, over the
    keys j: context rows [0, s) of k_ctx / v_ctx, then block rows [0, t) of k_blk / v_blk
    (none when k_blk is None); group h // (Hq / Hkv). Rows i >= t of out are not written.
    Twin: ``reference.gqa.enqueue_gqa_attention`` (over ``reference.gqa.gqa_attention``).

    q [Tq, Hq*Dh] f32, k_ctx / v_ctx [S_cap, Hkv*Dh] f32, k_blk / v_blk [Tq, Hkv*Dh] f32 or
    None, meta [>= 2] int32 device = (s, t), scale float, out [Tq, Hq*Dh] f32, scratch a
    ``GQAScratch`` for >= Tq rows and >= S_cap + Tq keys (S_cap without block keys), mask
    [>= t, >= s (+ t)] bool device or None (all keys seen). The grid is sized for Tq, S_cap.

    **A batch of sequences** in one launch (the batched device round's drafts): k_ctx / v_ctx
    [S, S_cap, Hkv*Dh] (a drafter cache pool's layer), meta [S, 2] int32 device = (s, t) a
    sequence, and q / k_blk / v_blk / out in S equal runs of Tq / S rows, run z sequence z's; no
    mask, the fused merge. Each sequence's bits are those of its own launch.
    ``tiles`` overrides ``_tiles`` (tools/tune_tiles.py); its KT and SPLIT must be ``_tiles``'s,
    which fix the bits and the scratch's splits. ``fuse`` True: one launch, the splits merged
    by their last block; False: the merge in a launch of its own (the same bits); None (default):
    ``FUSE_MERGE`` for one sequence, True for a batch.
    ``method``: "warp" (``_gqa_warp_kernel``: a block's warps take every split of its rows, then
    the block merges them; no mask, the fused merge, Dh <= ``WARP_MAX_DH``), "split" (the split
    blocks), or None: "warp" wherever it applies to WARP_FROM_SEQUENCES sequences or more (faster
    alone at 1, 4, 8 and 16 sequences, ``_warp_tiles``, but slower in one sequence's rounds), else
    "split". The same bits either way. ``warp_tiles`` overrides ``_warp_tiles`` (RW rows,
    NW warps a block: the speed only).
    """
    if method not in (None, "warp", "split"):
        raise ValueError(f"method must be None, 'warp' or 'split', got {method!r}")
    batched = k_ctx.ndim == 3
    if fuse is None:
        fuse = True if batched else FUSE_MERGE
    if batched:
        if mask is not None or not fuse:
            raise ValueError("a batch of sequences (k_ctx [S, S_cap, W]) takes no mask and the fused merge only")
        n_seq = k_ctx.shape[0]
        if n_seq == 0 or q.shape[0] % n_seq:
            raise ValueError(f"q's {q.shape[0]} rows are not {n_seq} equal runs, one a sequence")
        seq_meta = meta
    else:
        n_seq = 1
        k_ctx, v_ctx = k_ctx.reshape(1, *k_ctx.shape), v_ctx.reshape(1, *v_ctx.shape)
        seq_meta = meta[:2].reshape(1, 2)
    tq = q.shape[0] // n_seq                # query rows a sequence
    dh = scratch.o.shape[2]
    hq, hkv = q.shape[1] // dh, k_ctx.shape[2] // dh
    g = hq // hkv
    has_blk = k_blk is not None
    cfg = _tiles(dh, n_seq > 1)            # one sequence keeps its tile in a batched launch too
    if tiles is not None:
        if (tiles.KT, tiles.SPLIT) != (cfg.KT, cfg.SPLIT):
            raise ValueError(f"tiles {tiles}: KT and SPLIT fix the bits and must stay {cfg.KT} and {cfg.SPLIT}")
        cfg = tiles
    warp_ok = mask is None and fuse and dh <= WARP_MAX_DH
    if method == "warp" and not warp_ok:
        raise ValueError(f"method 'warp' takes no mask, the fused merge and Dh <= {WARP_MAX_DH} (Dh {dh})")
    use_warp = method == "warp" or (method is None and warp_ok and n_seq >= WARP_FROM_SEQUENCES)
    if use_warp:
        wt = warp_tiles or _warp_tiles(dh, hkv * tq * g * n_seq)
        _check_warp_tiles(wt, dh, cfg.KT)
    max_keys = k_ctx.shape[1] + (tq if has_blk else 0)
    if tq == 0 or max_keys == 0:
        return
    if use_warp:
        n_rb = ceil_div(tq * g, wt.RW)
        kernel = _gqa_warp_kernel(dh, wt.RW, wt.NW, cfg.KT, cfg.SPLIT, has_blk, g)
        kernel[(hkv, n_rb * n_seq), wt.NW * _LANES, stream](
            q, k_ctx, v_ctx, k_blk if has_blk else q, v_blk if has_blk else q, seq_meta, tq, n_rb,
            ceil_div(max_keys, cfg.SPLIT), np.float32(scale), scratch.o, scratch.ml, out)
        return
    kernel = _gqa_split_kernel(dh, *cfg, has_blk, mask is not None, bool(fuse), g)
    n_rb = ceil_div(tq * g, cfg.RM)         # row blocks a sequence
    grid = (ceil_div(max_keys, cfg.SPLIT), hkv, n_rb * n_seq)
    kernel[grid, cfg.NT, stream](
        q, k_ctx, v_ctx, k_blk if has_blk else q, v_blk if has_blk else q,
        scratch.mask if mask is None else mask, seq_meta, tq, n_rb, np.float32(scale), scratch.o, scratch.ml, out,
        scratch.arrive)
    if not fuse:
        _gqa_combine_kernel[ceil_div(tq * hq * dh, THREADS), THREADS, stream](
            scratch.o, scratch.ml, meta, cfg.SPLIT, has_blk, out)


# -- the public launcher (twin: reference.gqa.gqa_attention) ---------------------------------

def gqa_attention(q, k, v, scale, mask=None, *, out=None, stream=0):
    """``softmax(q k^T * scale) v`` per head on the GPU; query head h reads key/value head
    ``h // (Hq / Hkv)``.

    q [T, Hq, Dh], k [S, Hkv, Dh], v [S, Hkv, Dh] float32, scale float, mask [T, S] bool or None
    (all visible) -> [T, Hq, Dh] float32. numpy in, numpy out; device arrays in, device out.
    A row that sees no key gives NaN, as the twin does.
    """
    check_array("q", q, 3, np.float32)
    check_array("k", k, 3, np.float32)
    t, hq, dh = q.shape
    s, hkv = k.shape[0], k.shape[1]
    check_array("k", k, 3, np.float32, shape=(None, None, dh))
    check_array("v", v, 3, np.float32, shape=tuple(k.shape))
    if hkv == 0 or hq % hkv:
        raise ValueError(f"{hq} query heads are not a multiple of {hkv} key/value heads")
    if s == 0:
        raise ValueError("k and v hold no keys (S = 0)")
    if dh == 0:
        raise ValueError("the head dim (last axis of q) is 0")
    if not is_real_number(scale) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite number, got {scale!r}")
    if mask is not None:
        check_array("mask", mask, 2, np.bool_, shape=(t, s))
    if 4 * _smem_floats(dh, _tiles(dh)) > _SMEM_MAX:
        raise ValueError(f"head dim {dh} is too large for the kernel's shared-memory tiles")
    y = float32_out(out, (t, hq, dh), stream)
    if t and hq:
        meta = to_device(np.array([s, t], np.int32), stream)
        d_k = to_device(k, stream).reshape(s, hkv * dh)
        d_v = to_device(v, stream).reshape(s, hkv * dh)
        enqueue_gqa_attention(
            to_device(q, stream).reshape(t, hq * dh), d_k, d_v, y.reshape(t, hq * dh), meta=meta,
            scale=float(scale), scratch=GQAScratch(t, hq, dh, s, stream=stream),
            mask=None if mask is None else to_device(mask, stream), stream=stream)
    return launcher_result(y, out, q, stream)
