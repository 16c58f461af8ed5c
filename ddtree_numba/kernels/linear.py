"""Projections on the GPU, on tensor cores (every GEMM of the forward); twin:
``reference.linear.linear`` with the same ``precision``.

Shapes: R rows (tokens or expert slots), K input features, N output features, Z groups
(heads of a per-head projection, or experts).

**Tensor cores.** Each warp multiplies a 16-feature tile of the weights (the mma's A operand,
rows n, k contiguous as stored) by an 8-row tile of the activations (its B operand) with
``_mma.mma_bf16`` (m16n8k16, bf16 in, float32 accumulate). Lane (g, t) of the warp loads the
four consecutive k = 4t..4t+3 of each 16-wide k step, for its weight rows g and g+8 (one uint64
of bf16 weights each) and for its activation row g; the A and B fragments are built from them
with the same permutation of k, so the product is the same sum. Weights are read straight from
global memory into registers (each weight feeds exactly one lane), a whole chunk at a time: the
next chunk's while the current one is multiplied. Many rows take the staged kernel below instead
(``_staged_kernel``: a block's chunk of weights and activations in shared memory, read by all its
warps; on a GPU with the weights copied by ``cp.async`` into a ring of slots, ``_Staged.NS``).

**Precision** (``kernels.PRECISIONS``, chosen per call; the models choose it at load time):

- ``"bf16"``: activations rounded to bf16 (nearest even) at the GEMM input, as bf16 inference
  does; weights as stored if bf16, else rounded to bf16 too. One mma per k step.
- ``"fp32"``: faithful to float32. Activations split into bf16 hi + lo (x = hi + lo + O(2^-16 x)),
  weights too unless they are bf16: the k step adds wh*xh, wh*xl (and wl*xh) in that order, three
  (or two) mma. Relative error of a product ~2^-16, within the HF-golden tolerance (1e-4).

**The reduction contract (batch invariance, docs/DESIGN.md §4).** Every output is

    y[r, n] = (((P_0 + P_1) + P_2) + ... + P_{C-1}),   P_c = the mma chain of chunk c,

chunks of ``KC`` = 64 consecutive k (4 k steps), each chain starting from 0 in ascending k step
(the terms of a step in the order above), the chunk partials added in ascending c in float32.
An mma's output element depends only on its own weight row, activation row and accumulator, so
nothing depends on how many rows share the launch, where a row sits in its tile, or how the
launch is tiled: a row's result is bit-identical alone, in a batch, or as a tree node. Tiles
(``_Tile``) may change with R; the order of arithmetic may not.

**One kernel** (``_mma_kernel``). A block of NW warps owns 16*MT output features x 8*RT rows.
Its warps split the chunks (warp w takes chunks w, w + NW, ...): after each round of NW chunks
they hand their partials over in shared memory and the owners add them in ascending chunk
order, so the split never changes a bit. Few rows (memory-bound) use many warps a block to keep
enough weight bytes in flight; many rows use NW = 1 and larger MT x RT warp tiles.

Weights are stored as float32, float16, or bfloat16 carried as uint16 bit patterns; bf16
weights whose rows are 8-byte aligned are loaded four to a uint64 word and used as they are,
the others element by element and widened (``_widen``). Activations are float32.

The device tier (``enqueue_*``) takes device arrays only, allocates nothing and reads the live
row count from a device array, so a captured CUDA graph can replay it for any row count.
"""

from __future__ import annotations

import functools
import math
from collections import namedtuple

import numpy as np
from numba import config, cuda, float32, int64, uint32, uint64

from .._checks import check_array, check_precision
from .._device import (by_bound, cached, ceil_div, device_function, float32_out, fma, grid_dependency_after, is_device,
                       launcher_result, nonneg, rows_device, to_device)
from ..dtypes import QUANTIZED, BlockScaled, fp8_block_supported
from ._async import CP_ASYNC_WAIT, cp_async16, cp_async_commit
from ._mma import mma_bf16, pack_bf16x2
from ._widen import ELEM as STORED, KINDS, WIDEN, _weight_kind, bf16_to_f32, hi_f32, lo_f32
from .rms_norm import enqueue_rms_norm

KC = 64                    # reduction chunk of the contract above (fixed: changing it changes bits)
STEPS = KC // 16           # mma k steps a chunk
_SIM = bool(config.ENABLE_CUDASIM)
_SMEM_MAX = 48 * 1024      # static shared memory per block
_GRID_Y_MAX = 65535        # blocks a CUDA grid holds in y (and z)
# The register kernel's activations kept raw until their chunk's mma (``_mma_kernel(xraw=)``; the
# SASS showed each chunk's prefetch waiting on its activations' loads when they were packed to
# bf16 at once). Measured on the H200 (tools/moe_stages.py --no-x-raw, Moonlight's experts):
# gate|up 41.3 -> 36.3 µs at 1 row, 155 -> 140 at 17, 265 -> 240 at 65, 589 -> 541 at 272; down
# 154 -> 130 at 65. False gives the kernel without it (same bits).
_X_RAW = True

# MT m16 weight tiles and RT n8 row tiles a warp, NW warps a block splitting the chunks.
_Tile = namedtuple("_Tile", "MT RT NW")


@device_function
def _exp(v):
    return math.exp(v)


@device_function
def _split_bf16x2(a, b):
    """(hi, lo) words for two float32: hi = bf16(a), bf16(b); lo = bf16 of what hi leaves out."""
    hi = pack_bf16x2(a, b)
    lo = pack_bf16x2(a - bf16_to_f32(hi & uint32(0xFFFF)), b - bf16_to_f32(hi >> uint32(16)))
    return hi, lo


@device_function
def _unpack_pairs(u0, u1, f):
    """Two uint64 words of two float32 each (low half first) -> f[0..3], in k order."""
    f[0] = lo_f32(u0)
    f[1] = hi_f32(u0)
    f[2] = lo_f32(u1)
    f[3] = hi_f32(u1)


@device_function
def _fragment_words(f, hi, lo, i0, i1, split):
    """f[0], f[1] -> word i0 and f[2], f[3] -> word i1 of ``hi`` (two bf16 each, rounded), and with
    ``split`` what the rounding left out -> the same words of ``lo``."""
    if split:
        hi[i0], lo[i0] = _split_bf16x2(f[0], f[1])
        hi[i1], lo[i1] = _split_bf16x2(f[2], f[3])
    else:
        hi[i0] = pack_bf16x2(f[0], f[1])
        hi[i1] = pack_bf16x2(f[2], f[3])


def _smem(tile, swiglu, kind="bf16"):
    """Bytes of shared memory a block of ``tile`` uses: the warps' chunk partials (and, quantized,
    their scales), handed over."""
    if tile.NW == 1:
        return 0
    scales = _scale_slots(kind, tile.MT, swiglu) if kind in SCALED_KINDS else 0
    return tile.NW * (4 * tile.MT * tile.RT * (2 if swiglu else 1) + scales) * 32 * 4


SCALED_KINDS = ("e4m3", "int4")     # quantized weights: their scales multiply the chunk partials


def _chunk(kind, block):
    """k per chunk of the reduction contract: ``KC``, or for quantized weights the largest divisor
    of KC that keeps a chunk inside one block of their scales (gcd(KC, bi): 64 for DeepSeek's 128
    x 128 fp8 blocks, 32 for Kimi's int4 groups of 32)."""
    return math.gcd(KC, block[1]) if kind in SCALED_KINDS else KC


def _paired(kind, block):
    """Whether quantized chunks take their k in pairs of steps (``_k_offset``): float8 in 64-k
    chunks, int4 in chunks of two steps or more (a lane's eight k of two steps are one int32 word)."""
    return (kind == "int4" and _chunk(kind, block) >= 32) or (kind == "e4m3" and _chunk(kind, block) == KC)


@device_function
def _k_offset(st, t, paired):
    """The first of the four consecutive k (within a chunk) that lane thread t feeds to the mma
    slots 2t, 2t+1, 2t+8, 2t+9 at k step st. Plain: 16*st + 4t, a step's 16 k in order. Paired
    (float8 64-k chunks): 8t + 4*(st % 2) + 32*(st // 2), so that a lane's k of steps 2i and 2i+1
    are 8 consecutive bytes and the four lanes of a row read 32 consecutive bytes in one load (4
    consecutive bytes a lane would use half of each 32-byte sector a load). Either way each step
    takes 16 distinct k and a chunk all 64; the weights and activations use the same map."""
    if paired:
        return 8 * t + 4 * (st % 2) + 32 * (st // 2)
    return 16 * st + 4 * t


@functools.lru_cache(maxsize=None)
def _epilogue(kind, block, MT, RT, swiglu, accumulate, scales="f32"):
    """The device functions both kernels end a chunk and a tile with, for a warp tile of MT m
    tiles x RT row tiles (one piece of code, so the register and staged kernels add and store
    the same way):

    - ``load_scales(sv, sc, scu, z, col, N, c, C, g)``: the scales of chunk c (clamped to C - 1)
      for the lane's features g, g + 8 of each m tile from ``col``, as float32 from their storage
      ``scales`` ('f32', or 'bf16' bits: int4 group scales as released), into ``sv`` [NSV] at
      (mt*2 + h)*S (+1: the up matrix's). Loaded with the chunk's weights, a chunk ahead, so no
      add waits on a scale's global load (that wait had doubled each chunk's latency);
    - ``add_chunk(ys, acc, sv)``: a chunk's chains ``acc`` into the running sums ``ys`` (same
      layout: position p = (mt*RT + rt)*4 + e at p*S, its up matrix at p*S + 1), each times its
      block's scale from ``sv`` when quantized;
    - ``store(out, j, n, oc, ys, q)``: output (j, n) from the sums at ys[q] (and ys[q + 1]):
      SwiGLU of the pair, added into ``out`` or written.
    """
    S = 2 if swiglu else 1
    SCALED = kind in SCALED_KINDS
    BO, BI = block
    KCH = _chunk(kind, block)
    widen_scale = WIDEN[scales]

    @device_function
    def load_scales(sv, sc, scu, z, col, N, c, C, g):
        """Rows past N read row N - 1's scale, chunks past C chunk C - 1's (never used)."""
        if SCALED:
            kb = (min(c, C - 1) * KCH) // BI
            for mt in range(MT):
                for h in range(2):
                    nb = min(col + mt * 16 + g + 8 * h, N - 1) // BO
                    sv[(mt * 2 + h) * S] = widen_scale(sc[z, nb, kb])
                    if swiglu:
                        sv[(mt * 2 + h) * S + 1] = widen_scale(scu[z, nb, kb])

    @device_function
    def add_chunk(ys, acc, sv):
        if SCALED:                            # position p = (mt*RT + rt)*4 + 2h + e2: feature g + 8h
            for mt in range(MT):
                for h in range(2):
                    s0 = sv[(mt * 2 + h) * S]
                    s1 = sv[(mt * 2 + h) * S + 1] if swiglu else s0
                    for rt in range(RT):
                        for e2 in range(2):
                            q = ((mt * RT + rt) * 4 + 2 * h + e2) * S
                            ys[q] = fma(acc[q], s0, ys[q])     # one rounding, GPU and simulator alike
                            if swiglu:
                                ys[q + 1] = fma(acc[q + 1], s1, ys[q + 1])
        else:
            for q in range(4 * MT * RT * S):
                ys[q] = ys[q] + acc[q]

    @device_function
    def store(out, j, n, oc, ys, q):
        yv = ys[q]
        if swiglu:
            yv = yv / (float32(1.0) + _exp(-yv)) * ys[q + 1]
        if accumulate:
            out[j, oc + n] = out[j, oc + n] + yv
        else:
            out[j, oc + n] = yv

    return load_scales, add_chunk, store


def _scale_slots(kind, MT, swiglu):
    """Scales a lane holds for a chunk (``_epilogue``'s sv): one per m tile, half and matrix."""
    return 2 * MT * (2 if swiglu else 1) if kind in SCALED_KINDS else 1


@device_function
def _block_rows(items, n_rows, rows_per_tile, grouped):
    """The group and rows a block multiplies, as (z, first, end, step): its row tiles start at
    first, first + step, ... below end. Grouped: work item blockIdx.y of ``items``, (z, first,
    end) at 3y (its rows, in tiles of ``rows_per_tile``); else group blockIdx.z and rows
    blockIdx.y * rows_per_tile, grid-strided below n_rows[0]."""
    y = nonneg(cuda.blockIdx.y)
    if grouped:
        return nonneg(items[3 * y]), nonneg(items[3 * y + 1]), nonneg(items[3 * y + 2]), rows_per_tile
    return nonneg(cuda.blockIdx.z), y * rows_per_tile, nonneg(n_rows[0]), nonneg(cuda.gridDim.y) * rows_per_tile


@functools.lru_cache(maxsize=None)
def _mma_kernel(kind, swiglu, accumulate, grouped, gather, vec, xvec, precision, MT, RT, NW, block=(0, 0),
                scales="f32", xraw=False):
    """Every projection of the module (the device tier below is its only caller).

    ``kernel(x, x_gs, w, w_up, w_scale, w_up_scale, out, o_gs, n_rows, items, row_index)``: for group z
    and rows j in [start, end) (grouped: work item y = blockIdx.y of ``items``, the triple
    (z, start, end) at 3y, from ``_enqueue_moe_sort``; else z = blockIdx.z and 0, n_rows[0]),
    out[j, z*o_gs + n] (+)= f(x[r, z*x_gs : z*x_gs + K] @ w[z, n]) with
    r = row_index[j] if ``gather`` else j, and f the identity, or SwiGLU of (w, w_up). ``vec``:
    bf16 weights as uint64 words, float8 as uint32 words (a lane's four k in one word); ``xvec``:
    activations as float32 pairs (K % 4 == 0, even offsets). kind 'e4m3': w / w_up hold float8
    bytes and w_scale / w_up_scale [Z, ceil(N/bo), ceil(K/bi)] their scales, ``block`` = (bo, bi);
    each chunk partial is multiplied by its block's scale before it is added; kind 'int4': w / w_up
    hold int32 words of eight nibbles and w_scale / w_up_scale [Z, N, ceil(K/group)] their group
    scales, float32 or bf16 bits (``scales``), ``block`` = (1, group). Grid: (column blocks of
    16*MT, row tiles of 8*RT grid-strided, Z), grouped (column blocks, work items, 1); 32*NW
    threads.

    ``xraw`` (with ``xvec``; on by default, ``_X_RAW``: measured faster on the H200): the
    activations stay raw float32 pairs in registers until their chunk's mma step (as float8
    weights do), so the prefetch of the next chunk does not wait for its activations to land
    before the current chunk's mma; and a tile's gathered row numbers are read once, not once a
    chunk. The same conversions in the same order: the same bits as without it.
    """
    S = 2 if swiglu else 1                    # matrices: gate (and up)
    FP8 = kind in SCALED_KINDS                # quantized (float8 / int4): scales per block (``_epilogue``)
    INT4 = kind == "int4"                     # eight 4-bit values an int32 word
    UB = 4 if INT4 else 8                     # bits of one quantized value in a raw unit of four
    KCH = _chunk(kind, block)                 # k per chunk (KC unless the scale blocks are narrower)
    STEPS = KCH // 16
    XSPLIT = precision == "fp32"              # activations as bf16 hi + lo
    WSPLIT = XSPLIT and kind in ("f32", "f16")   # weights too (bf16, e4m3 and int4 values are exact in bf16)
    RAW = vec and not FP8                     # bf16 words straight from memory
    RAW8 = vec and FP8                        # quantized units of four values, raw until the mma step
    PAIRED = _paired(kind, block)             # the k slots of quantized chunks (``_paired``)
    P = 4 * MT * RT                           # accumulator positions a lane holds, per matrix
    OWN = ceil_div(P, NW)                     # positions whose running sums a thread owns
    PS, OWNS = P * S, OWN * S                 # accumulators a lane holds; running sums a thread owns
    BN, RB = 16 * MT, 8 * RT
    NA = STEPS * MT * S * 4                   # A words a lane holds for a chunk
    NB = STEPS * RT * 2                       # B words
    NAL = NA if WSPLIT else 1                 # lo words: only when split
    NBL = NB if XSPLIT else 1
    XVEC = xvec                               # activations read as float32 pairs (uint64)
    XRAW = xraw and xvec                      # ... kept raw until the mma step
    NXR = STEPS * RT * 2 if XRAW else 1       # raw uint64 pairs a lane holds for a chunk
    PB = (NW, PS, 32) if NW > 1 else (1, 1, 1)
    ELEM = STORED[kind]
    widen = WIDEN[kind]

    @device_function
    def load_chunk(c, x, xc, wv, wuv, z, col0, N, K, tile0, end, row_index, g, t, wa, wl, xb, xl, xr, rows, f):
        """Chunk c's fragments into (wa, wl, xb, xl): lane (g, t) takes k = 4t..4t+3 of each
        k step, for its weight rows g and g+8 of each m tile and its row g of each row tile.
        Past K (or C) the loads give zeros."""
        for st in range(STEPS):
            k0 = c * KCH + _k_offset(st, t, PAIRED)
            for mt in range(MT):
                for s in range(S):
                    for h in range(2):
                        n = col0 + mt * 16 + g + 8 * h
                        ai = ((st * MT + mt) * S + s) * 4 + h            # a0 / a1; a2 / a3 at +2
                        if RAW:
                            u = uint64(0)
                            if n < N and k0 < K:
                                u = wuv[z, n, k0 // 4] if s == 1 else wv[z, n, k0 // 4]
                            wa[ai] = uint32(u & uint64(0xFFFFFFFF))
                            wa[ai + 2] = uint32(u >> uint64(32))
                        elif RAW8:
                            u8 = uint32(0)
                            if n < N and k0 < K:
                                if INT4:              # the word of k0 .. k0+7, its half of k0
                                    wd = uint32(wuv[z, n, k0 // 8] if s == 1 else wv[z, n, k0 // 8])
                                    u8 = (wd >> uint32(16 * ((k0 % 8) // 4))) & uint32(0xFFFF)
                                elif PAIRED:          # steps 2i and 2i+1 share a uint64 of 8 bytes
                                    u64 = wuv[z, n, k0 // 8] if s == 1 else wv[z, n, k0 // 8]
                                    u8 = uint32(u64 >> uint64(32 * (st % 2)))
                                else:
                                    u8 = wuv[z, n, k0 // 4] if s == 1 else wv[z, n, k0 // 4]
                            wa[ai] = u8                # raw: decoded by mma_chunk, after the load has landed
                        else:
                            for e in range(4):
                                v = ELEM(0)
                                if n < N and k0 + e < K:
                                    v = wuv[z, n, k0 + e] if s == 1 else wv[z, n, k0 + e]
                                f[e] = widen(v)
                            _fragment_words(f, wa, wl, ai, ai + 2, WSPLIT)
            for rt in range(RT):
                j = tile0 + rt * 8 + g
                rx = j
                if XRAW:
                    rx = rows[rt]
                elif gather and j < end:
                    rx = row_index[j]
                bi = (st * RT + rt) * 2
                if XVEC:                      # two float32 pairs (K % 4 == 0: all four or none)
                    u0 = uint64(0)
                    u1 = uint64(0)
                    if j < end and k0 < K:
                        u0 = x[rx, (xc + k0) // 2]
                        u1 = x[rx, (xc + k0) // 2 + 1]
                    if XRAW:                  # kept raw: mma_chunk converts them
                        xr[bi] = u0
                        xr[bi + 1] = u1
                    else:
                        _unpack_pairs(u0, u1, f)
                else:
                    for e in range(4):
                        v = float32(0.0)
                        if j < end and k0 + e < K:
                            v = x[rx, xc + k0 + e]
                        f[e] = v
                if not XRAW:
                    _fragment_words(f, xb, xl, bi, bi + 1, XSPLIT)

    @device_function
    def mma_chunk(wa, wl, xb, xl, xr, f, acc):
        """The chunk's mma chains into acc, from 0, ascending k step (the terms of a step in the
        order of the module docstring). ``XRAW``: each step's activations are converted from
        their raw pairs in xr into xb (xl) first."""
        for q in range(PS):
            acc[q] = float32(0.0)
        for st in range(STEPS):
            if XRAW:
                for rt in range(RT):
                    bi = (st * RT + rt) * 2
                    _unpack_pairs(xr[bi], xr[bi + 1], f)
                    _fragment_words(f, xb, xl, bi, bi + 1, XSPLIT)
            for mt in range(MT):
                for s in range(S):
                    ai = ((st * MT + mt) * S + s) * 4
                    if RAW8:                  # quantized values of rows g, g+8 -> bf16 pairs, exactly
                        r0 = wa[ai]
                        r1 = wa[ai + 1]
                        a0 = pack_bf16x2(widen(r0), widen(r0 >> uint32(UB)))
                        a2 = pack_bf16x2(widen(r0 >> uint32(2 * UB)), widen(r0 >> uint32(3 * UB)))
                        a1 = pack_bf16x2(widen(r1), widen(r1 >> uint32(UB)))
                        a3 = pack_bf16x2(widen(r1 >> uint32(2 * UB)), widen(r1 >> uint32(3 * UB)))
                    else:
                        a0, a1, a2, a3 = wa[ai], wa[ai + 1], wa[ai + 2], wa[ai + 3]
                    for rt in range(RT):
                        bi = (st * RT + rt) * 2
                        q0 = (mt * RT + rt) * 4 * S + s                  # position p at q0 + p*S
                        d = mma_bf16(a0, a1, a2, a3, xb[bi], xb[bi + 1],
                                     acc[q0], acc[q0 + S], acc[q0 + 2 * S], acc[q0 + 3 * S])
                        if XSPLIT:
                            d = mma_bf16(a0, a1, a2, a3, xl[bi], xl[bi + 1], d[0], d[1], d[2], d[3])
                        if WSPLIT:
                            d = mma_bf16(wl[ai], wl[ai + 1], wl[ai + 2], wl[ai + 3], xb[bi], xb[bi + 1],
                                         d[0], d[1], d[2], d[3])
                        acc[q0] = d[0]
                        acc[q0 + S] = d[1]
                        acc[q0 + 2 * S] = d[2]
                        acc[q0 + 3 * S] = d[3]

    load_scales, add_chunk, store = _epilogue(kind, block, MT, RT, swiglu, accumulate, scales)
    NSV = _scale_slots(kind, MT, swiglu)
    SB = (NW, NSV, 32) if NW > 1 and FP8 else (1, 1, 1)

    @device_function
    def add_partials(rnd, C, warp, lane, acc, ys, pbuf, sv, sbuf):
        """Round rnd's chunk partials into the running sums, in ascending chunk order (quantized:
        each times its block's scale, loaded with the chunk into sv)."""
        if NW == 1:                           # chunk rnd, the warp's own: ys has acc's layout
            add_chunk(ys, acc, sv)
        else:
            for q in range(PS):
                pbuf[warp, q, lane] = acc[q]
            if FP8:                           # the owner of a position has the same lane (same g)
                for q in range(NSV):
                    sbuf[warp, q, lane] = sv[q]
            cuda.syncthreads()
            for i in range(OWN):
                p = warp + NW * i
                if p < P:
                    qs = ((p // (4 * RT)) * 2 + (p % 4) // 2) * S     # its scale slot: m tile, half
                    for w2 in range(NW):
                        c = rnd * NW + w2
                        if c < C:
                            if FP8:
                                ys[i * S] = fma(pbuf[w2, p * S, lane], sbuf[w2, qs, lane], ys[i * S])
                                if swiglu:
                                    ys[i * S + 1] = fma(pbuf[w2, p * S + 1, lane], sbuf[w2, qs + 1, lane],
                                                        ys[i * S + 1])
                            else:
                                for s in range(S):
                                    ys[i * S + s] = ys[i * S + s] + pbuf[w2, p * S + s, lane]
            cuda.syncthreads()                # pbuf is rewritten next round

    # launch bounds: registers capped so that a block of 32*NW threads always fits an SM
    @cached
    @(cuda.jit if _SIM else cuda.jit(launch_bounds=(32 * NW,)))
    def kernel(x, x_gs, w, w_up, sc, scu, out, o_gs, n_rows, items, row_index):
        grid_dependency_after((x, x_gs, w, w_up, sc, scu, out, o_gs, n_rows, items, row_index))   # PDL (_device.py)
        tid = nonneg(cuda.threadIdx.x)
        warp = tid // 32
        lane = tid % 32
        g = lane // 4
        t = lane % 4
        col0 = nonneg(cuda.blockIdx.x) * BN
        N = w.shape[1]
        K = w.shape[2] * 8 if INT4 else w.shape[2]   # int4: eight values a word
        C = (K + KCH - 1) // KCH
        rounds = (C + NW - 1) // NW           # the same for every warp: mma and syncs stay uniform
        z, first, end, step = _block_rows(items, n_rows, RB, grouped)
        xc = z * x_gs
        oc = z * o_gs
        if RAW:                               # constants: numba prunes the other branches
            wv = w.view(np.uint64)
            wuv = w_up.view(np.uint64)
        elif INT4:
            wv = w
            wuv = w_up
        elif RAW8 and PAIRED:
            wv = w.view(np.uint64)
            wuv = w_up.view(np.uint64)
        elif RAW8:
            wv = w.view(np.uint32)
            wuv = w_up.view(np.uint32)
        else:
            wv = w
            wuv = w_up
        if XVEC:
            xv = x.view(np.uint64)
        else:
            xv = x
        pbuf = cuda.shared.array(PB, float32)
        sbuf = cuda.shared.array(SB, float32)
        # two sets of fragments: chunk r + 1 loads while chunk r is multiplied
        wa0 = cuda.local.array(NA, uint32)    # A fragments (bf16 hi)
        wl0 = cuda.local.array(NAL, uint32)   # A fragments, bf16 lo (WSPLIT)
        xb0 = cuda.local.array(NB, uint32)    # B fragments (bf16 hi)
        xl0 = cuda.local.array(NBL, uint32)   # B fragments, bf16 lo (XSPLIT)
        wa1 = cuda.local.array(NA, uint32)
        wl1 = cuda.local.array(NAL, uint32)
        xb1 = cuda.local.array(NB, uint32)
        xl1 = cuda.local.array(NBL, uint32)
        xr0 = cuda.local.array(NXR, uint64)   # XRAW: raw activation pairs of a chunk
        xr1 = cuda.local.array(NXR, uint64)
        rows = cuda.local.array(RT, int64)    # XRAW: the activation row of each row tile
        sv0 = cuda.local.array(NSV, float32)  # the chunks' scales (quantized kinds)
        sv1 = cuda.local.array(NSV, float32)
        acc = cuda.local.array(PS, float32)
        ys = cuda.local.array(OWNS, float32)
        f = cuda.local.array(4, float32)
        for tile0 in range(first, end, step):
            for q in range(OWNS):
                ys[q] = float32(0.0)
            if XRAW:
                for rt in range(RT):
                    j = tile0 + rt * 8 + g
                    rows[rt] = j
                    if gather and j < end:
                        rows[rt] = row_index[j]
            load_chunk(warp, xv, xc, wv, wuv, z, col0, N, K, tile0, end, row_index, g, t, wa0, wl0, xb0, xl0, xr0,
                       rows, f)
            load_scales(sv0, sc, scu, z, col0, N, warp, C, g)
            for rnd in range(0, rounds, 2):
                if rnd + 1 < rounds:
                    load_chunk((rnd + 1) * NW + warp, xv, xc, wv, wuv, z, col0, N, K, tile0, end, row_index,
                               g, t, wa1, wl1, xb1, xl1, xr1, rows, f)
                    load_scales(sv1, sc, scu, z, col0, N, (rnd + 1) * NW + warp, C, g)
                mma_chunk(wa0, wl0, xb0, xl0, xr0, f, acc)
                add_partials(rnd, C, warp, lane, acc, ys, pbuf, sv0, sbuf)
                if rnd + 1 < rounds:
                    if rnd + 2 < rounds:
                        load_chunk((rnd + 2) * NW + warp, xv, xc, wv, wuv, z, col0, N, K, tile0, end,
                                   row_index, g, t, wa0, wl0, xb0, xl0, xr0, rows, f)
                        load_scales(sv0, sc, scu, z, col0, N, (rnd + 2) * NW + warp, C, g)
                    if XRAW:                  # xb0 / xl0 are scratch for either chunk's conversion
                        mma_chunk(wa1, wl1, xb0, xl0, xr1, f, acc)
                    else:
                        mma_chunk(wa1, wl1, xb1, xl1, xr1, f, acc)
                    add_partials(rnd + 1, C, warp, lane, acc, ys, pbuf, sv1, sbuf)
            # -- write the owned outputs: position p = (mt*RT + rt)*4 + e is feature g + 8*(e//2)
            #    of m tile mt and row 2t + e%2 of row tile rt (the C fragment layout)
            for i in range(OWN):
                p = warp + NW * i
                if p < P:
                    e = p % 4
                    mt = p // (4 * RT)
                    rt = (p // 4) % RT
                    n = col0 + mt * 16 + g + 8 * (e // 2)
                    j = tile0 + rt * 8 + 2 * t + e % 2
                    if j < end and n < N:
                        store(out, j, n, oc, ys, i * S)

    return kernel


# -- the staged kernel: shared-memory tiles for many rows ------------------------------------------
# A block of WM x WN warps owns BF = 16*MT*WM features x BR = 8*RT*WN rows. Per chunk its threads
# copy the chunk's weights (bf16 as stored, or float8 widened to bf16) and its activations (rounded,
# or split hi + lo) into shared memory, once for the whole block; each warp then reads its
# fragments from there. Every weight feeds BR rows and every activation BF features, instead of
# the 8*RT and 16*MT of a warp loading its own. The arithmetic is the register kernel's, step for
# step: the same k slots for the same k (lane (g, t) takes k = 4t..4t+3 of a step), chunk chains
# from zero, partials added in ascending order; so the bits are the same too (tests hold it).
#
# NS > 0 (bf16 weights only): the weights skip the registers. Each thread issues ``cp.async``
# copies of its 16-byte pieces of chunk c + NS - 1 into a ring of NS shared slots while the
# block multiplies chunk c, so NS - 1 chunks of weights are in flight a block (``_async.py``).
# The activations still go through registers (they are rounded to bf16 on the way), one chunk
# ahead. Same slots, same fragments, same chains: the same bits.
# WM x WN warps a block, each MT m16 weight tiles x RT n8 row tiles; NS > 0: the weights in a ring
# of NS shared slots filled by cp.async; XA (with NS): the activations ride the same ring, as
# float32 slots (a thread converts the pieces it copied to the bf16 buffer the mma reads, one of
# two by chunk parity), so both operands are NS - 1 chunks ahead and a chunk takes one barrier.
_Staged = namedtuple("_Staged", "WM WN MT RT NS XA", defaults=(0, 0))
_PAD64 = 4                 # uint64 words of padding a shared row: 64-bit fragment reads of a half
                           # warp then hit 16 distinct bank pairs (row stride 40 words = 8 mod 32)
_NS_MAX = len(CP_ASYNC_WAIT) + 1   # ring slots the waits allow


def _staged_smem(tile, swiglu, precision, kind="bf16", block=(0, 0)):
    """Bytes of static shared memory a block of the staged kernel uses."""
    q = _chunk(kind, block) // 4 + _PAD64
    rows_w = (2 if swiglu else 1) * 16 * tile.MT * tile.WM
    rows_x = (2 if precision == "fp32" else 1) * 8 * tile.RT * tile.WN
    words = (max(1, tile.NS) * rows_w + (2 if tile.XA else 1) * rows_x) * q
    if tile.XA:                               # the activations' float32 slots: a row's chunk in pairs
        words += tile.NS * 8 * tile.RT * tile.WN * (_chunk(kind, block) // 2)
    return words * 8


@functools.lru_cache(maxsize=None)
def _staged_kernel(kind, swiglu, accumulate, grouped, gather, precision, WM, WN, MT, RT, NS=0, XA=0, block=(0, 0),
                   scales="f32"):
    """The staged GEMM (above): the arguments and results of ``_mma_kernel`` for bf16 (uint64
    words) or float8 (uint32 words) weights and activations read as float32 pairs. ``NS`` > 0: a
    ring of NS weight slots filled by ``cp.async`` (bf16 weights, K % 8 == 0); ``XA``: the
    activations in the ring too (rows and group offsets of whole 16-byte pieces). Row tiles of 8
    rows wholly past the block's last row are skipped (no mma)."""
    ASYNC = NS > 0
    if ASYNC and (kind != "bf16" or not 2 <= NS <= _NS_MAX):
        raise ValueError(f"a cp.async ring takes bf16 weights and 2..{_NS_MAX} slots, got {kind} and {NS}")
    if XA and not ASYNC:
        raise ValueError("activations ride the cp.async ring (XA) only beside a weight ring (NS >= 2)")
    SLOTS = max(1, NS)
    S = 2 if swiglu else 1
    FP8 = kind in SCALED_KINDS
    INT4 = kind == "int4"
    UB = 4 if INT4 else 8
    KCH = _chunk(kind, block)
    STEPS = KCH // 16
    Q = KCH // 4                              # uint64 words of four bf16 a row of a chunk
    QP = Q + _PAD64
    XSPLIT = precision == "fp32"
    PAIRED = _paired(kind, block)
    NT = 32 * WM * WN
    BF, BR = 16 * MT * WM, 8 * RT * WN
    P = 4 * MT * RT
    PS = P * S
    NWW = 1 if ASYNC else ceil_div(S * BF * Q, NT)   # weight words a thread stages per chunk
    NWC = ceil_div(BF * (Q // 2), NT)         # ASYNC: 16-byte pieces a thread copies per chunk and matrix
    NXW = ceil_div(BR * Q, NT)                # activation quads
    XL = 2 if XSPLIT else 1
    XB = 2 if XA else 1                       # bf16 activation buffers (XA: one a chunk's parity)
    WS_SHAPE, XS_SHAPE = (SLOTS, S, BF, QP), (XB, XL, BR, QP)
    XF_SHAPE = (SLOTS, BR, 2 * Q) if XA else (1, 1, 2)   # XA: float32 slots, a row's chunk as pairs
    # cp.async writes 16-byte pieces: the ring must start 16-byte aligned (numba aligns a uint64
    # array to 8; the simulator takes no alignment argument)
    RING_ALIGN = 16 if ASYNC and not _SIM else None
    wait_ring = CP_ASYNC_WAIT[max(0, NS - 2)]
    widen = WIDEN[kind]
    load_scales, add_chunk, store = _epilogue(kind, block, MT, RT, swiglu, accumulate, scales)
    NSV = _scale_slots(kind, MT, swiglu)

    @device_function
    def stage_load(c, tid, xv, xc, wv, wuv, z, col0, N, K, xrows, wst, xst0, xst1):
        """Chunk c's weight words (unless ``ASYNC``) and activation quads of this thread, global ->
        registers (``xrows``: the activation row of each quad, -1 past the tile's rows)."""
        for i in range(0 if ASYNC else NWW):
            idx = tid + i * NT
            v = uint64(0)
            if idx < S * BF * Q:
                s = idx // (BF * Q)
                rem = idx - s * BF * Q
                n = col0 + rem // Q
                k = c * KCH + 4 * (rem % Q)
                if n < N and k < K:
                    if INT4:
                        wd = uint32(wuv[z, n, k // 8] if s == 1 else wv[z, n, k // 8])
                        v = uint64((wd >> uint32(16 * ((k % 8) // 4))) & uint32(0xFFFF))
                    elif FP8:
                        v = uint64(wuv[z, n, k // 4] if s == 1 else wv[z, n, k // 4])
                    else:
                        v = wuv[z, n, k // 4] if s == 1 else wv[z, n, k // 4]
            wst[i] = v
        for i in range(NXW):
            idx = tid + i * NT
            u0 = uint64(0)
            u1 = uint64(0)
            rx = xrows[i]
            k = c * KCH + 4 * (idx % Q)
            if rx >= 0 and k < K:             # unsigned indices: no wraparound or sign fix-ups
                u = uint64(rx)
                q = uint64(xc + k) >> uint64(1)
                u0 = xv[u, q]
                u1 = xv[u, q + uint64(1)]
            xst0[i] = u0
            xst1[i] = u1

    @device_function
    def stage_rows(tid, tile0, end, row_index, xrows):
        """The activation row of each of this thread's quads for the tile at tile0 (gathered
        through ``row_index``), -1 past its rows: read once a tile, not once a chunk."""
        for i in range(NXW):
            idx = tid + i * NT
            rx = -1
            if NXW * NT == BR * Q or idx < BR * Q:   # (the first test is constant)
                j = tile0 + idx // Q
                if j < end:
                    rx = j
                    if gather:
                        rx = row_index[j]
            xrows[i] = rx

    @device_function
    def stage_store(tid, wst, xst0, xst1, wsm, xsm, f):
        """The staged words, rounded (split) to bf16, registers -> shared memory."""
        for i in range(0 if ASYNC else NWW):
            idx = tid + i * NT
            if idx < S * BF * Q:
                s = idx // (BF * Q)
                rem = idx - s * BF * Q
                v = wst[i]
                if FP8:                       # four quantized values -> four bf16, exactly
                    b = uint32(v)
                    lo = pack_bf16x2(widen(b), widen(b >> uint32(UB)))
                    hi = pack_bf16x2(widen(b >> uint32(2 * UB)), widen(b >> uint32(3 * UB)))
                    v = uint64(lo) | (uint64(hi) << uint64(32))
                wsm[0, s, rem // Q, rem % Q] = v
        for i in range(NXW):
            idx = tid + i * NT
            if NXW * NT == BR * Q or idx < BR * Q:
                store_quad(xsm, 0, idx, xst0[i], xst1[i], f)

    @device_function
    def store_quad(xsm, b, idx, u0, u1, f):
        """Activation quad ``idx`` (four float32 in two words), rounded (split) to bf16, into
        buffer b."""
        _unpack_pairs(u0, u1, f)
        if XSPLIT:
            h0, l0 = _split_bf16x2(f[0], f[1])
            h1, l1 = _split_bf16x2(f[2], f[3])
            xsm[b, 0, idx // Q, idx % Q] = uint64(h0) | (uint64(h1) << uint64(32))
            xsm[b, 1, idx // Q, idx % Q] = uint64(l0) | (uint64(l1) << uint64(32))
        else:
            xsm[b, 0, idx // Q, idx % Q] = uint64(pack_bf16x2(f[0], f[1])) | (
                uint64(pack_bf16x2(f[2], f[3])) << uint64(32))

    @device_function
    def copy_x(c, slot, tid, xv, xc, K, xrows, xfs):
        """``XA``: issue this thread's cp.async pieces (activation quads, the ``stage_load``
        ones) of chunk c into float32 slot ``slot``; zeros past the tile's rows and K."""
        for i in range(NXW):
            idx = tid + i * NT
            if NXW * NT == BR * Q or idx < BR * Q:
                rx = xrows[i]
                k = c * KCH + 4 * (idx % Q)
                ok = rx >= 0 and k < K
                nbytes = uint32(16) if ok else uint32(0)
                u = uint64(rx) if ok else uint64(0)     # read nothing; keep the address inside
                q = uint64(xc + k) >> uint64(1) if ok else uint64(0)
                cp_async16(xfs, (uint64(slot), uint64(idx // Q), uint64(2 * (idx % Q))), xv, (u, q), nbytes)

    @device_function
    def convert_x(tid, slot, b, xfs, xsm, f):
        """``XA``: this thread's quads of float32 slot ``slot`` (its own copies, landed: no
        barrier needed to read them) -> bf16 buffer b."""
        for i in range(NXW):
            idx = tid + i * NT
            if NXW * NT == BR * Q or idx < BR * Q:
                r = idx // Q
                p = 2 * (idx % Q)
                store_quad(xsm, b, idx, xfs[slot, r, p], xfs[slot, r, p + 1], f)

    @device_function
    def copy_weights(c, slot, tid, wv, wuv, wsm, z, col0, N, K):
        """``ASYNC``: issue this thread's cp.async pieces of chunk c's weights into ring slot
        ``slot`` (zeros past N and K). Consecutive threads take consecutive 16-byte pieces of a
        row: a warp reads four rows of 128 bytes. Each matrix's pieces in their own unrolled loop,
        so the matrix a copy reads is known when compiling."""
        for s in range(S):
            for i in range(NWC):
                m = tid + i * NT
                if NWC * NT == BF * (Q // 2) or m < BF * (Q // 2):   # (the first test is constant)
                    r = m // (Q // 2)
                    piece = m % (Q // 2)
                    n = col0 + r
                    k = c * KCH + 8 * piece
                    ok = n < N and k < K
                    nbytes = uint32(16) if ok else uint32(0)
                    un = uint64(n) if ok else uint64(0)   # read nothing; keep the address inside
                    uk = uint64(k) >> uint64(2) if ok else uint64(0)
                    d = (uint64(slot), uint64(s), uint64(r), uint64(2 * piece))
                    if s == 1:
                        cp_async16(wsm, d, wuv, (uint64(z), un, uk), nbytes)
                    else:
                        cp_async16(wsm, d, wv, (uint64(z), un, uk), nbytes)

    @device_function
    def mma_chunk(wsm, slot, xsm, xb, wm, wn, g, t, acc, live):
        """The warp's chains of this chunk from shared memory (weight ring slot ``slot``) into acc
        (the register kernel's ``mma_chunk``, its fragments read from the staged tile, activation
        buffer xb). Only the
        first ``live`` row tiles of the warp hold rows: the others are left alone (their rows are
        never stored; the test is the same for the whole warp)."""
        for q in range(PS):
            acc[q] = float32(0.0)
        for st in range(STEPS):
            qk = _k_offset(st, t, PAIRED) // 4      # the word of the lane's four k
            for mt in range(MT):
                r0 = wm * 16 * MT + mt * 16 + g
                for s in range(S):
                    u = wsm[slot, s, r0, qk]
                    u8 = wsm[slot, s, r0 + 8, qk]
                    a0 = uint32(u & uint64(0xFFFFFFFF))
                    a2 = uint32(u >> uint64(32))
                    a1 = uint32(u8 & uint64(0xFFFFFFFF))
                    a3 = uint32(u8 >> uint64(32))
                    for rt in range(RT):
                        if rt >= live:
                            continue
                        xr = wn * 8 * RT + rt * 8 + g
                        ux = xsm[xb, 0, xr, qk]
                        q0 = (mt * RT + rt) * 4 * S + s
                        d = mma_bf16(a0, a1, a2, a3, uint32(ux & uint64(0xFFFFFFFF)), uint32(ux >> uint64(32)),
                                     acc[q0], acc[q0 + S], acc[q0 + 2 * S], acc[q0 + 3 * S])
                        if XSPLIT:
                            ul = xsm[xb, 1, xr, qk]
                            d = mma_bf16(a0, a1, a2, a3, uint32(ul & uint64(0xFFFFFFFF)), uint32(ul >> uint64(32)),
                                         d[0], d[1], d[2], d[3])
                        acc[q0] = d[0]
                        acc[q0 + S] = d[1]
                        acc[q0 + 2 * S] = d[2]
                        acc[q0 + 3 * S] = d[3]

    @cached
    @(cuda.jit if _SIM else cuda.jit(launch_bounds=(NT,)))
    def kernel(x, x_gs, w, w_up, sc, scu, out, o_gs, n_rows, items, row_index):
        grid_dependency_after((x, x_gs, w, w_up, sc, scu, out, o_gs, n_rows, items, row_index))   # PDL (_device.py)
        tid = nonneg(cuda.threadIdx.x)
        warp = tid // 32
        lane = tid % 32
        g = lane // 4
        t = lane % 4
        wm = warp % WM
        wn = warp // WM
        col0 = nonneg(cuda.blockIdx.x) * BF
        N = w.shape[1]
        K = w.shape[2] * 8 if INT4 else w.shape[2]   # int4: eight values a word
        C = (K + KCH - 1) // KCH
        z, first, end, step = _block_rows(items, n_rows, BR, grouped)
        xc = z * x_gs
        oc = z * o_gs
        if INT4:
            wv = w
            wuv = w_up
        elif FP8:
            wv = w.view(np.uint32)
            wuv = w_up.view(np.uint32)
        else:
            wv = w.view(np.uint64)
            wuv = w_up.view(np.uint64)
        xv = x.view(np.uint64)
        wsm = cuda.shared.array(WS_SHAPE, uint64, alignment=RING_ALIGN)
        xsm = cuda.shared.array(XS_SHAPE, uint64)
        xfs = cuda.shared.array(XF_SHAPE, uint64, alignment=RING_ALIGN)
        wst = cuda.local.array(NWW, uint64)
        xst0 = cuda.local.array(NXW, uint64)
        xst1 = cuda.local.array(NXW, uint64)
        xrows = cuda.local.array(NXW, int64)
        acc = cuda.local.array(PS, float32)
        ys = cuda.local.array(PS, float32)
        sv = cuda.local.array(NSV, float32)
        f = cuda.local.array(4, float32)
        for tile0 in range(first, end, step):
            for q in range(PS):
                ys[q] = float32(0.0)
            live = min(RT, max(0, (end - tile0 - wn * 8 * RT + 7) // 8))   # row tiles of this warp with rows
            if XA:                            # both operands in the ring: one barrier a chunk
                cuda.syncthreads()            # every warp is done with the previous tile's slots
                stage_rows(tid, tile0, end, row_index, xrows)
                for c in range(NS - 1):       # the ring's first NS - 1 chunks (a group each, empty past C)
                    if c < C:
                        copy_weights(c, c, tid, wv, wuv, wsm, z, col0, N, K)
                        copy_x(c, c, tid, xv, xc, K, xrows, xfs)
                    cp_async_commit()
                slot = 0
                fill = NS - 1
                for c in range(C):
                    wait_ring()               # this thread's pieces of chunk c have landed
                    xb = c & 1                # last read by chunk c - 2, before the last barrier
                    convert_x(tid, slot, xb, xfs, xsm, f)
                    cuda.syncthreads()        # chunk c is visible; every warp is past chunk c - 1
                    if c + NS - 1 < C:        # chunk c + NS - 1 into the slots chunk c - 1 left
                        copy_weights(c + NS - 1, fill, tid, wv, wuv, wsm, z, col0, N, K)
                        copy_x(c + NS - 1, fill, tid, xv, xc, K, xrows, xfs)
                    cp_async_commit()
                    fill = fill + 1 if fill + 1 < SLOTS else 0
                    load_scales(sv, sc, scu, z, col0 + wm * 16 * MT, N, c, C, g)
                    mma_chunk(wsm, slot, xsm, xb, wm, wn, g, t, acc, live)
                    add_chunk(ys, acc, sv)
                    slot = slot + 1 if slot + 1 < SLOTS else 0
            else:
                if ASYNC:
                    cuda.syncthreads()        # every warp is done with the previous tile's slots
                    for c in range(NS - 1):   # the ring's first NS - 1 chunks (a group each, empty past C)
                        if c < C:
                            copy_weights(c, c, tid, wv, wuv, wsm, z, col0, N, K)
                        cp_async_commit()
                stage_rows(tid, tile0, end, row_index, xrows)
                stage_load(0, tid, xv, xc, wv, wuv, z, col0, N, K, xrows, wst, xst0, xst1)
                slot = 0                      # the ring slot of chunk c, and of chunk c + NS - 1
                fill = NS - 1                 # (running counters: a modulo costs ~20 instructions)
                for c in range(C):
                    if ASYNC:
                        wait_ring()           # this thread's pieces of chunk c have landed
                    cuda.syncthreads()        # every warp is done reading the previous chunk
                    stage_store(tid, wst, xst0, xst1, wsm, xsm, f)
                    if ASYNC:                 # chunk c + NS - 1 into the slot chunk c - 1 left
                        if c + NS - 1 < C:
                            copy_weights(c + NS - 1, fill, tid, wv, wuv, wsm, z, col0, N, K)
                        cp_async_commit()
                        fill = fill + 1 if fill + 1 < SLOTS else 0
                    cuda.syncthreads()
                    load_scales(sv, sc, scu, z, col0 + wm * 16 * MT, N, c, C, g)
                    if c + 1 < C:             # the next chunk's loads fly while this one multiplies
                        stage_load(c + 1, tid, xv, xc, wv, wuv, z, col0, N, K, xrows, wst, xst0, xst1)
                    mma_chunk(wsm, slot, xsm, 0, wm, wn, g, t, acc, live)
                    add_chunk(ys, acc, sv)
                    slot = slot + 1 if slot + 1 < SLOTS else 0
            for p in range(P):                # the C fragment layout, as in the register kernel
                e = p % 4
                mt = p // (4 * RT)
                rt = (p // 4) % RT
                n = col0 + wm * 16 * MT + mt * 16 + g + 8 * (e // 2)
                j = tile0 + wn * 8 * RT + rt * 8 + 2 * t + e % 2
                if j < end and n < N:
                    store(out, j, n, oc, ys, p * S)

    return kernel


# -- choosing a tile ------------------------------------------------------------------------
# The GPU's rules: TILES, _WARPS_WANTED, _NW_MAX, _STAGED_ROWS, _STAGED_BLOCKS, _STAGED (below).
# tools/count_launches.py --gpu-tiles applies them in the simulator.
_GPU_RULES = (
    {"small": _Tile(1, 1, 4), "mid": _Tile(2, 2, 1), "large": _Tile(2, 4, 1), "staged": _Staged(4, 2, 2, 4)},
    132 * 8,    # warps to stream the weights (the H200 has 132 SMs; measured: more warps splitting
                # the chunks cost more in partial sums than they hide)
    16,
    64,
    132,        # a block an SM at least
    # 128 features x 64 rows (SwiGLU: 64 features of both matrices x 64 rows), 8 warps. Grouped
    # (expert) launches take the SwiGLU shape: the experts' down at 272 rows (a 512-row
    # workspace, 47 experts of ~35 rows) 375 -> 331 µs (tools/moe_stages.py --tiles). Grouped
    # SwiGLU (the experts' gate|up) takes the staged kernel only with a ring (``_EXPERT_RING``
    # below); without one ``_choose`` gives it ``_TALL_SWIGLU`` past ``_GROUPED_ONE_ROW_TILE``
    # typical rows.
    {False: _Staged(4, 2, 2, 4), True: _Staged(2, 4, 2, 2)},
)
if _SIM:
    # The simulator runs every thread as a Python thread and emulates each mma: one- and
    # two-warp blocks. They still cover several row and column tiles, chunk rounds split over
    # warps, several tiles a warp, and staged blocks of two warps either way.
    TILES = {"small": _Tile(1, 1, 1), "split": _Tile(1, 1, 2), "wide": _Tile(2, 2, 1),
             "staged": _Staged(2, 1, 1, 1), "staged_rows": _Staged(1, 2, 1, 2),
             "staged_ring": _Staged(1, 2, 1, 2, 3)}
    _WARPS_WANTED = 2
    _NW_MAX = 2
    _STAGED_ROWS = 24          # from this many rows (a group's) the staged kernel takes over
    _STAGED_BLOCKS = 1         # ... if its grid has at least this many blocks
    _STAGED = {False: _Staged(2, 1, 1, 1), True: _Staged(1, 2, 1, 2)}
else:
    TILES, _WARPS_WANTED, _NW_MAX, _STAGED_ROWS, _STAGED_BLOCKS, _STAGED = _GPU_RULES


# The staged kernel with its weights in a cp.async ring (``NS``; bf16 weights read in 16-byte
# pieces, K % 8 == 0), on a GPU: the experts' work items (16 rows, or 8 at few rows), and
# dense launches of at least _RING_ROWS rows over more than _SMALL_WEIGHTS weights. Measured on
# the H200 (tools/moe_stages.py --tiles / --shared-tiles, Moonlight's shapes, 0b218fc; the tile
# chosen before -> the ring, µs at 65 / 272 / 1040 rows): the routed experts' gate|up 242 -> 122,
# 545 -> 256, 1571 -> 769 and down 129 -> 80, 335 -> 181, 988 -> 567 at (4,1,1,2,2) (32-row items
# at (4,1,1,4,2): 155 / 284 / 780 and 96 / 169 / 455; 64-row items slower still); the shared
# experts (one dense SwiGLU, 2816 x 2048, and its down) gate|up 65 -> 29, 156 -> 67, 464 -> 229 and
# down 38 -> 29, 111 -> 70, 281 -> 164 at (4,2,1,2,2). The bits are every tile's. Expert launches
# of at most _FEW_ROWS typical rows take the ring in 8-row items (_FEW_EXPERT_RING; measured, 33a69d2
# and 69c74fd, the register kernel's few-row tile -> the ring, gate|up + down µs at 1 row: 36.1 +
# 13.2 -> 35.1 + 13.2 at (4,1,1,1,2), 32.4 + 13.4 at (2,1,1,1,2); at 17 rows (a 32-row workspace):
# 140.3 + 80.5 -> 105.2 + 57.3 at (4,1,1,1,2), 97.1 + 55.9 at (2,1,1,1,2); 16-row items 109.8 + 56.2,
# three or four slots 104.9 + 54.5-55.9, eight warps 308 + 60). Past _TALL_EXPERT_ROWS typical rows
# (a 2048-row workspace: a 1024-node verify, 16 trees of 65) in 32-row items (_TALL_EXPERT_RING;
# nineteenth session, 60a6a35, µs at 65 / 272 / 1040 live rows, gate|up and down, (4,1,1,2,2) ->
# (4,1,1,4,2): 122.0 -> 156.2 and 79.0 -> 95.5; 256.6 -> 282.1 and 182.0 -> 169.1; 774.1 -> 767.9
# and 573.9 -> 447.8: an expert's ~100 rows in 4 items rather than 7 read its weights 4 times).
_EXPERT_RING = _Staged(4, 1, 1, 2, 2)
_FEW_EXPERT_RING = _Staged(2, 1, 1, 1, 2)
_TALL_EXPERT_RING = _Staged(4, 1, 1, 4, 2)
_TALL_EXPERT_ROWS = 128
_DENSE_RING = _Staged(4, 2, 1, 2, 2)        # dense SwiGLU (the shared experts, a dense MLP)
_RING_ROWS = 33
# The other dense launches by their workspace's rows (a power of two: 128 holds a 65-row verify,
# 512 a 257-row one or 16 trees of 17), and launches of at least _WIDE_COLS outputs (lm_head) from
# _WIDE_RING_ROWS rows. Each block stages every chunk whatever its live rows, so the tile trades
# blocks (parallelism) for mma a staged chunk; what bounds a block is not settled (docs/NOTES.md
# "Next": not DRAM re-reads, issue slots or the prefetch depths). Measured on the H200
# (benchmarks/gemm.py --sweep --ring-only, 8840c53, µs at 17 / 65 / 272 / 1040 live rows, the
# tile chosen before -> this): q_proj 26.2 -> 20.6 (65), 58.9 -> 54.2 (272), 180.2 -> 144.4
# (1040); o_proj 23.2 -> 21.4, 56.2 -> 34.3, 124.1 -> 113.7; the shared experts' down 28.9 ->
# 26.3, 71.0 -> 43.5, 161.1 -> 147.0; lm_head 440.2 -> 216.0 (17: the register kernel before),
# 945.1 -> 522.6, 2867.1 -> 2026.5, 10501.9 -> 6856.1. The bits are every tile's. Past 128 rows the
# activations ride the ring too (XA; nineteenth session, 60a6a35, µs at 272 / 1040 live rows,
# q_proj, o_proj, shared down: (4,1,1,3,2) 54.3 / 34.8 / 42.8 -> (4,1,1,3,2,1) 52.1 / 33.1 / 42.1;
# (8,1,1,3,2) 144.1 / 114.0 / 146.1 -> (4,1,1,4,2,1) 142.9 / 101.8 / 129.3; the same tile with and
# without XA at 1040: 171.6 -> 152.9, 120.5 -> 105.5, 152.0 -> 139.0; at 65 rows no change).
_DENSE_RINGS = ((128, _Staged(4, 1, 1, 2, 2)), (512, _Staged(4, 1, 1, 3, 2, 1)), (None, _Staged(4, 1, 1, 4, 2, 1)))
_WIDE_COLS = 16384            # (lm_head; also DeepSeek-V3's q_b_proj, 24576 outputs: unmeasured)
_WIDE_RING_ROWS = 17
_WIDE_RINGS = ((32, _Staged(8, 1, 1, 3, 2)), (None, _Staged(4, 2, 1, 5, 2)))
# Per-group projections (MLA's query and output absorptions: 16 heads of 128 -> 512 and 512 ->
# 128) from _HEADS_RING_ROWS rows (a workspace's) take the ring: blocks of 64 features x 16 rows,
# x 32 rows past a 512-row workspace. Measured on the H200 (tools/few_row_probe.py --groups 16,
# 54d99ab / d7fec90, µs at 1 / 17 / 65 / 272 / 1040 live rows in workspaces of 1 / 32 / 128 / 512
# / 2048, the tile chosen before -> this): query absorption 3.6 -> 3.3, 7.0 -> 4.0, 10.2 -> 7.8,
# 27.6 -> 19.5, 94.9 -> 56.9 (16-row blocks: 71.9); output absorption 3.6 -> 5.6 (so not at one
# row), 5.7 -> 6.0, 12.9 -> 7.4, 24.6 -> 14.9, 62.9 -> 35.9 (44.5). Every other tile tried (staged
# 64 x 64 / 32 x 64 / 32 x 32 without a ring, the 8-feature-wide ring, five register tiles) was
# slower from 65 rows.
_HEADS_RINGS = ((512, _Staged(4, 1, 1, 2, 2)), (None, _Staged(4, 1, 1, 4, 2)))
_HEADS_RING_ROWS = 17


def _choose_staged(max_rows, n_cols, swiglu, n_groups, n_k=0, grouped=False, ring=False):
    """The staged kernel's tile when a group holds enough rows for shared tiles to pay and the
    launch has enough blocks to fill the GPU (its blocks do not split the chunks, so with few of
    them the register kernel, which does, is faster: measured on the H200); else None. ``ring``:
    the weights can be copied by cp.async (then, on a GPU, the ring tiles above); ``grouped``: an
    expert launch of work items (``max_rows`` its typical rows)."""
    if ring and not _SIM:
        if grouped:
            if max_rows <= _FEW_ROWS:
                return _FEW_EXPERT_RING
            return _EXPERT_RING if max_rows <= _TALL_EXPERT_ROWS else _TALL_EXPERT_RING
        if n_groups > 1 and not swiglu and max_rows >= _HEADS_RING_ROWS:
            return by_bound(_HEADS_RINGS, max_rows)
        if n_groups == 1 and n_cols * n_k > _SMALL_WEIGHTS:
            if not swiglu and n_cols >= _WIDE_COLS and max_rows >= _WIDE_RING_ROWS:
                return by_bound(_WIDE_RINGS, max_rows)
            if max_rows >= _RING_ROWS:
                return _DENSE_RING if swiglu else by_bound(_DENSE_RINGS, max_rows)
    if swiglu and n_groups > 1:
        return None                           # experts' gate|up: the register kernel (_TALL_SWIGLU)
    tile = _STAGED[swiglu or n_groups > 1]    # SwiGLU, groups (experts' down, heads): 64 x 64 blocks
    blocks = ceil_div(n_cols, 16 * tile.MT * tile.WM) * ceil_div(max_rows, 8 * tile.RT * tile.WN) * n_groups
    return tile if max_rows >= _STAGED_ROWS and blocks >= _STAGED_BLOCKS else None


_SMALL_WEIGHTS = 1 << 20      # a launch over at most this many weights (per group) is latency-bound
# a workspace's rows (a power of two): 128 holds budget 64's 65-row verify, 256 a batch of 8
# budget-16 trees (136 rows), 512 a batch of 16 (272). H100: the demo's batched ddtree round of 8
# at 128: 1,185 µs, at 256: 1,055 µs (tools/batch_gap.py; the verify's GEMMs 12.4-17.3 -> ~5 µs
# a launch); at batch 16, ddtree 26,099 tokens/s at 256, 27,290 at 512 (`sweep --batch 16`)
_SMALL_ROWS = 512
# Grouped (expert) launches whose groups typically hold up to this many rows take one row tile a
# warp. Measured on the H200 (tools/moe_stages.py --tiles, Moonlight's 64 experts of 1408 x 2048,
# a 65-row verify in a 128-row workspace, typical share 24 rows): gate|up 669 -> 345 µs with MT 2,
# RT 4 -> 1; down 209 -> 206 µs.
_GROUPED_ONE_ROW_TILE = 32
# Groups (experts; also the per-head absorption GEMMs of MLA, Z = heads, measured only as part of
# the verify forward at 5cec055) of at most this many typical rows are a GEMV each: one row tile, at least
# _FEW_ROWS_WARPS warps splitting the chunks, and two m tiles unless SwiGLU (whose two matrices
# at two m tiles use 254 registers). Measured on the H200 (tools/moe_stages.py --tiles, Moonlight's
# experts; chosen -> this): down at 1 row 37.7 -> 26.9 µs, at 17 rows 150 -> 104 µs; gate|up at
# 1 row 46.5 -> 45.2 µs.
_FEW_ROWS = 8
_FEW_ROWS_WARPS = 4
# A launch of at most this many outputs (the router: 64 experts) has too few column blocks to
# stream its weights: one m tile and one row tile a warp, and as many warps splitting the chunks
# as there are chunks, up to _NW_MAX. Measured on the H200 (the fp32 router, 64 x 2048): 23.1 ->
# 11.5 µs at 1 row, 23.8 -> 11.9 at 17, 24.0 -> 12.2 at 65, 37.7 -> 22.9 at 272.
_NARROW_COLS = 64
# Expert groups (SwiGLU, grouped) of more typical rows than _GROUPED_ONE_ROW_TILE take two m
# tiles and two row tiles a warp, in the register kernel: the staged kernel's 64 x 64 blocks
# compute mostly padding there. Measured on the H200 (tools/moe_stages.py --tiles, Moonlight's
# experts, 272 rows: typical share 52): gate|up 830 µs (staged 2,4,2,2) -> 590 µs (2,2,1). The
# down takes the same tile (``moe._expert_tiles``): its work items are this tile's 16 rows, and
# staged over them it computes mostly padding (667 µs; 358 µs at 2,2,1).
_TALL_SWIGLU = _Tile(2, 2, 1)
# A SwiGLU register tile of four row tiles takes one m tile (two spill 370-730 bytes a thread:
# ptxas -v), and at least two warps. Measured on the H200 (the shared experts, 2816 x 2048;
# tools/moe_stages.py --shared-tiles): gate|up at 17 rows (a 32-row workspace) 41.0 -> 23.7 µs,
# at 65 rows (128) 99.1 -> 51.8 µs.


@functools.lru_cache(maxsize=None)
def _choose(max_rows, n_cols, n_k, swiglu, n_groups, kind="bf16"):
    """The tile for a launch of ``n_groups`` live groups holding at most ``max_rows`` rows of
    ``n_cols`` outputs over ``n_k`` inputs: row tiles as tall as the rows need (up to 32; one for
    expert groups of up to ``_GROUPED_ONE_ROW_TILE`` rows), two m tiles a warp (one for SwiGLU
    expert groups of up to ``_FEW_ROWS`` rows, and for narrow launches), then as many warps
    splitting the chunks as it takes to put about ``_WARPS_WANTED`` warps to work (no more than
    the chunks, and shared memory allows; at least ``_FEW_ROWS_WARPS`` for expert groups of few
    rows, all it can for narrow launches). A SwiGLU tile of four row tiles takes one m tile and at
    least two warps (two m tiles spill). Grouped SwiGLU (the experts' gate|up) of more than
    ``_GROUPED_ONE_ROW_TILE`` rows (neither small nor narrow) takes ``_TALL_SWIGLU`` as it is
    (``_choose_staged`` gives grouped SwiGLU the staged kernel only with a cp.async ring, which
    ``_plan`` asks it first). Measured on the H200
    (benchmarks/gemm.py --sweep, tools/moe_stages.py --tiles).

    A small launch (at most ``_SMALL_ROWS`` rows over at most ``_SMALL_WEIGHTS`` weights a group,
    as in the demo pair) is latency-bound, not bandwidth-bound: there one m tile and one row tile
    a warp and up to four warps splitting the chunks, so that many short warps run side by side
    (tools/tune_tiles.py on the H200: 17 rows, K 256 -> N 768, 5.4 -> 3.9 µs; K 768 -> N 256,
    8.6 -> 7.2 µs; one row, 3.9 -> 3.4 µs; 65 live rows in a 128-row workspace, every demo shape,
    5.6 -> 3.3-4.5 µs, and 9.0 -> 6.5 µs at K 768 -> N 256)."""
    small = max_rows <= _SMALL_ROWS and n_cols * n_k <= _SMALL_WEIGHTS and not _SIM
    narrow = n_cols <= _NARROW_COLS and not _SIM
    few = n_groups > 1 and max_rows <= _FEW_ROWS
    nw_min = 1
    if narrow:
        rt, mt, nw_max = 1, 1, _NW_MAX
    elif small:
        rt, mt, nw_max = 1, 1, 4
    else:
        rt = 1 if max_rows <= 8 else 2 if max_rows <= 16 else 4
        if n_groups > 1 and max_rows <= _GROUPED_ONE_ROW_TILE:
            rt = 1            # expert groups of a few rows: more, lighter warps stream the weights
        mt = 2                # two m tiles: each activation load feeds two mma
        nw_max = _NW_MAX
        # (the simulator takes the m tiles but not the extra warps: each split of the chunks
        # costs it a block-wide barrier per round, minutes over the suite)
        if few:
            mt, nw_min = (1 if swiglu else 2), (1 if _SIM else _FEW_ROWS_WARPS)
        elif swiglu and n_groups > 1 and max_rows > _GROUPED_ONE_ROW_TILE:
            return _TALL_SWIGLU
        elif swiglu and rt == 4:
            mt, nw_min = 1, (1 if _SIM else 2)  # two matrices at 2 x 4 tiles spill registers (above)
    chunks = max(1, ceil_div(n_k, KC))
    blocks = ceil_div(n_cols, 16 * mt) * ceil_div(max_rows, 8 * rt) * n_groups
    nw = 1
    while (nw * 2 <= min(nw_max, chunks) and (small or narrow or nw < nw_min or blocks * nw * 2 <= _WARPS_WANTED)
           and _smem(_Tile(mt, rt, nw * 2), swiglu, kind) <= _SMEM_MAX):
        nw *= 2
    return _Tile(mt, rt, nw)


def _address(a) -> int:
    """A device array's address; 0 for the simulator's, which have none (so count as aligned)."""
    iface = getattr(a, "__cuda_array_interface__", None)
    return 0 if iface is None else iface["data"][0]


def _vec_ok(w, word=8) -> bool:
    """Word loads of a lane's weights (``word`` bytes: a uint64 of four bf16 or eight float8, a
    uint32 of four float8): every row of w [Z, N, K] starts aligned to the word."""
    if w.shape[2] == 0 or (w.shape[2] * np.dtype(w.dtype).itemsize) % word:
        return False
    return _address(w) % word == 0


def _x_pieces_ok(x, x_gs, piece) -> bool:
    """float32 activations read in ``piece``-byte pieces: 8, a lane's float32 pairs (the kernels'
    word loads), or 16, cp.async's copies (``_Staged.XA``). Every row and group offset starts on a
    piece, and the array is aligned to one."""
    floats = piece // 4
    if np.dtype(x.dtype) != np.float32 or x.shape[1] % floats or x_gs % floats or x.strides[0] % piece:
        return False
    return _address(x) % piece == 0


_Plan = namedtuple("_Plan", "tile kind block scales w w_up scale scale_up vec xvec")


def _plan(x, x_gs, w, w_up, max_rows, precision, tile=None, tile_rows=None, live_groups=None, grouped=False):
    """What a launch multiplies and with which tile (``_Plan``): the weights' storage (a quantized
    matrix unwrapped into its data and scales), whether words can be read, and ``tile`` (a
    ``_Tile`` or ``_Staged``), or None to choose it from the rows (``tile_rows`` if given, else
    ``max_rows``) and the groups that hold any (``live_groups``, default all); ``grouped``: a launch
    of expert work items. A ring tile (``NS``) whose weights cannot be copied in 16-byte pieces, or
    whose ring does not fit shared memory, loses its ring (a shorter one, else NS 0)."""
    kind = _weight_kind(w)
    swiglu = w_up is not None
    block, scale, scale_up = (0, 0), None, None   # None: no scales (the launch passes stand-ins)
    scales = "f32"
    if kind in SCALED_KINDS:
        if swiglu and (_weight_kind(w_up) != kind or tuple(w_up.shape) != tuple(w.shape)):
            raise ValueError(f"a SwiGLU pair must be two matrices of one format and shape, got {kind} "
                             f"{list(w.shape)} and {_weight_kind(w_up)} {list(w_up.shape)}")
        if not fp8_block_supported(w.block) or (swiglu and w_up.block != w.block):
            raise ValueError(f"quantized weights in blocks {w.block} (and {w_up.block if swiglu else w.block}): "
                             "the GEMMs take one block size whose input side is a multiple of 16")
        if kind == "int4" and w.in_features % 8:
            raise ValueError(f"int4 weights with {w.in_features} inputs: the GEMMs take a multiple of 8 (whole words)")
        if swiglu and np.dtype(w_up.scale.dtype) != np.dtype(w.scale.dtype):
            raise ValueError(f"a SwiGLU pair's scales must share a dtype, got {np.dtype(w.scale.dtype)} and "
                             f"{np.dtype(w_up.scale.dtype)}")
        block, scale = w.block, w.scale
        scale_up = w_up.scale if swiglu else scale
        scales = KINDS[np.dtype(scale.dtype)]
        w = w.data
        w_up = w_up.data if swiglu else None
    word = 4 if kind == "e4m3" and not _paired(kind, block) else 8
    vec = kind == "int4" or (kind in ("bf16", "e4m3") and _vec_ok(w, word) and (not swiglu or _vec_ok(w_up, word)))
    n_k = w.shape[2] * 8 if kind == "int4" else w.shape[2]
    xvec = n_k % 4 == 0 and _x_pieces_ok(x, x_gs, 8)   # a lane's four k all in range or all out
    Z, N = w.shape[0], w.shape[1]
    check_precision(precision)
    rows = min(max_rows, tile_rows or max_rows)
    groups = min(Z, live_groups or Z)
    ring = kind == "bf16" and n_k % 8 == 0 and _vec_ok(w, 16) and (not swiglu or _vec_ok(w_up, 16))
    if tile is None:
        tile = _choose_staged(rows, N, swiglu, groups, n_k, grouped, ring) if vec and xvec else None
        if isinstance(tile, _Staged) and tile.XA and _staged_smem(tile, swiglu, precision, kind, block) > _SMEM_MAX:
            tile = tile._replace(XA=0)        # fp32's two planes (unaligned activations: the check below)
        if tile == _TALL_EXPERT_RING and _staged_smem(tile, swiglu, precision, kind, block) > _SMEM_MAX:
            tile = _EXPERT_RING               # fp32's SwiGLU experts: the 16-row items still fit
        if isinstance(tile, _Staged) and tile.NS and _staged_smem(tile, swiglu, precision, kind, block) > _SMEM_MAX:
            # a ring that does not fit (fp32 activations take two shared planes): the rule without it
            tile = _choose_staged(rows, N, swiglu, groups, n_k, grouped, False)
    elif isinstance(tile, _Staged) and not (vec and xvec):
        tile = None                           # the staged kernel reads words only: the register one
    if tile is None:
        tile = _choose(rows, N, n_k, swiglu, groups, kind)
    if not isinstance(tile, _Staged) and _smem(tile, swiglu, kind) > _SMEM_MAX:
        tile = _choose(rows, N, n_k, swiglu, groups, kind)   # a forced tile too big
    if isinstance(tile, _Staged) and tile.NS and not ring:
        tile = tile._replace(NS=0)            # cp.async copies 16-byte pieces of bf16 rows
    if isinstance(tile, _Staged) and tile.NS and not 2 <= tile.NS <= _NS_MAX:
        tile = tile._replace(NS=0 if tile.NS < 2 else _NS_MAX)   # a forced ring of 1 slot is none
    if isinstance(tile, _Staged) and tile.XA and not (tile.NS and _x_pieces_ok(x, x_gs, 16)):
        tile = tile._replace(XA=0)            # the activations ride the ring in 16-byte pieces
    while isinstance(tile, _Staged) and tile.NS and _staged_smem(tile, swiglu, precision, kind, block) > _SMEM_MAX:
        # fp32 activations take twice the shared rows: activations out of the ring, a shorter
        # ring, else none
        tile = tile._replace(XA=0) if tile.XA else tile._replace(NS=tile.NS - 1 if tile.NS > 2 else 0)
    if isinstance(tile, _Staged) and _staged_smem(tile, swiglu, precision, kind, block) > _SMEM_MAX:
        tile = _STAGED[swiglu]                # a forced tile too big for this launch: a default one
    return _Plan(tile, kind, block, scales, w, w_up, scale, scale_up, vec, xvec)


def _rows_a_tile(tile):
    """The rows one block of ``tile`` multiplies at once (a ``_Tile``'s warp, a ``_Staged`` block)."""
    return 8 * tile.RT * (tile.WN if isinstance(tile, _Staged) else 1)


def _launch(x, x_gs, w, w_up, out, o_gs, n_rows, items, row_index, max_rows, accumulate, precision,
            stream, tile=None, tile_rows=None, live_groups=None, norm=None, head=None):
    """Every GEMM of the module, tiled by ``_plan``. Grouped (``items`` given, [3 * Y] int32):
    a row of blocks a work item, Y rows. ``norm`` = (weight [K] float32, eps, scratch [R, K]
    float32): the GEMM of the rows' RMSNorm, launched as ``enqueue_rms_norm`` into scratch and
    the GEMM over scratch. With ``head`` [H, K] float32 only rows below H are normed, head's,
    into x[:H] (scratch unused); the rest are taken from x as they are.

    (The norm was once folded into the register kernel's activation loads, one launch fewer; the
    folded kernel needed ~255 registers against ~120 and ran ~2x slower, which cost the demo
    pair's round ~11 % on an H100: docs/PERFORMANCE.md, twenty-sixth session.)"""
    if norm is not None:
        norm_w, eps, scratch = norm
        if head is not None:                  # head's norms into x's first rows, x read whole
            enqueue_rms_norm(head, norm_w, eps, x[:head.shape[0]], n_rows, stream=stream)
            scratch = x
        else:
            enqueue_rms_norm(x, norm_w, eps, scratch, n_rows, stream=stream)
        x = scratch
    grouped, gather = items is not None, row_index is not None
    swiglu = w_up is not None
    plan = _plan(x, x_gs, w, w_up, max_rows, precision, tile, tile_rows, live_groups, grouped)
    tile, kind, block, scales, w, w_up = plan.tile, plan.kind, plan.block, plan.scales, plan.w, plan.w_up
    Z, N = w.shape[0], w.shape[1]
    row_blocks = items.shape[0] // 3 if grouped else max(1, ceil_div(max_rows, _rows_a_tile(tile)))
    if isinstance(tile, _Staged):
        kernel = _staged_kernel(kind, swiglu, accumulate, grouped, gather, precision, *tile, block=block,
                                scales=scales)
        cols = ceil_div(N, 16 * tile.MT * tile.WM)
        threads = 32 * tile.WM * tile.WN
    else:
        kernel = _mma_kernel(kind, swiglu, accumulate, grouped, gather, plan.vec, plan.xvec, precision, *tile,
                             block=block, scales=scales, xraw=_X_RAW and plan.xvec)
        cols = ceil_div(N, 16 * tile.MT)
        threads = 32 * tile.NW
    grid = (cols, row_blocks, 1 if grouped else Z)
    if cols == 0 or Z == 0 or row_blocks == 0:
        return
    if max(grid[1:]) > _GRID_Y_MAX:
        raise ValueError(f"a GEMM of {row_blocks} {'work items' if grouped else 'row tiles'} and {grid[2]} groups: "
                         f"CUDA grids hold at most {_GRID_Y_MAX} blocks in y and z (fewer rows a launch)")
    idx = n_rows if n_rows is not None else items   # stands in for the unused int32 arrays
    scale = out if plan.scale is None else plan.scale
    scale_up = out if plan.scale_up is None else plan.scale_up
    kernel[grid, threads, stream](x, x_gs, w, w if w_up is None else w_up, scale, scale_up, out, o_gs,
                                  idx if n_rows is None else n_rows,
                                  idx if items is None else items,
                                  idx if row_index is None else row_index)


# -- the device tier (device arrays only, no checks, no allocation; docs/DESIGN.md §3) ----------
# Every array is C-contiguous and 2-D except the weights ([N, K] or [Z, N, K]). ``precision``:
# one of ``PRECISIONS`` (the caller's choice: no default at this tier). ``tile``: None chooses it
# from the rows (``_choose``), as a forward does; a ``TILES`` entry forces one for every launch
# (the same bits by the contract; the simulator's whole-forward tests take the smallest).

def enqueue_linear(x, w, out, n_rows, *, precision, accumulate=False, tile=None, norm=None, norm_head=None,
                   stream=0):
    """out[:n] (+)= x[:n] @ w.T for n = n_rows[0]; twin: ``reference.linear.enqueue_linear`` (over
    ``reference.linear.linear``).

    x [R, K] f32, w [N, K] (f32 / f16 / uint16 bf16 bits), out [R, N] f32, n_rows [>=1] int32
    device; the grid is sized for R rows. ``norm`` = (weight [K] f32, eps, scratch [R, K] f32):
    the product of the rows' RMSNorm instead, rms_norm(x[:n]) @ w.T: ``rms_norm.enqueue_rms_norm``
    into scratch (written), then this GEMM over scratch. ``norm_head`` [H, K] f32 (with ``norm``;
    H <= n): only the first H rows are normed, and they are norm_head's: the product of
    [rms_norm(norm_head); x[H:n]], by ``enqueue_rms_norm`` of norm_head into x[:H] (written;
    scratch unused), then this GEMM over x."""
    _launch(x, 0, w.reshape(1, *w.shape), None, out, 0, n_rows, None, None, x.shape[0],
            accumulate, precision, stream, tile, norm=norm, head=norm_head)


def enqueue_linear_heads(x, x_group_stride, w, out, n_rows, *, precision, tile=None, stream=0):
    """Per-group projection; twin: ``reference.linear.enqueue_linear_heads`` (``reference.linear.linear``
    of each group).

    For r < n_rows[0] and each group z of w [Z, N, K]: out[r, z*N : (z+1)*N] = x[r, z*s : z*s + K]
    @ w[z].T with s = ``x_group_stride``. x [R, >= Z*s] f32, out [R, Z*N] f32 (e.g. the per-head
    query absorption of MLA)."""
    _launch(x, x_group_stride, w, None, out, w.shape[1], n_rows, None, None, x.shape[0],
            False, precision, stream, tile)


def _enqueue_swiglu(x, w_gate, w_up, out, n_rows, *, precision, tile=None, norm=None, stream=0):
    """out[r] = silu(x[r] @ w_gate.T) * (x[r] @ w_up.T) for r < n_rows[0]; twin: the activation of
    ``reference.moe.swiglu_mlp``.

    x [R, K] f32, w_gate / w_up [I, K], out [R, I] f32; ``norm`` as in ``enqueue_linear``."""
    _launch(x, 0, w_gate.reshape(1, *w_gate.shape), w_up.reshape(1, *w_up.shape), out, 0,
            n_rows, None, None, x.shape[0], False, precision, stream, tile, norm=norm)


def _enqueue_grouped_linear(x, w, out, items, max_rows, *, precision, row_index=None, w_up=None,
                            tile_rows=None, live_groups=None, tile=None, stream=0):
    """Grouped (expert) projection; twin: the per-expert GEMMs of ``reference.moe.moe_experts``.

    For each work item y of ``items`` [3 * Y] int32, (z, first, end) at 3y (``_enqueue_moe_sort``
    writes them; twin ``reference.moe.expert_work_items``; (0, 0, 0) is an empty one), rows j in
    [first, end): out[j] = f(x[row_index[j] if row_index is not None else j] @ w[z].T), f =
    identity, or SwiGLU with ``w_up``. x [Rx, K] f32, w / w_up [Z, N, K], out [Ro, N] f32,
    row_index [Ro] int32. The grid has a row of blocks a work item, so no block is launched for an
    expert without rows. ``max_rows`` bounds the rows of one group, ``tile_rows`` is the rows a
    group typically holds (default max_rows): they pick the tile, as experts of a verify batch
    hold T*K/E rows on average, and a tile sized for the worst case T would compute mostly
    padding. ``live_groups``: how many groups hold rows at most (T*K for T tokens of K experts
    each), which sizes the split of the chunks over warps. The bits do not depend on the tile
    or the items (the contract)."""
    _launch(x, 0, w, w_up, out, 0, None, items, row_index, max_rows, False, precision, stream,
            tile, tile_rows=tile_rows, live_groups=live_groups)


def _grouped_tile(x, w, max_rows, *, precision, w_up=None, tile_rows=None, live_groups=None, tile=None):
    """The tile ``_enqueue_grouped_linear`` takes for these arguments (``tile`` if forced and it
    fits, else the chosen one); work items of ``_rows_a_tile`` of it give each block one tile of
    rows."""
    return _plan(x, 0, w, w_up, max_rows, precision, tile, tile_rows, live_groups, grouped=True).tile


# -- the public launcher (twin: reference.linear.linear) -------------------------------------

def linear(x, weight, *, precision="fp32", out=None, stream=0):
    """``y = x @ weight.T`` on the GPU's tensor cores under the reduction contract above.

    x [T, K] float32, weight [N, K] float32 / float16 / uint16 (bfloat16 bits), or a quantized
    matrix, ``dtypes.BlockScaled`` (float8) or ``dtypes.Int4Grouped`` (numpy or device arrays;
    scale blocks whose input side is a multiple of 16) -> y [T, N] float32. ``precision``: 'fp32' (faithful, the default here) or
    'bf16' (module docstring). numpy in, numpy out; device arrays in, device array out.
    """
    check_array("x", x, 2, np.float32)
    _weight_kind(weight, "weight")
    if isinstance(weight, QUANTIZED):
        if weight.ndim != 2:
            raise ValueError(f"weight must be one matrix, got shape {list(weight.shape)}")
        if isinstance(weight, BlockScaled) and not is_device(weight.data) and ((weight.data & 0x7F) == 0x7F).any():
            raise ValueError("weight holds float8 NaN bytes (0x7f / 0xff): e4m3fn has no NaN to compute with")
        if not fp8_block_supported(weight.block):
            raise ValueError(f"quantized weight blocks {weight.block}: the input side must be a multiple of 16")
        weight_dev = to_device(weight, stream)
    else:
        check_array("weight", weight, 2, weight.dtype)
        weight_dev = None
    check_precision(precision)
    t, k = x.shape
    if weight.shape[1] != k:
        raise ValueError(f"weight has {weight.shape[1]} input features but x has {k}")
    n = weight.shape[0]
    y = float32_out(out, (t, n), stream)
    if t and n:
        n_rows = rows_device(t, stream)
        enqueue_linear(to_device(x, stream), weight_dev or to_device(weight, stream), y, n_rows,
                       precision=precision, stream=stream)
    return launcher_result(y, out, x, stream)
