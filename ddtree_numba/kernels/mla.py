"""Tree-verify MLA attention on the GPU, weight-absorbed, over the latent cache; twin:
``reference.mla.mla_attention_absorbed`` (docs/MODEL.md, "Absorbed form").

Shapes: Tq query rows (the launch's maximum; t <= Tq of them live), H heads, C kv_lora_rank,
R qk_rope_head_dim, D qk_nope_head_dim, Dv v_head_dim, S_cap cache rows, s0 rows cached
before this step, W = ceil(Tq / 32) mask words per query.

Query i < t sees key s iff s < s0, or s0 <= s < s0 + t and bit ``s - s0`` of its packed mask
row ``vis_bits[i]`` is set (``visibility_bits``; causal is the chain tree).

**Batch invariance, by visible index.** A tree node must get the bits of the same token decoded
alone, whose visible keys are the same values in the same order at other cache positions. So
the arithmetic of a query row is a function of its visible-key sequence only. That sequence is
cut into chunks of ``KEY_CHUNK`` keys by *visible index* (the j-th key the query sees), never by
cache position, so both cut it at the same places (twin: ``reference.mla.chunked_attention``):

    score[s] = scale * (fma chain over d = 0 .. C+R-1 of [q_lat | q_pe] . [c_kv[s] | k_pe[s]])
    chunk k: m_k = max of its scores (exact, order-free), p[s] = exp(score[s] - m_k),
             l_k = chain of adds of p[s], o_k[c] = fma chain of p[s] * c_kv[s, c], keys ascending
    M = max_k m_k, w_k = exp(m_k - M); out = (sum_k w_k o_k) / (sum_k w_k l_k), k ascending.

Masked keys are skipped by a select, never added as a zero (``0 * v + acc`` can turn a -0
accumulator into +0). Chunks give the PV work (and decode) several blocks a query row; within a
chunk the sums are single chains.

Four stages, scores and partials kept in a global scratch (``MLAScratch``):

1. ``_mla_scores_kernel``: a register-tiled GEMM of query rows (i, h) against key rows; a key
   tile (all C + R columns, streamed in steps of ``bk``) sits in shared memory once per block
   and serves every head and query of the block. In the bf16 precision
   ``_mla_scores_mma_kernel`` instead (tensor cores, ``MMA_SCORES``). Either skips a block whose
   keys are all new rows none of its query rows sees (``_block_sees_new_keys``: the tree's keys
   above the diagonal, and most beside it), whose scores the softmax never uses.
2. ``_mla_softmax_kernel``: one block per (chunk, query token), for all its heads: the chunk's
   cache positions from the token's visible count (popcounts of its mask words), then for each
   head the chunk's max, then p in place of the score (-1 marking a masked key inside the span).
3. ``_mla_pv_kernel``: per chunk, a register-tiled GEMM of p against c_kv over the chunk's span,
   each output a chain over the keys in ascending order; every thread also carries the sum l of
   its rows (redundant across the column threads, but it keeps l a chain with no extra pass).
   In the bf16 precision, for latents of ``MMA_PV_LATENT`` channels or more,
   ``_mla_pv_mma_kernel`` instead (tensor cores, ``MMA_PV``): from a few tokens a sequence, one
   launch over the chunks wholly in the cached prefix (two tokens a block) and one over the rest.
4. ``_mla_combine_kernel``: the chunks of each output, rescaled and added in ascending order.

Tile shapes are chosen from the arrays' shapes (``_tiles``); they never change the bits.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import config, cuda, float32, int32, uint32

from .._checks import check_array, check_precision
from .._device import (by_bound, cached, ceil_div, device_function, float32_out, fma, grid_dependency_after, is_device,
                       launcher_result, nonneg, rows_device, to_device)
from ..reference.mla import absorption_weights
from ..dtypes import STORAGE_DTYPES
from ._mma import mma_bf16, pack_bf16x2
from ._warp import WARP_OPS, group_max
from .linear import KC, enqueue_linear_heads

THREADS = 8 if config.ENABLE_CUDASIM else 128   # softmax kernel: threads per query token (all heads)
# Of them, the threads a head's keys are split over, by the launch's query tokens (all sequences):
# (tokens up to, lanes). Each lane holds its share of a chunk's scores in registers. Measured in
# one run (548334c, Moonlight, µs at 1 / 16 / 64 / 256 / 1024 nodes): 8 lanes (16 heads a pass)
# 5.3 / 6.1 / 14.8 / 55.5 / 405; 32 lanes 6.4 / 7.1 / 13.6 / 55.2 / 353, and 42.9 against 45.1 at
# 16 sequences of 17 nodes. Thirty-third session (H100, `mla_stages.py --tree ddtree`, µs at 1 / 16
# / 64 tokens): 16 lanes against the 8 / 8 / 32 before, demo (8 heads) 3.0 / 3.5 / 5.7 against
# 4.1 / 4.7 / 6.8, Moonlight 3.9 / 4.6 / 8.6 against 4.4 / 4.9 / 9.2: fewer keys a lane beat one
# pass over every head; the demo round 631 -> 625 µs at budget 16. Lanes never change a bit (the
# max is exact, each p its own exp).
_SOFTMAX_LANES = ((64, 16), (None, 32))
SOFTMAX_LANES = None    # an override of the table (tools/mla_stages.py --softmax)
COMBINE_THREADS = 8 if config.ENABLE_CUDASIM else 128
COMBINE_CHANNELS = 2 if config.ENABLE_CUDASIM else 4   # latent channels a combine thread takes (at most)
_MASKED = -1.0                                     # p of a key the query does not see
# Keys a chunk of a query's softmax takes, by visible index (module docstring). Fixed: changing it
# changes the bits. It also bounds the p @ c_kv kernel's serial chain per output (a block per
# chunk): at 512 one verify of the demo pair's ~350 keys ran on 8 latency-bound blocks, ~50 µs a
# layer; 128 spreads it over 4x the blocks. The simulator's is small so that its tiny caches
# still split into chunks.
KEY_CHUNK = 4 if config.ENABLE_CUDASIM else 128

# (bm, bn, bk, tm, tn): block tile rows x columns, reduction step, thread tile rows x columns.
# Rows are query rows (i, h); columns are keys (scores) or latent channels (p @ c_kv).
# The H200 picks by the latent width C, by whether the launch holds one sequence or several, and
# by each sequence's row bound Tq * H (``_tiles``). Measured with ``tools/mla_stages.py --tune``
# (docs/PERFORMANCE.md, 2026-12-02): decode spreads a handful of rows over many small blocks
# (one output a thread for one sequence; 2 x 2 when many sequences fill the GPU anyway); with the
# wide latent, trees and batches take 8 x 8 a thread for the scores and 4 x 8 for p @ c_kv (whose
# chunk holds only 128 keys, so fewer rows a block keep more blocks busy); the narrow latent stays
# latency-bound longer and takes smaller tiles.
_GPU_TILES = {   # latent -> (one sequence, several): [(row bound per sequence, (scores, pv))]
    "wide": (
        ((64, ((16, 16, 32, 1, 1), (16, 32, 16, 2, 2))),          # decode
         (512, ((32, 32, 16, 2, 2), (32, 64, 16, 4, 4))),         # trees up to 32 nodes
         (None, ((128, 128, 16, 8, 8), (64, 128, 16, 4, 8)))),
        ((64, ((16, 32, 16, 2, 2), (16, 64, 16, 2, 4))),
         (None, ((128, 128, 16, 8, 8), (64, 128, 16, 4, 8)))),
    ),
    "narrow": (     # the demo pair's 64 channels: latency-bound to a few hundred rows
        ((64, ((16, 16, 32, 1, 1), (16, 16, 16, 1, 1))),
         (256, ((16, 32, 16, 1, 2), (16, 16, 16, 1, 1))),
         (1024, ((32, 32, 16, 2, 2), (16, 32, 16, 2, 2))),
         (4096, ((128, 128, 16, 8, 8), (32, 32, 16, 2, 2))),
         (None, ((128, 128, 16, 8, 8), (64, 64, 16, 4, 4)))),
        ((64, ((16, 32, 16, 2, 2), (16, 32, 16, 2, 2))),
         # (as one sequence's: the demo's batch of 8 trees of 17, 136 rows a sequence: p @ c_kv
         # 20.6 µs at (32, 64, 16, 4, 4), the round 1,055 -> 1,039 µs; H100, tools/batch_gap.py)
         (256, ((16, 32, 16, 1, 2), (16, 16, 16, 1, 1))),
         (None, ((32, 32, 16, 2, 2), (32, 64, 16, 4, 4)))),
    ),
}
_NARROW_LATENT = 128          # C up to this: the narrow tiles
# Under the simulator every thread is a Python thread and every block costs tens of ms: few
# small blocks, ragged tiles (bk = 3 and 5 cross the C boundary and end off their multiples).
# Whole forwards (tests/test_model_cuda.py) launch many rows: there, fewer and larger blocks with
# a long reduction step, because each block barrier costs the simulator milliseconds.
_SIM_TILES = (
    (8, ((2, 8, 4, 1, 2), (2, 4, 4, 1, 1))),
    (16, ((4, 4, 3, 2, 2), (6, 4, 5, 3, 2))),
    (None, ((32, 32, 32, 8, 8), (32, 16, 32, 8, 8))),
)


def _tiles(max_rows: int, latent: int = 512, sequences: int = 1):
    """(scores tiles, pv tiles) for a launch of ``sequences`` sequences of at most ``max_rows`` =
    Tq * H query rows each, over a latent of ``latent`` channels."""
    if config.ENABLE_CUDASIM:
        return by_bound(_SIM_TILES, max_rows)
    return by_bound(_GPU_TILES["narrow" if latent <= _NARROW_LATENT else "wide"][int(sequences > 1)], max_rows)


@device_function
def _visible(vis_bits, i, s, s0):
    """Does query i see key s? Cached rows always; new rows by bit s - s0 of its mask row."""
    if s < s0:
        return True
    j = s - s0
    return (vis_bits[i, j >> 5] >> uint32(j & 31)) & uint32(1) != uint32(0)


@device_function
def _block_sees_new_keys(vis_bits, row0, rows, H, r0, br, n0, bk, s0, s_end):
    """Whether a scores block (its query rows r0 .. r0 + br of the sequence's ``rows`` = t * H,
    tokens from mask row ``row0``; its keys n0 .. n0 + bk) has a key some row of it sees: always
    when the block holds a cached key (n0 < s0), else by the mask words of its tokens over its
    keys. Every thread of a block works it out alike (a few cached loads), so a block that sees
    nothing leaves before its first barrier. Its scores are then never written, and never used:
    the softmax uses a score only at a position its query sees (``_visible``; its held path loads
    a chunk's whole span and drops the masked positions, so compute-sanitizer's initcheck would
    report those loads)."""
    if n0 < s0:
        return True
    k0 = n0 - s0                                # the block's new keys k0 .. k1 - 1, by mask bit
    k1 = min(n0 + bk, s_end) - s0
    for i in range(row0 + r0 // H, row0 + (min(r0 + br, rows) - 1) // H + 1):
        for w in range(k0 >> 5, ((k1 - 1) >> 5) + 1):
            lo = max(k0 - 32 * w, 0)            # the word's bits lo .. hi - 1 are the block's keys
            hi = min(k1 - 32 * w, 32)
            bits = (uint32(0xFFFFFFFF) >> uint32(32 - hi)) & ~((uint32(1) << uint32(lo)) - uint32(1))
            if vis_bits[i, w] & bits != uint32(0):
                return True
    return False


@functools.lru_cache(maxsize=None)
def _mla_scores_kernel(bm, bn, bk, tm, tn):
    """For sequence z (blockIdx.z; ``_sequence``): scores[row0*H + r, s] = scale * ([q_lat |
    q_pe][row0 + i, h] . [c_kv | k_pe][slot, s]) for r = i*H + h < t*H and s < s0 + t, one fma
    chain over d ascending. Block: (bn // tn, bm // tm) threads; grid: (ceil(S_cap / bn),
    ceil(Tq*H / bm), sequences). Thread (tx, ty) owns rows ty + (bm // tm) * m and keys
    tx + (bn // tn) * j, so a warp reads consecutive shared words.

    Double-buffered: while the block multiplies step s's tiles out of one shared buffer, each
    thread's loads of step s + 1 are in flight into registers, stored to the other buffer
    after; one barrier a step. Each thread's load slots (which query row / key, which d within
    the step) are fixed for the whole kernel, so their index arithmetic is done once."""
    TX, TY = bn // tn, bm // tm
    NT = TX * TY
    LA = -(-(bm * bk) // NT)    # a-tile (query) elements a thread loads a step
    LB = -(-(bn * bk) // NT)    # b-tile (key) elements
    BM1, BN1 = bm + 1, bn + 1   # padded shared rows (shapes must be constants to the compiler)
    UNROLL = 4 if bk % 4 == 0 else 1

    @device_function
    def outer_product(a_sh, b_sh, cur, k, tx, ty, a, b, acc):
        """acc[m, j] = fma(query row m's d = k, key j's d = k, acc[m, j]): one link of every chain."""
        for m in range(tm):
            a[m] = a_sh[cur, k, ty + TY * m]
        for j in range(tn):
            b[j] = b_sh[cur, k, tx + TX * j]
        for m in range(tm):
            for j in range(tn):
                acc[m, j] = fma(a[m], b[j], acc[m, j])

    @cached
    @cuda.jit
    def kernel(q_lat, q_pe, c_kv, k_pe, vis_bits, meta, seqs, scale, scores):
        grid_dependency_after((q_lat, q_pe, c_kv, k_pe, vis_bits, meta, seqs, scale, scores))   # PDL (_device.py)
        C, R = c_kv.shape[2], k_pe.shape[2]
        D = C + R
        H = q_lat.shape[1] // C
        row0, t, s0, slot = _sequence(meta, seqs, cuda.blockIdx.z)
        s_end = s0 + t
        rows = t * H
        r0 = nonneg(cuda.blockIdx.y) * bm
        n0 = nonneg(cuda.blockIdx.x) * bn
        if r0 >= rows or n0 >= s_end:  # the whole block leaves: no barrier is skipped
            return
        if not _block_sees_new_keys(vis_bits, row0, rows, H, r0, bm, n0, bn, s0, s_end):
            return                      # (alike in every thread)
        tx, ty = nonneg(cuda.threadIdx.x), nonneg(cuda.threadIdx.y)
        tid = ty * TX + tx
        a_sh = cuda.shared.array((2, bk, BM1), float32)   # [buffer, d, row]; +1: transposed stores spread over banks
        b_sh = cuda.shared.array((2, bk, BN1), float32)   # [buffer, d, key]
        acc = cuda.local.array((tm, tn), float32)
        a = cuda.local.array(tm, float32)
        b = cuda.local.array(tn, float32)
        a_row = cuda.local.array(LA, int32)     # load slot u: its query row (-1: none) and head
        a_head = cuda.local.array(LA, int32)
        b_key = cuda.local.array(LB, int32)     # load slot u: its key (-1: none)
        a_reg = cuda.local.array(LA, float32)   # the next step's tiles, in flight
        b_reg = cuda.local.array(LB, float32)
        for u in range(LA):                     # d fastest: coalesced reads of a query row
            e = tid + NT * u
            r = r0 + e // bk
            a_row[u] = -1
            a_head[u] = 0
            if e < bm * bk and r < rows:
                i = r // H
                a_row[u] = row0 + i
                a_head[u] = r - i * H
        for u in range(LB):                     # d fastest: coalesced reads of a latent row
            e = tid + NT * u
            s = n0 + e // bk
            b_key[u] = s if e < bn * bk and s < s_end else -1
        for m in range(tm):
            for j in range(tn):
                acc[m, j] = float32(0.0)
        n_steps = (D + bk - 1) // bk
        for step in range(-1, n_steps):
            d1 = (step + 1) * bk                # the step whose tiles are loaded now
            if step + 1 < n_steps:
                for u in range(LA):
                    d = d1 + (tid + NT * u) % bk
                    v = float32(0.0)
                    if a_row[u] >= 0 and d < D:
                        if d < C:
                            v = q_lat[a_row[u], a_head[u] * C + d]
                        else:
                            v = q_pe[a_row[u], a_head[u] * R + d - C]
                    a_reg[u] = v
                for u in range(LB):
                    d = d1 + (tid + NT * u) % bk
                    v = float32(0.0)
                    if b_key[u] >= 0 and d < D:
                        if d < C:
                            v = c_kv[slot, b_key[u], d]
                        else:
                            v = k_pe[slot, b_key[u], d - C]
                    b_reg[u] = v
            if step >= 0:
                cur = step & 1
                if (step + 1) * bk <= D:        # a whole step: unrolled by hand, four links a pass
                    for k in range(0, bk, UNROLL):
                        outer_product(a_sh, b_sh, cur, k, tx, ty, a, b, acc)
                        if UNROLL == 4:
                            outer_product(a_sh, b_sh, cur, k + 1, tx, ty, a, b, acc)
                            outer_product(a_sh, b_sh, cur, k + 2, tx, ty, a, b, acc)
                            outer_product(a_sh, b_sh, cur, k + 3, tx, ty, a, b, acc)
                else:                           # the chain stops at d = D - 1: no padded terms
                    for k in range(D - step * bk):
                        outer_product(a_sh, b_sh, cur, k, tx, ty, a, b, acc)
            if step + 1 < n_steps:
                nxt = (step + 1) & 1            # last read in step - 1: the barrier below it is past
                for u in range(LA):
                    e = tid + NT * u
                    if e < bm * bk:
                        a_sh[nxt, e % bk, e // bk] = a_reg[u]
                for u in range(LB):
                    e = tid + NT * u
                    if e < bn * bk:
                        b_sh[nxt, e % bk, e // bk] = b_reg[u]
            cuda.syncthreads()  # the next tiles are in; every thread is done with this step's
        for m in range(tm):
            r = r0 + ty + TY * m
            if r < rows:
                for j in range(tn):
                    s = n0 + tx + TX * j
                    if s < s_end:
                        scores[row0 * H + r, s] = acc[m, j] * scale

    return kernel


# -- the scores on tensor cores (the bf16 mode's, measured on the H200) ---------------------
# ``MMA_SCORES``: the scores kernel multiplies bf16-rounded queries and keys with ``mma.sync``
# (float32 accumulation in KC-wide chunks added in ascending order, the GEMMs' reduction
# contract, docs/DESIGN.md §4) instead of one float32 fma chain. Each score is still a function
# of its own query row and key row only, so a tree node and the token alone get the same bits;
# the twin is ``reference.mla.mma_scores`` (bf16 operands, exact sums) within
# ``reference.linear.accumulation_bound``. The softmax, p @ c_kv and the combine are unchanged.
# On since the ninth session (H200, Moonlight shape, 1024 cached rows: 145 -> 55 µs at 64 nodes,
# 434 -> 199 at 256, 2,299 -> 1,304 at 1024; docs/PERFORMANCE.md), in the 'bf16' mode only
# (``enqueue_mla_attention``'s ``precision``; 'fp32' keeps the float32 chains).
MMA_SCORES = True
# (wm, wn, mt, nt): a block of wm x wn warps, each 16 * mt keys x 8 * nt query rows.
# By the rows a sequence (Tq * H), measured with ``tools/mla_stages.py --mma-tile`` (fourteenth
# session): from 64 nodes of 16 heads (1,024 rows) blocks of 64 keys x 64 rows (warps of 32 x 16)
# beat 32 x 64 (warps of 16 x 16) by 7-28 % (151.8 against 198.7 µs at 256 nodes, 937 against
# 1,303 at 1024); 64-channel steps and four other shapes were slower.
_MMA_TILES = ((256, (4, 2, 1, 2)), (None, (4, 2, 2, 2)))
_MMA_TILE = None    # an override of the table (tools/mla_stages.py --mma-tile)
_MMA_STEP = 32      # channels a block stages through shared memory a step: a multiple of 16 dividing KC
_MMA_PAD = 4        # words of padding a staged row: its fragment reads hit 32 distinct banks


@device_function
def _key_floats(c_kv, k_pe, slot, key, d, C, D):
    """Key ``key``'s channels d, d + 1 of [c_kv | k_pe] as two float32 (0 past D)."""
    lo = float32(0.0)
    hi = float32(0.0)
    if d < C:
        lo = c_kv[slot, key, d]
    elif d < D:
        lo = k_pe[slot, key, d - C]
    if d + 1 < C:
        hi = c_kv[slot, key, d + 1]
    elif d + 1 < D:
        hi = k_pe[slot, key, d + 1 - C]
    return lo, hi


@device_function
def _query_floats(q_lat, q_pe, qi, h, d, C, R, D):
    """Query row (qi, head h)'s channels d, d + 1 of [q_lat | q_pe] as two float32 (0 past D)."""
    lo = float32(0.0)
    hi = float32(0.0)
    if d < C:
        lo = q_lat[qi, h * C + d]
    elif d < D:
        lo = q_pe[qi, h * R + d - C]
    if d + 1 < C:
        hi = q_lat[qi, h * C + d + 1]
    elif d + 1 < D:
        hi = q_pe[qi, h * R + d + 1 - C]
    return lo, hi


@functools.lru_cache(maxsize=None)
def _mla_scores_mma_kernel(wm, wn, mt, nt, step):
    """``_mla_scores_kernel``'s scores (same arguments, grid (ceil(S_cap / (16 mt wn)),
    ceil(Tq*H / (8 nt wm)), sequences), blocks of 32 wm wn threads) on tensor cores: warp (wy,
    wx) takes keys n0 + 16 mt wx .. and query rows r0 + 8 nt wy .., the keys as mma's A operand
    (16 a tile), the query rows as B (8 a tile).

    The block stages its keys and query rows through shared memory ``step`` channels at a
    time, as bf16 pairs: coalesced float32 reads of the next step are in flight in registers while
    the warps multiply the current one out of the other buffer (one barrier a step). Each output:
    KC-channel chunk partials from 0, 16-channel mma steps in ascending order, each chunk added to
    the total in ascending order (twin: ``reference.mla.mma_scores``, within its bound)."""
    KW, RW = 16 * mt, 8 * nt
    BR, BK = _mma_block(wm, wn, mt, nt)
    NT = 32 * wm * wn
    KS = step
    assert KS % 16 == 0 and KC % KS == 0, "a step is whole mma k-steps inside one KC chunk"
    PW = KS // 2                        # bf16 pairs a staged row holds a step
    ROW = PW + _MMA_PAD
    LK = -(-(BK * PW) // NT)            # key pairs a thread loads a step (all of one key's)
    LQ = -(-(BR * PW) // NT)            # query pairs (of one query row)
    assert PW % LK == 0 and PW % LQ == 0, "a thread's pairs a step lie in one row"

    @cached
    @cuda.jit
    def kernel(q_lat, q_pe, c_kv, k_pe, vis_bits, meta, seqs, scale, scores):
        grid_dependency_after((q_lat, q_pe, c_kv, k_pe, vis_bits, meta, seqs, scale, scores))   # PDL (_device.py)
        C, R = c_kv.shape[2], k_pe.shape[2]
        D = C + R
        H = q_lat.shape[1] // C
        row0, t, s0, slot = _sequence(meta, seqs, cuda.blockIdx.z)
        s_end = s0 + t
        rows = t * H
        n0 = nonneg(cuda.blockIdx.x) * BK
        r0 = nonneg(cuda.blockIdx.y) * BR
        if n0 >= s_end or r0 >= rows:   # the whole block leaves: no barrier is skipped
            return
        if not _block_sees_new_keys(vis_bits, row0, rows, H, r0, BR, n0, BK, s0, s_end):
            return                      # (alike in every thread)
        tid = nonneg(cuda.threadIdx.x)
        warp = tid // 32
        lane = tid % 32
        g = lane // 4
        q4 = lane % 4
        kw = (warp % wn) * KW           # the warp's keys and rows within the block's tile
        rw = (warp // wn) * RW
        busy = n0 + kw < s_end and r0 + rw < rows   # warp-uniform: mma needs all its lanes
        k_sh = cuda.shared.array((2, BK, ROW), uint32)
        q_sh = cuda.shared.array((2, BR, ROW), uint32)
        total = cuda.local.array((mt, nt, 4), float32)
        part = cuda.local.array((mt, nt, 4), float32)
        a = cuda.local.array((mt, 4), uint32)
        b = cuda.local.array((nt, 2), uint32)
        k_lo = cuda.local.array(LK, float32)    # the next step's pairs, in flight
        k_hi = cuda.local.array(LK, float32)
        q_lo = cuda.local.array(LQ, float32)
        q_hi = cuda.local.array(LQ, float32)
        # Each thread reads LK consecutive pairs of one key row and LQ of one query row a step:
        # one row address a thread, the pairs at fixed offsets from it.
        kt, qt = tid // (PW // LK), tid // (PW // LQ)
        kp, qp = LK * (tid % (PW // LK)), LQ * (tid % (PW // LQ))   # the first pair a step
        key = n0 + kt
        key_ok = kt < BK and key < s_end
        key = nonneg(min(key, s_end - 1))       # clamped into the cache; its pairs are zeroed
        r = r0 + qt
        row_ok = qt < BR and r < rows
        r = min(r, rows - 1)
        qi = nonneg(row0 + r // H)
        qh = nonneg(r - (r // H) * H)
        lat = c_kv[slot]                        # this sequence's [S, C] and [S, R]
        rope = k_pe[slot]
        for m in range(mt):
            for n in range(nt):
                for c in range(4):
                    total[m, n, c] = float32(0.0)
                    part[m, n, c] = float32(0.0)
        n_steps = (D + KS - 1) // KS
        for st in range(-1, n_steps):
            d0 = (st + 1) * KS                  # the next step's first channel: its reads, in flight
            if st + 1 < n_steps and d0 + KS <= C:          # the whole step in the latent
                kc = nonneg(d0 + 2 * kp)        # non-negative: no wraparound fix-ups
                qc = nonneg(qh * C + d0 + 2 * qp)
                for j in range(LK):
                    k_lo[j] = lat[key, kc + 2 * j]
                    k_hi[j] = lat[key, kc + 2 * j + 1]
                for j in range(LQ):
                    q_lo[j] = q_lat[qi, qc + 2 * j]
                    q_hi[j] = q_lat[qi, qc + 2 * j + 1]
            elif st + 1 < n_steps and d0 >= C and d0 + KS <= D:   # the whole step in the rope part
                kc = nonneg(d0 - C + 2 * kp)
                qc = nonneg(qh * R + d0 - C + 2 * qp)
                for j in range(LK):
                    k_lo[j] = rope[key, kc + 2 * j]
                    k_hi[j] = rope[key, kc + 2 * j + 1]
                for j in range(LQ):
                    q_lo[j] = q_pe[qi, qc + 2 * j]
                    q_hi[j] = q_pe[qi, qc + 2 * j + 1]
            elif st + 1 < n_steps:              # a step across C or past D: channel by channel
                for j in range(LK):
                    k_lo[j], k_hi[j] = _key_floats(c_kv, k_pe, slot, key, d0 + 2 * (kp + j), C, D)
                for j in range(LQ):
                    q_lo[j], q_hi[j] = _query_floats(q_lat, q_pe, qi, qh, d0 + 2 * (qp + j), C, R, D)
            if st >= 0 and busy:
                cur = st & 1
                for kk in range(KS // 16):
                    k0 = st * KS + 16 * kk
                    if k0 < D:                   # the last step may end inside its first half
                        if k0 % KC == 0:
                            for m in range(mt):
                                for n in range(nt):
                                    for c in range(4):
                                        part[m, n, c] = float32(0.0)
                        w = 8 * kk + q4
                        for m in range(mt):
                            kr = kw + 16 * m + g
                            a[m, 0] = k_sh[cur, kr, w]
                            a[m, 1] = k_sh[cur, kr + 8, w]
                            a[m, 2] = k_sh[cur, kr, w + 4]
                            a[m, 3] = k_sh[cur, kr + 8, w + 4]
                        for n in range(nt):
                            qr = rw + 8 * n + g
                            b[n, 0] = q_sh[cur, qr, w]
                            b[n, 1] = q_sh[cur, qr, w + 4]
                        for m in range(mt):
                            for n in range(nt):
                                d0, d1, d2, d3 = mma_bf16(a[m, 0], a[m, 1], a[m, 2], a[m, 3], b[n, 0], b[n, 1],
                                                          part[m, n, 0], part[m, n, 1], part[m, n, 2],
                                                          part[m, n, 3])
                                part[m, n, 0] = d0
                                part[m, n, 1] = d1
                                part[m, n, 2] = d2
                                part[m, n, 3] = d3
                        if (k0 + 16) % KC == 0 or k0 + 16 >= D:   # the chunk's end: it joins the total
                            for m in range(mt):
                                for n in range(nt):
                                    for c in range(4):
                                        total[m, n, c] = total[m, n, c] + part[m, n, c]
            if st + 1 < n_steps:                # last read in step st - 1: the barrier below it is past
                nxt = (st + 1) & 1
                if key_ok:
                    for j in range(LK):
                        k_sh[nxt, kt, kp + j] = pack_bf16x2(k_lo[j], k_hi[j])
                elif kt < BK:
                    for j in range(LK):
                        k_sh[nxt, kt, kp + j] = uint32(0)
                if row_ok:
                    for j in range(LQ):
                        q_sh[nxt, qt, qp + j] = pack_bf16x2(q_lo[j], q_hi[j])
                elif qt < BR:
                    for j in range(LQ):
                        q_sh[nxt, qt, qp + j] = uint32(0)
            cuda.syncthreads()  # the next tiles are in; every warp is done with this step's
        if busy:
            for m in range(mt):
                for n in range(nt):
                    for c in range(4):
                        s = n0 + kw + 16 * m + g + 8 * (c // 2)        # D's row: the key
                        r = r0 + rw + 8 * n + 2 * q4 + (c % 2)         # D's column: the query row
                        if s < s_end and r < rows:
                            scores[row0 * H + r, s] = total[m, n, c] * scale

    return kernel


@device_function
def _sequence(meta, seqs, z):
    """(row0, t, s0, slot) of sequence z of a launch: its first query row, its new rows, its
    cached rows and its cache's slot (the first index of c_kv / k_pe). A batch gives seqs [S, 4],
    a row (s0, t, row0, slot) a sequence (its first two columns a one-sequence meta); one sequence
    gives an empty seqs and meta = (s0, t): (0, t, s0, 0)."""
    if seqs.shape[0] == 0:
        return 0, meta[1], meta[0], 0
    return seqs[z, 2], seqs[z, 1], seqs[z, 0], seqs[z, 3]


_WORDS = 8     # mask words a scan loads at once: a tree of 1024 nodes has 32, read in four trips, not 32


@device_function
def _load_words(vis_bits, i, w0, words):
    """words[u] = query i's mask word w0 + u for u < _WORDS, all loads issued together (past the
    row's end: its last word again, which the caller skips)."""
    W = vis_bits.shape[1]
    for u in range(_WORDS):
        words[u] = vis_bits[i, min(w0 + u, W - 1)]


@device_function
def _visible_position(vis_bits, i, j, s0):
    """The cache position of query i's j-th visible key (j < its visible count): j itself in the
    cached prefix, else the (j - s0)-th set bit of its mask row (its words loaded _WORDS at a
    time, then scanned in order)."""
    if j < s0:
        return j
    rank = j - s0
    W = vis_bits.shape[1]
    words = cuda.local.array(_WORDS, uint32)
    for w0 in range(0, W, _WORDS):
        _load_words(vis_bits, i, w0, words)
        for u in range(_WORDS):
            word = words[u]
            c = cuda.popc(word) if w0 + u < W else 0
            if rank < c:
                for b in range(32):
                    if (word >> uint32(b)) & uint32(1) != uint32(0):
                        if rank == 0:
                            return s0 + 32 * (w0 + u) + b
                        rank -= 1
            rank -= c
    return -1                                   # not reached for j < the visible count


@device_function
def _visible_count(vis_bits, i, s0):
    """s0 + the set bits of query i's mask row: the keys it sees (its words _WORDS at a time)."""
    n = s0
    W = vis_bits.shape[1]
    words = cuda.local.array(_WORDS, uint32)
    for w0 in range(0, W, _WORDS):
        _load_words(vis_bits, i, w0, words)
        for u in range(_WORDS):
            if w0 + u < W:
                n += cuda.popc(words[u])
    return n


@functools.lru_cache(maxsize=None)
def _mla_softmax_kernel(threads, lanes):
    """Chunk k (blockIdx.x) of query row i (blockIdx.y) < t of sequence z (blockIdx.z), for
    every head h, scratch row g = row0*H + i*H + h: its keys are the visible ones of visible index
    [k*KEY_CHUNK, (k+1)*KEY_CHUNK), cache positions [a, b), the same for every head (one mask row).
    In place over scores[g, a:b]: p = exp(score - m_k) for visible keys, _MASKED for the others;
    m_k -> m_part[g, k], (a, b) -> bounds[g, k] ((0, 0) and m = -inf for a chunk past the query's
    keys). Grid: (chunks of the capacity, Tq, sequences) blocks of ``threads``, in groups of
    ``lanes`` threads, a group a head at a time."""
    T = threads
    K = KEY_CHUNK
    LANES = lanes
    if LANES & (LANES - 1) or LANES > 32:
        raise ValueError(f"softmax lanes a head must be a power of two up to 32 (a warp's shuffle group), got {LANES}")
    if WARP_OPS and T % 32:
        raise ValueError(f"softmax threads {T} must be whole warps on a GPU (its maxima are warp shuffles)")
    if T % LANES:
        raise ValueError(f"softmax threads {T} must be a multiple of its {LANES} lanes a head")
    NG = T // LANES
    KPL = -(-K // LANES)    # scores a lane holds in registers when the chunk spans at most KPL * LANES keys
    if KPL > 32:
        raise ValueError(f"softmax lanes a head must hold at most 32 keys of a {K}-key chunk each, got {LANES} lanes")

    @cached
    @cuda.jit
    def kernel(scores, vis_bits, meta, seqs, n_heads, m_part, bounds):
        grid_dependency_after((scores, vis_bits, meta, seqs, n_heads, m_part, bounds))   # PDL (_device.py)
        k = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        group = tid // LANES
        lane = tid - group * LANES
        row0, t, s0, slot = _sequence(meta, seqs, cuda.blockIdx.z)
        if cuda.blockIdx.y >= t:
            return
        i = row0 + cuda.blockIdx.y                  # its query row (its mask row)
        g0 = i * n_heads                            # its scratch rows g0 .. g0 + H
        n_vis = _visible_count(vis_bits, i, s0)   # every thread: no barrier before the exit below
        if k * K >= n_vis:
            for h in range(tid, n_heads, T):
                m_part[g0 + h, k] = -math.inf
                bounds[g0 + h, k, 0] = 0
                bounds[g0 + h, k, 1] = 0
            return
        a = _visible_position(vis_bits, i, k * K, s0)
        b = _visible_position(vis_bits, i, min((k + 1) * K, n_vis) - 1, s0) + 1
        red = cuda.shared.array(T, float32)         # each thread's partial max
        head_max = cuda.shared.array(NG, float32)   # each group's head's max
        vals = cuda.local.array(KPL, float32)       # a lane's scores, when the span fits (held)
        nxt = cuda.local.array(KPL, float32)        # ... and the next pass's, in flight
        held = b - a <= KPL * LANES                 # the same in every thread: a chunk with few masked keys
        a32 = int32(a + lane)                       # the lane's first position (32-bit: short addresses)
        b32 = int32(b)
        # A lane's keys are the same for every head (one mask row): which of them the query sees,
        # once (bit u: key a + lane + LANES u), and the first pass's scores.
        seen = uint32(0)
        if held:
            for u in range(KPL):
                s = int32(a32 + int32(LANES * u))
                if s < b32 and _visible(vis_bits, i, s, s0):
                    seen |= uint32(1) << uint32(u)
            if group < n_heads:
                for u in range(KPL):
                    vals[u] = scores[g0 + group, uint32(min(a32 + int32(LANES * u), b32 - 1))]
        for h0 in range(0, n_heads, NG):            # the same trip count in every thread
            h = h0 + group
            r = g0 + h
            m = float32(-math.inf)
            if h < n_heads:
                if held:                            # every load issued at once, each score read once
                    for u in range(KPL):
                        if (seen >> uint32(u)) & uint32(1):
                            m = max(m, vals[u])
                else:
                    for s in range(a + lane, b, LANES):
                        if _visible(vis_bits, i, s, s0):
                            m = max(m, scores[r, s])
            # max is exact: any order gives the same value (a -0 / +0 tie may differ, which
            # exp(score - m) and exp(m_k - M) do not see)
            if WARP_OPS:        # a group's lanes are one aligned run of a warp: shuffles
                m = group_max(m, LANES)
            else:               # the simulator: through shared memory, lane 0 of each group
                red[tid] = m
                cuda.syncthreads()  # every partial max of this pass is in
                if lane == 0:
                    for e in range(1, LANES):
                        m = max(m, red[tid + e])
                    head_max[group] = m
                cuda.syncthreads()  # every group's max is in
                m = head_max[group]
            if held and h + NG < n_heads:           # the next pass's scores (rows no group writes
                for u in range(KPL):                # in this pass) fly while this pass's are stored
                    nxt[u] = scores[r + NG, uint32(min(a32 + int32(LANES * u), b32 - 1))]
            if h < n_heads:
                if held:
                    for u in range(KPL):
                        s = int32(a32 + int32(LANES * u))
                        if s < b32:
                            if (seen >> uint32(u)) & uint32(1):
                                scores[r, uint32(s)] = math.exp(vals[u] - m)
                            else:
                                scores[r, uint32(s)] = float32(_MASKED)
                else:
                    for s in range(a + lane, b, LANES):
                        if _visible(vis_bits, i, s, s0):
                            scores[r, s] = math.exp(scores[r, s] - m)
                        else:
                            scores[r, s] = float32(_MASKED)
                if lane == 0:
                    m_part[r, k] = m
                    bounds[r, k, 0] = a
                    bounds[r, k, 1] = b
            if held:
                for u in range(KPL):
                    vals[u] = nxt[u]

    return kernel


@functools.lru_cache(maxsize=None)
def _mla_pv_kernel(bm, bn, bk, tm, tn):
    """Chunk k of sequence z (blockIdx.z = z * chunks + k): o_part[k, g, c] = chain over its keys
    s in [a, b) = bounds[g, k], ascending, of p[g, s] * c_kv[slot, s, c], and l_part[k, g] = the
    chain of p[g, s] (p >= 0; _MASKED marks the rest), for scratch rows g = row0*H + r, r = i*H + h
    < t*H. Block: (bn // tn, bm // tm) threads; grid: (ceil(C / bn), ceil(Tq*H / bm), sequences *
    chunks). Double-buffered as ``_mla_scores_kernel``: one barrier a step of ``bk`` keys."""
    TX, TY = bn // tn, bm // tm
    NT = TX * TY
    LA = -(-(bm * bk) // NT)    # p-tile elements a thread loads a step
    LB = -(-(bn * bk) // NT)    # latent-tile elements
    BM1 = bm + 1   # padded shared rows (shapes must be constants to the compiler)
    UNROLL = 4 if bk % 4 == 0 else 1

    @device_function
    def key_product(p_sh, v_sh, cur, kk, tx, ty, b, l, acc):
        """Key kk of the step into every chain of the thread: l[m] += p and acc[m, j] = fma(p,
        v[j], acc[m, j]) for each row m that sees it (p >= 0); a masked key is skipped, not added
        as zero."""
        for j in range(tn):
            b[j] = v_sh[cur, kk, tx + TX * j]
        for m in range(tm):
            pm = p_sh[cur, kk, ty + TY * m]
            if pm >= float32(0.0):
                l[m] = l[m] + pm
                for j in range(tn):
                    acc[m, j] = fma(pm, b[j], acc[m, j])

    @cached
    @cuda.jit
    def kernel(p, c_kv, meta, seqs, n_heads, bounds, o_part, l_part):
        grid_dependency_after((p, c_kv, meta, seqs, n_heads, bounds, o_part, l_part))   # PDL (_device.py)
        C = c_kv.shape[2]
        nch = bounds.shape[1]
        k = cuda.blockIdx.z % nch
        row0, t, s0, slot = _sequence(meta, seqs, cuda.blockIdx.z // nch)
        rows = t * n_heads
        g0 = row0 * n_heads                          # the sequence's first scratch row
        r0 = nonneg(cuda.blockIdx.y) * bm
        c0 = nonneg(cuda.blockIdx.x) * bn
        if r0 >= rows:  # the whole block leaves: no barrier is skipped
            return
        tx, ty = nonneg(cuda.threadIdx.x), nonneg(cuda.threadIdx.y)
        tid = ty * TX + tx
        p_sh = cuda.shared.array((2, bk, BM1), float32)   # [buffer, key, row]; +1: transposed stores spread over banks
        v_sh = cuda.shared.array((2, bk, bn), float32)     # [buffer, key, channel]
        lo_sh = cuda.shared.array(bm, int32)               # each row's chunk: positions [lo, hi)
        hi_sh = cuda.shared.array(bm, int32)
        acc = cuda.local.array((tm, tn), float32)
        l = cuda.local.array(tm, float32)
        b = cuda.local.array(tn, float32)
        p_reg = cuda.local.array(LA, float32)   # the next step's tiles, in flight
        v_reg = cuda.local.array(LB, float32)
        for rr in range(tid, bm, NT):
            r = r0 + rr
            lo_sh[rr] = bounds[g0 + r, k, 0] if r < rows else 0
            hi_sh[rr] = bounds[g0 + r, k, 1] if r < rows else 0
        for m in range(tm):
            l[m] = float32(0.0)
            for j in range(tn):
                acc[m, j] = float32(0.0)
        cuda.syncthreads()  # the rows' key ranges are in
        lo = 2147483647
        hi = 0
        for rr in range(bm):
            if hi_sh[rr] > lo_sh[rr]:
                lo = min(lo, lo_sh[rr])
                hi = max(hi, hi_sh[rr])
        n_steps = (hi - lo + bk - 1) // bk if hi > lo else 0
        for step in range(-1, n_steps):
            s1 = lo + (step + 1) * bk           # the first key of the step loaded now
            if step + 1 < n_steps:
                for u in range(LA):             # key fastest: coalesced reads of a p row
                    e = tid + NT * u
                    rr = e // bk
                    s = s1 + e % bk
                    v = float32(_MASKED)
                    if e < bm * bk and r0 + rr < rows and lo_sh[rr] <= s and s < hi_sh[rr]:
                        v = p[g0 + r0 + rr, s]
                    p_reg[u] = v
                for u in range(LB):             # channel fastest: coalesced reads of a latent row
                    e = tid + NT * u
                    s = s1 + e // bn
                    c = c0 + e % bn
                    v = float32(0.0)
                    if e < bn * bk and s < hi and c < C:
                        v = c_kv[slot, s, c]
                    v_reg[u] = v
            if step >= 0:
                cur = step & 1
                for kk in range(0, bk, UNROLL):  # ascending keys: the chains of the contract above
                    key_product(p_sh, v_sh, cur, kk, tx, ty, b, l, acc)
                    if UNROLL == 4:
                        key_product(p_sh, v_sh, cur, kk + 1, tx, ty, b, l, acc)
                        key_product(p_sh, v_sh, cur, kk + 2, tx, ty, b, l, acc)
                        key_product(p_sh, v_sh, cur, kk + 3, tx, ty, b, l, acc)
            if step + 1 < n_steps:
                nxt = (step + 1) & 1            # last read in step - 1: the barrier below it is past
                for u in range(LA):
                    e = tid + NT * u
                    if e < bm * bk:
                        p_sh[nxt, e % bk, e // bk] = p_reg[u]
                for u in range(LB):
                    e = tid + NT * u
                    if e < bn * bk:
                        v_sh[nxt, e // bn, e % bn] = v_reg[u]
            cuda.syncthreads()  # the next tiles are in; every thread is done with this step's
        for m in range(tm):
            r = r0 + ty + TY * m
            if r < rows:
                for j in range(tn):
                    c = c0 + tx + TX * j
                    if c < C:
                        o_part[k, g0 + r, c] = acc[m, j]
                if cuda.blockIdx.x == 0 and tx == 0:
                    l_part[k, g0 + r] = l[m]

    return kernel


# ``MMA_PV``: p @ c_kv on tensor cores. A chunk's keys are gathered by visible index in groups of
# 16 (mma's k), so a tree node and the token alone group the same keys the same way; heads are
# mma's n (8 a tile); the channels are m (16 a tile). p and the latents enter as bf16, each chunk's
# partial sums exactly in 16-key steps from 0 (twin: ``reference.mla.mma_pv`` within its bound),
# and l_k comes out of the same mma steps (a row of ones), so the weights it normalises are the
# bf16 ones the output used.
#
# **Prefix chunks shared by tokens.** A chunk wholly inside the cached prefix ((k + 1) * KEY_CHUNK
# <= s0) holds the same keys, at the same positions, for every token of the sequence (visible
# index j < s0 is position j). So a block takes ``_MMA_PV_TOKENS`` tokens there, staging the
# chunk's latent rows once for all of their heads (more columns of mma's n, each column's sums
# the same as alone: a column of D depends on its own column of B only). The other chunks take a
# token a block, in a second launch. Launches with fewer than ``_MMA_PV_SHARE_FROM`` tokens a
# sequence (decode) keep one launch of a token a block for every chunk. None of it changes a bit.
#
# On in the bf16 precision since the fourteenth session (H200, Moonlight shape, 1024 cached rows:
# 99 -> 38 µs at 64 nodes, 391 -> 153 at 256, 1,918 -> 965 at 1024, 418 -> 158 at 16 sequences of
# 17; 8.8 -> 9.6 at one token; docs/PERFORMANCE.md). With one token a block it had measured no
# faster than the float32 chains (99 / 408 / 2,116 µs at 64 / 256 / 1024 nodes): each block read
# its chunk's latent rows for 16 query rows only, and its loads spent ~25 instructions each on
# index arithmetic. 'fp32' keeps the float32 chains.
MMA_PV = True
# The least latent width C whose p @ c_kv runs on tensor cores (a property of the model, so every
# forward of one model takes the same kernel: the bits stay those of the token alone). The demo
# pair's 64 channels keep the float32 chains: there the kernel was no faster (its blocks are
# 128 channels wide), and its bf16 p changed the demo target's greedy text enough to move the
# drafter's acceptance (ddtree 3.92 -> 3.58 tokens a round at budget 16, 548334c).
MMA_PV_LATENT = 256
# (warps, mt, hb): a block of ``warps`` warps over 16 * mt * warps channels of a token's 8 * hb
# heads.
_MMA_PV_TILE = (1, 1, 1) if config.ENABLE_CUDASIM else (4, 2, 2)
_MMA_PV_TOKENS = 2                                      # tokens a block over the prefix chunks (2 or 4: within 7 %)
_MMA_PV_SHARE_FROM = 2 if config.ENABLE_CUDASIM else 4  # tokens a sequence from which they are shared
_PV_CHUNKS = ("all", "prefix", "tail")                 # which chunks a launch takes


@device_function
def _chunk_position(vis_bits, i, j, s0, j_end):
    """The cache position of query i's visible key j, or -1 past j_end (the chunk's end)."""
    if j >= j_end:
        return -1
    if j < s0:
        return j
    return _visible_position(vis_bits, i, j, s0)


@device_function
def _pair_positions(pos_sh, j0, jj, prefix):
    """The cache positions (int32) of a chunk's keys jj and jj + 1 (the chunk from visible index
    j0), -1 off the chunk: from the table ``pos_sh``, or for a prefix chunk (``prefix``) j0 + jj
    itself."""
    if prefix:
        a = int32(j0 + jj)
        return (a if jj < KEY_CHUNK else int32(-1)), (int32(a + 1) if jj + 1 < KEY_CHUNK else int32(-1))
    return pos_sh[uint32(jj)], pos_sh[uint32(jj + 1)]


@functools.lru_cache(maxsize=None)
def _mla_pv_mma_kernel(warps, mt, hb, tokens=1, chunks="all"):
    """``_mla_pv_kernel``'s o_part and l_part (chunk k of every row g = row0*H + i*H + h) on tensor
    cores, from the visible keys of index [k*KEY_CHUNK, min((k+1)*KEY_CHUNK, n_vis)) gathered
    16 at a time. o_part[k, g, c] = the mma chain over the chunk's 16-key steps ascending (from 0)
    of bf16(p) * bf16(c_kv); l_part[k, g] = the same chain of bf16(p) * 1 (a row of ones as A).

    ``chunks``: 'all' every chunk, 'prefix' only those wholly inside the cached prefix ((k + 1) *
    KEY_CHUNK <= s0: the same keys for every token), 'tail' only the others; a block takes
    ``tokens`` consecutive tokens (more than one only for 'prefix'). Grid: (ceil(C / (16 mt
    warps)), ceil(Tq / tokens) * ceil(H / (8 hb)), sequences * chunks), blocks of 32 warps
    threads; block (x, y, z): tokens tokens * (y // ceil(H / (8 hb))) .., heads 8 hb (y % ..) ..,
    channels 16 mt warps x .., chunk z % chunks.

    The chunk's cache positions are found once (a thread a key) into shared memory; each step's
    16 latent rows (the block's channels) and p columns (its tokens' heads) are read coalesced
    into registers while the warps multiply the previous step, and stored as bf16 pairs along the
    keys (mma's k) in shared memory: one barrier a step. A warp takes 16 mt channels (mma's m:
    c_kv transposed as A) against the block's tokens x 8 hb heads (n: p as B); only the warp that
    writes l (warp 0 of the channel block 0) runs the ones row."""
    assert chunks in _PV_CHUNKS and (tokens == 1 or chunks == "prefix"), (tokens, chunks)
    PREFIX = chunks == "prefix"
    TAIL = chunks == "tail"
    TB = tokens
    CW = 16 * mt          # channels a warp
    CB = CW * warps       # channels a block
    HW = 8 * hb           # heads a token a block
    NB = TB * hb          # mma n tiles a block: token n // hb, heads 8 (n % hb) ..
    RB = TB * HW          # p rows a block stages
    NT = 32 * warps
    ROW = 12              # words a staged row: 8 key pairs + 4 of padding (fragment reads hit 32 banks)
    VS = NT // CB             # threads a latent channel: each stages key pairs kv0, kv0 + VS, ..
    assert NT % CB == 0 and 8 % VS == 0, "the block's threads tile a step's 8 latent key pairs exactly"
    LV = 8 // VS              # latent key pairs a thread stages a step
    LP = -(-(8 * RB) // NT)   # p key pairs
    ONE = 0x3F803F80      # two bf16 1.0
    PS = 16 * -(-KEY_CHUNK // 16)   # positions a chunk's 16-key steps read

    @cached
    @cuda.jit
    def kernel(p, c_kv, vis_bits, meta, seqs, n_heads, o_part, l_part):
        grid_dependency_after((p, c_kv, vis_bits, meta, seqs, n_heads, o_part, l_part))   # PDL (_device.py)
        C = c_kv.shape[2]
        nch = o_part.shape[0]
        k = cuda.blockIdx.z % nch
        row0, t, s0, slot = _sequence(meta, seqs, cuda.blockIdx.z // nch)
        HT = (n_heads + HW - 1) // HW
        tg = nonneg(cuda.blockIdx.y) // HT
        ti = tg * TB                                    # the block's first token
        c0 = nonneg(cuda.blockIdx.x) * CB
        j0 = int32(k * KEY_CHUNK)
        shared_keys = j0 + KEY_CHUNK <= s0              # the chunk is the same for every token
        if ti >= t or c0 >= C or (PREFIX and not shared_keys) or (TAIL and shared_keys):
            return                                      # the whole block leaves
        tid = nonneg(cuda.threadIdx.x)
        warp = tid // 32
        lane = tid % 32
        g = lane // 4
        q4 = lane % 4
        i = row0 + ti                                   # the first token's query (mask) row
        h0 = (nonneg(cuda.blockIdx.y) - tg * HT) * HW   # the block's first head
        wc = warp * CW                                  # the warp's channels within the block's
        busy = c0 + wc < C                              # warp-uniform: mma needs all its lanes
        sums = busy and warp == 0 and cuda.blockIdx.x == 0   # the warp that writes l
        if PREFIX:
            j_end = j0 + KEY_CHUNK                      # every token sees more than s0 keys
        else:
            j_end = min(j0 + KEY_CHUNK, _visible_count(vis_bits, i, s0))
        lat = c_kv[slot]                                # this sequence's [S, C]
        pos_sh = cuda.shared.array(PS, int32)           # the chunk's cache positions (-1 past its end)
        v_sh = cuda.shared.array((2, CB, ROW), uint32)  # [buffer, channel, key pair]
        p_sh = cuda.shared.array((2, RB, ROW), uint32)  # [buffer, token * HW + head, key pair]
        if not PREFIX:                                  # the prefix's are j0 + jj: no table
            for jj in range(tid, PS, NT):
                pos_sh[jj] = _chunk_position(vis_bits, i, j0 + jj, s0, j_end)
        acc = cuda.local.array((mt, NB, 4), float32)
        lsum = cuda.local.array((NB, 4), float32)
        a = cuda.local.array((mt, 4), uint32)
        v_lo = cuda.local.array(LV, float32)            # the next step's pairs, in flight
        v_hi = cuda.local.array(LV, float32)
        p_lo = cuda.local.array(LP, float32)
        p_hi = cuda.local.array(LP, float32)
        for m in range(mt):
            for n in range(NB):
                for c in range(4):
                    acc[m, n, c] = float32(0.0)
        for n in range(NB):
            for c in range(4):
                lsum[n, c] = float32(0.0)
        # The thread's staging slots, the same every step: latent key pairs kv0 + VS u of
        # channel vch; p key pair pk of the block's rows tid // 8 + (NT // 8) u (p_row: their
        # rows of p, -1 for a row of no token or head).
        kv0 = int32(tid // CB)
        v_live = c0 + tid % CB < C
        vch = uint32(min(c0 + tid % CB, C - 1))
        pk = int32(tid % 8)
        p_row = cuda.local.array(LP, int32)
        for u in range(LP):
            rb = tid // 8 + (NT // 8) * u               # token rb // HW, head rb % HW of the block
            tt = rb // HW
            hh = rb - tt * HW
            live = rb < RB and ti + tt < t and h0 + hh < n_heads
            p_row[u] = (i + tt) * n_heads + h0 + hh if live else -1
        a_one = uint32(ONE) if g == 0 else uint32(0)    # the ones row of l's A operand
        n_steps = (j_end - j0 + 15) // 16 if j_end > j0 else 0
        cuda.syncthreads()                              # the positions are in
        for st in range(-1, n_steps):
            if st + 1 < n_steps:                        # the next step's reads, in flight
                # Every load is issued (its indices clamped into the arrays) and a key off the
                # chunk, a channel past C or a row of no token selected to 0: no branch between
                # the loads, and unsigned indices (no sign fix-ups in their addresses).
                j1 = int32(16 * (st + 1))               # the step's first key within the chunk
                for u in range(LV):                     # channel fastest: a latent row's read is coalesced
                    pa, pb = _pair_positions(pos_sh, j0, int32(j1 + 2 * (kv0 + VS * u)), PREFIX)
                    lo = lat[uint32(max(pa, 0)), vch]
                    hi = lat[uint32(max(pb, 0)), vch]
                    v_lo[u] = lo if v_live & (pa >= 0) else float32(0.0)   # & : a select, not a branch
                    v_hi[u] = hi if v_live & (pb >= 0) else float32(0.0)
                pa, pb = _pair_positions(pos_sh, j0, int32(j1 + 2 * pk), PREFIX)   # the same keys for every p row
                ca, cb = uint32(max(pa, 0)), uint32(max(pb, 0))
                for u in range(LP):
                    row = uint32(max(p_row[u], 0))
                    lo = p[row, ca]
                    hi = p[row, cb]
                    p_lo[u] = lo if (p_row[u] >= 0) & (pa >= 0) else float32(0.0)
                    p_hi[u] = hi if (p_row[u] >= 0) & (pb >= 0) else float32(0.0)
            if st >= 0:
                cur = st & 1
                if busy:
                    for m in range(mt):
                        cr = wc + 16 * m + g
                        a[m, 0] = v_sh[cur, cr, q4]
                        a[m, 1] = v_sh[cur, cr + 8, q4]
                        a[m, 2] = v_sh[cur, cr, q4 + 4]
                        a[m, 3] = v_sh[cur, cr + 8, q4 + 4]
                    for n in range(NB):
                        b0 = p_sh[cur, 8 * n + g, q4]
                        b1 = p_sh[cur, 8 * n + g, q4 + 4]
                        for m in range(mt):
                            d0, d1, d2, d3 = mma_bf16(a[m, 0], a[m, 1], a[m, 2], a[m, 3], b0, b1,
                                                      acc[m, n, 0], acc[m, n, 1], acc[m, n, 2], acc[m, n, 3])
                            acc[m, n, 0] = d0
                            acc[m, n, 1] = d1
                            acc[m, n, 2] = d2
                            acc[m, n, 3] = d3
                        if sums:
                            e0, e1, e2, e3 = mma_bf16(a_one, uint32(0), a_one, uint32(0), b0, b1,
                                                      lsum[n, 0], lsum[n, 1], lsum[n, 2], lsum[n, 3])
                            lsum[n, 0] = e0
                            lsum[n, 1] = e1
                            lsum[n, 2] = e2
                            lsum[n, 3] = e3
            if st + 1 < n_steps:                        # last read in step st - 1: the barrier below it is past
                nxt = (st + 1) & 1
                for u in range(LV):
                    v_sh[nxt, tid % CB, kv0 + VS * u] = pack_bf16x2(v_lo[u], v_hi[u])
                for u in range(LP):
                    rb = tid // 8 + (NT // 8) * u
                    if rb < RB:
                        p_sh[nxt, rb, pk] = pack_bf16x2(p_lo[u], p_hi[u])
            cuda.syncthreads()  # the next tiles are in; every warp is done with this step's
        if busy:
            for m in range(mt):
                for n in range(NB):
                    tt = n // hb                                         # the column's token
                    for c in range(4):
                        ch = c0 + wc + 16 * m + g + 8 * (c // 2)         # D's row: the channel
                        hh = 8 * (n - tt * hb) + 2 * q4 + (c % 2)        # D's column: the head
                        if ch < C and h0 + hh < n_heads and ti + tt < t:
                            o_part[k, (i + tt) * n_heads + h0 + hh, ch] = acc[m, n, c]
            if sums and g == 0:
                for n in range(NB):
                    tt = n // hb
                    for c in range(2):
                        hh = 8 * (n - tt * hb) + 2 * q4 + c
                        if h0 + hh < n_heads and ti + tt < t:
                            l_part[k, (i + tt) * n_heads + h0 + hh] = lsum[n, c]

    return kernel


@functools.lru_cache(maxsize=None)
def _mla_combine_kernel(threads, per_thread):
    """out_lat[row0 + i, h*C + c] = (sum_k w_k o_part[k, g, c]) / (sum_k w_k l_part[k, g]), w_k
    = exp(m_k - max_k m_k), the sums over the row's chunks in ascending k, g = row0*H + i*H + h,
    i < t, for sequence z (blockIdx.z). Grid: (ceil(C / (threads * per_thread)), Tq*H,
    sequences) blocks of ``threads``; a thread takes channels c0 + tid + threads * v, v <
    ``per_thread``.

    Latency-bound (a few dozen loads a thread, each a trip to L2 or DRAM), so the loads go out
    in batches: the chunks' maxima eight at a time, then four chunks' m, l and o together, added
    in ascending k after they are in. Only the chunks up to the row's last with keys are read:
    o_part is most of the launch's bytes, and a tree's rows fill ~9 of the 16 chunk slots of a
    2048-row cache. The arithmetic of each output is the same whatever the batch or the tile."""
    T = threads
    V = per_thread
    MB = 8      # chunk maxima a batch
    KB = 4      # chunks a batch of the sums

    @cached
    @cuda.jit
    def kernel(o_part, l_part, m_part, meta, seqs, n_heads, out_lat):
        grid_dependency_after((o_part, l_part, m_part, meta, seqs, n_heads, out_lat))   # PDL (_device.py)
        C = o_part.shape[2]
        row0, t, s0, slot = _sequence(meta, seqs, cuda.blockIdx.z)
        if cuda.blockIdx.y >= t * n_heads:
            return
        r = row0 * n_heads + cuda.blockIdx.y
        c0 = nonneg(cuda.blockIdx.x) * (T * V) + nonneg(cuda.threadIdx.x)
        nch = m_part.shape[1]
        mb = cuda.local.array(MB, float32)
        big = float32(-math.inf)
        live = 1            # chunks up to the row's last one with keys (the ones past it: m = -inf)
        for k0 in range(0, nch, MB):
            for u in range(MB):
                mb[u] = m_part[r, min(k0 + u, nch - 1)]
            for u in range(MB):
                if k0 + u < nch:
                    big = max(big, mb[u])
                    if mb[u] > float32(-math.inf):
                        live = k0 + u + 1
        m4 = cuda.local.array(KB, float32)
        l4 = cuda.local.array(KB, float32)
        o4 = cuda.local.array((KB, V), float32)
        o = cuda.local.array(V, float32)
        for v in range(V):
            o[v] = float32(0.0)
        l = float32(0.0)
        for k0 in range(0, live, KB):      # (the partials of chunks past them are never read)
            for u in range(KB):
                k = min(k0 + u, live - 1)
                m4[u] = m_part[r, k] if k0 + u < live else float32(-math.inf)
                l4[u] = l_part[k, r]
                for v in range(V):
                    o4[u, v] = o_part[k, r, min(c0 + T * v, C - 1)]
            for u in range(KB):
                if m4[u] > float32(-math.inf):
                    w = math.exp(m4[u] - big)
                    for v in range(V):
                        o[v] = o[v] + w * o4[u, v]
                    l = l + w * l4[u]
        i = cuda.blockIdx.y // n_heads
        h = cuda.blockIdx.y - i * n_heads
        for v in range(V):
            c = c0 + T * v
            if c < C:
                out_lat[row0 + i, h * C + c] = o[v] / l

    return kernel


class MLAScratch:
    """Device scratch of the attention, preallocated once and shared by every layer.

    Rows are query rows r = i*H + h (at most ``max_rows * heads``); NCH = ceil(capacity /
    KEY_CHUNK) key chunks. ``scores`` [rows, capacity] float32: query i's scores for head h, then
    its p (each chunk's softmax numerators) in place; ``m_part`` [rows, NCH] each chunk's max;
    ``bounds`` [rows, NCH, 2] int32 its cache positions [a, b); ``o_part`` [NCH, rows, latent] and
    ``l_part`` [NCH, rows] its partial output and sum. ``capacity`` >= the cache rows S_cap.
    """

    def __init__(self, max_rows: int, heads: int, capacity: int, latent: int, stream=0):
        rows, cap = max(1, max_rows * heads), max(1, capacity)
        nch = ceil_div(cap, KEY_CHUNK)
        self.scores = cuda.device_array((rows, cap), np.float32, stream=stream)            # [Tq*H, S_cap]
        self.m_part = cuda.device_array((rows, nch), np.float32, stream=stream)            # [Tq*H, NCH]
        self.bounds = cuda.device_array((rows, nch, 2), np.int32, stream=stream)           # [Tq*H, NCH, 2]
        self.o_part = cuda.device_array((nch, rows, max(1, latent)), np.float32, stream=stream)  # [NCH, Tq*H, C]
        self.l_part = cuda.device_array((nch, rows), np.float32, stream=stream)            # [NCH, Tq*H]
        self.no_sequences = cuda.device_array((0, 4), np.int32, stream=stream)   # a one-sequence launch's seqs


# -- the device tier (device arrays only, no checks, no allocation; docs/DESIGN.md §3) ----------

def enqueue_mla_attention(q_lat, q_pe, c_kv, k_pe, out_lat, *, vis_bits, meta, scale, scratch,
                          tiles=None, seqs=None, max_rows=None, precision=None, stream=0):
    """out_lat[i, h*C:(h+1)*C] = softmax_s(scale * (q_lat[i,h] . c_kv[s] + q_pe[i,h] . k_pe[s]))
    @ c_kv over the keys query i sees, for i < t; rows i >= t are not written. Twin:
    ``reference.mla.enqueue_mla_attention`` (the attention of ``reference.mla.mla_attention_absorbed``
    between its two absorptions).

    q_lat [Tq, H*C] f32 (queries through W_uk), q_pe [Tq, H*R] f32 (rotated), c_kv [S_cap, C]
    f32, k_pe [S_cap, R] f32 (the new rows already written at s0 .. s0+t-1), vis_bits [Tq, W]
    uint32, meta [2] int32 device = (s0, t), out_lat [Tq, H*C] f32, scratch ``MLAScratch`` with
    at least Tq*H rows and S_cap columns. The grid is sized for Tq and S_cap. ``tiles``
    overrides ``_tiles`` (tests).

    **Several sequences in one launch set** (``CudaTarget.forward_batch``): ``seqs`` [S, 4] int32
    device, a row (s0, t, row0, slot) per sequence: its queries are rows row0 .. row0 + t of
    q_lat / q_pe / vis_bits / out_lat (vis_bits over its own new rows), its keys rows 0 .. s0 + t
    of c_kv[slot] / k_pe[slot], now [slots, S_cap, C] and [slots, S_cap, R]; ``meta`` is not read;
    ``max_rows`` (host) bounds every t. Each sequence gets the bits of its own launch. One
    sequence's c_kv and k_pe must be contiguous (they are viewed as [1, S_cap, C]).

    ``precision``: the model's mode (``kernels.linear``). 'fp32' keeps float32 chains for the
    scores and p @ c_kv; 'bf16' (or None) lets each run on tensor cores where its switch is on
    (``MMA_SCORES``, ``MMA_PV``: bf16 operands, the GEMMs' reduction contract).
    """
    for _, launch in _mla_launches(q_lat, q_pe, c_kv, k_pe, out_lat, vis_bits=vis_bits, meta=meta, scale=scale,
                                  scratch=scratch, tiles=tiles, seqs=seqs, max_rows=max_rows, precision=precision,
                                  stream=stream):
        launch()


def _mla_launches(q_lat, q_pe, c_kv, k_pe, out_lat, *, vis_bits, meta, scale, scratch, tiles=None, seqs=None,
                 max_rows=None, precision=None, stream=0):
    """The launches of ``enqueue_mla_attention`` (same arguments), in order, as (name, launch())
    pairs: ``tools/mla_stages.py`` times them one by one."""
    C = c_kv.shape[1 if seqs is None else 2]
    H = q_lat.shape[1] // C
    if seqs is None:
        n_seq, tq = 1, q_lat.shape[0]
        c_kv, k_pe, seqs = c_kv.reshape(1, *c_kv.shape), k_pe.reshape(1, *k_pe.shape), scratch.no_sequences
    else:
        n_seq, tq = seqs.shape[0], max_rows
    s_cap = c_kv.shape[1]
    scores = scratch.scores
    st, pt = tiles if tiles is not None else _tiles(tq * H, C, n_seq)
    scale = np.float32(scale)

    nch = scratch.m_part.shape[1]
    if nch * n_seq > 65535:                 # the pv grid's z: chunks of every sequence
        raise ValueError(f"{n_seq} sequences x {nch} key chunks of {KEY_CHUNK} exceed the grid's 65535 z "
                         "blocks: fewer sequences a launch, or smaller caches")
    bm, bn, bk, tm, tn = st
    scores_grid = (ceil_div(s_cap, bn), ceil_div(tq * H, bm), n_seq)
    scores_block = (bn // tn, bm // tm)
    scores_kernel = _mla_scores_kernel(*st)
    if MMA_SCORES and precision != "fp32":
        tile = _mma_tile(tq * H)
        block_rows, block_keys = _mma_block(*tile)
        scores_grid = (ceil_div(s_cap, block_keys), ceil_div(tq * H, block_rows), n_seq)
        scores_block = 32 * tile[0] * tile[1]
        scores_kernel = _mla_scores_mma_kernel(*tile, _MMA_STEP)
    bm, bn, bk, tm, tn = pt
    pv_kernel = _mla_pv_kernel(*pt)
    pv_grid = (ceil_div(C, bn), ceil_div(tq * H, bm), nch * n_seq)
    pv = [("pv", lambda: pv_kernel[pv_grid, (bn // tn, bm // tm), stream](
        scores, c_kv, meta, seqs, H, scratch.bounds, scratch.o_part, scratch.l_part))]
    if MMA_PV and precision != "fp32" and C >= MMA_PV_LATENT:
        parts = ((("pv", "all", 1),) if tq < _MMA_PV_SHARE_FROM else
                 (("pv prefix", "prefix", _MMA_PV_TOKENS), ("pv tail", "tail", 1)))
        pv = [(name, _pv_mma_launch(chunks, tokens, tq, H, C, nch * n_seq, stream, scores, c_kv, vis_bits, meta,
                                    seqs, H, scratch.o_part, scratch.l_part))
              for name, chunks, tokens in parts]
    per_thread = _combine_channels(C)
    return [
        ("scores", lambda: scores_kernel[scores_grid, scores_block, stream](
            q_lat, q_pe, c_kv, k_pe, vis_bits, meta, seqs, scale, scores)),
        ("softmax", lambda: _mla_softmax_kernel(THREADS, _softmax_lanes(tq * n_seq))[(nch, tq, n_seq), THREADS, stream](
            scores, vis_bits, meta, seqs, H, scratch.m_part, scratch.bounds)),
        *pv,
        ("combine", lambda: _mla_combine_kernel(COMBINE_THREADS, per_thread)[
            (ceil_div(C, COMBINE_THREADS * per_thread), tq * H, n_seq), COMBINE_THREADS, stream](
            scratch.o_part, scratch.l_part, scratch.m_part, meta, seqs, H, out_lat)),
    ]


def _softmax_lanes(tokens: int) -> int:
    """The softmax kernel's lanes a head for a launch of ``tokens`` query tokens (all sequences)."""
    if SOFTMAX_LANES is not None:
        return SOFTMAX_LANES
    if config.ENABLE_CUDASIM:
        return 4
    return by_bound(_SOFTMAX_LANES, tokens)


def _mma_tile(rows: int):
    """The tensor-core scores kernel's (wm, wn, mt, nt) for ``rows`` = Tq * H query rows a sequence."""
    if _MMA_TILE is not None:
        return _MMA_TILE
    if config.ENABLE_CUDASIM:
        return (1, 1, 1, 1)
    return by_bound(_MMA_TILES, rows)


def _mma_block(wm, wn, mt, nt):
    """(query rows, keys) of one block of the tensor-core scores kernel at tile (wm, wn, mt, nt):
    wm x wn warps of nt 8-row and mt 16-key tiles."""
    return 8 * nt * wm, 16 * mt * wn


def _combine_channels(C: int) -> int:
    """Channels a combine thread takes: up to COMBINE_CHANNELS, fewer when C leaves threads idle."""
    return max(1, min(COMBINE_CHANNELS, C // COMBINE_THREADS))


def _pv_mma_launch(chunks, tokens, tq, H, C, z_blocks, stream, *args):
    """A launch() of ``_mla_pv_mma_kernel`` at ``_MMA_PV_TILE`` over ``chunks`` ('all' | 'prefix'
    | 'tail'), ``tokens`` tokens a block, for tq query tokens of H heads a sequence."""
    warps, mt, hb = _MMA_PV_TILE
    kernel = _mla_pv_mma_kernel(warps, mt, hb, tokens, chunks)
    grid = (ceil_div(C, 16 * mt * warps), ceil_div(tq, tokens) * ceil_div(H, 8 * hb), z_blocks)
    return lambda: kernel[grid, 32 * warps, stream](*args)


# -- host helpers ---------------------------------------------------------------------------

def _mask_to_bits(mask, n_new: int):
    """Dense mask [T, S] bool -> (s0, bits [T, ceil(T/32)] uint32); ValueError if the mask is
    not one the kernel can apply (every cached row visible, at least one key per query)."""
    t, s = mask.shape
    s0 = s - n_new
    if not mask[:, :s0].all():
        i = int(np.flatnonzero(~mask[:, :s0].all(axis=1))[0])
        raise ValueError(f"mask: query {i} does not see every cached row (the first {s0} columns); "
                         "the kernel shows every cached row to every query")
    new = mask[:, s0:]                                                # [T, T]
    if s0 == 0 and t and not new.any(axis=1).all():
        i = int(np.flatnonzero(~new.any(axis=1))[0])
        raise ValueError(f"mask: query {i} sees no key (its softmax is undefined)")
    w = max(1, ceil_div(t, 32))
    padded = np.zeros((t, 4 * w * 8), dtype=bool)
    padded[:, :t] = new
    bits = np.packbits(padded, axis=1, bitorder="little")             # [T, 4W] uint8
    return s0, np.ascontiguousarray(bits).view("<u4").astype(np.uint32)  # [T, W]


# -- the public launcher (twin: reference.mla.mla_attention_absorbed) ------------------------

def mla_attention_absorbed(q_nope, q_pe, c_kv, k_pe, kv_b_weight, mask, scale, *, precision="fp32",
                           out=None, stream=0):
    """MLA over the cached latents on the GPU: queries through W_uk, tree-verify attention over
    (c_kv, k_pe), output through W_uv. Same arguments and result as the twin.

    q_nope [T, H, D] f32, q_pe [T, H, R] f32 (rotated), c_kv [S, C] f32, k_pe [S, R] f32,
    kv_b_weight [H*(D+Dv), C] f32 / f16 / uint16 (bfloat16 bits), mask [T, S] bool (its values
    are read on the host: a device mask is copied back), scale float -> out [T, H, Dv] f32.
    The mask must show every cached row (the first S - T) to every query; among the new rows it
    may be any pattern (causal, a tree's visibility). ``precision``: of the two per-head
    projections, as in ``kernels.linear``, and of the attention (``enqueue_mla_attention``).
    """
    check_precision(precision)
    check_array("q_nope", q_nope, 3, np.float32)
    t, h, d = q_nope.shape
    check_array("q_pe", q_pe, 3, np.float32, shape=(t, h, None))
    r = q_pe.shape[2]
    check_array("c_kv", c_kv, 2, np.float32)
    s, c = c_kv.shape
    check_array("k_pe", k_pe, 2, np.float32, shape=(s, r))
    check_array("kv_b_weight", kv_b_weight, 2, STORAGE_DTYPES, shape=(None, c))
    rows = kv_b_weight.shape[0]
    if h == 0 or rows % h or rows // h <= d:
        raise ValueError(f"kv_b_weight has {rows} rows; need H * (D + Dv) with H = {h}, D = {d}, Dv >= 1")
    dv = rows // h - d
    check_array("mask", mask, 2, np.bool_, shape=(t, s))
    if s < t:
        raise ValueError(f"c_kv has {s} rows, fewer than the {t} new tokens it must hold")
    try:
        scale = float(scale)
    except (TypeError, ValueError):
        raise ValueError(f"scale must be a number, got {scale!r}") from None
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    if c == 0:
        raise ValueError("c_kv has no latent channels (C = 0)")
    s0, bits = _mask_to_bits(mask.copy_to_host() if is_device(mask) else mask, t)

    y = float32_out(out, (t, h, dv), stream)
    if t:
        host_w = kv_b_weight.copy_to_host() if is_device(kv_b_weight) else kv_b_weight
        w_uk_t, w_uv = absorption_weights(host_w, h, d)              # [H, C, D], [H, Dv, C]
        n_rows = rows_device(t, stream)
        meta = to_device(np.array([s0, t], np.int32), stream)
        q_lat = cuda.device_array((t, h * c), np.float32, stream=stream)   # [T, H*C]
        o_lat = cuda.device_array((t, h * c), np.float32, stream=stream)   # [T, H*C]
        enqueue_linear_heads(to_device(q_nope, stream).reshape(t, h * d), d,
                             to_device(w_uk_t, stream), q_lat, n_rows, precision=precision, stream=stream)
        enqueue_mla_attention(q_lat, to_device(q_pe, stream).reshape(t, h * r), to_device(c_kv, stream),
                              to_device(k_pe, stream), o_lat, vis_bits=to_device(bits, stream), meta=meta,
                              scale=scale, scratch=MLAScratch(t, h, s, c, stream), precision=precision,
                              stream=stream)
        enqueue_linear_heads(o_lat, c, to_device(w_uv, stream), y.reshape(t, h * dv), n_rows,
                             precision=precision, stream=stream)
    return launcher_result(y, out, q_nope, stream)
