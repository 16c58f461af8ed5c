"""Projections on the GPU (every GEMM of the forward); twin: ``reference.linear.linear``.

Shapes: R rows (tokens or expert slots), K input features, N output features, Z groups
(heads of a per-head projection, or experts).

**The reduction contract (batch invariance, docs/DESIGN.md §4).** Every output is

    y[r, n] = (((P_0 + P_1) + P_2) + ... + P_{C-1}),   P_c = fma chain over k in chunk c,

with chunks of ``KC`` consecutive k, each chain starting from 0 in ascending k
(``acc = fma(x[r, k], w[n, k], acc)``) and the chunk partials added in ascending c. Nothing in
it depends on how many rows share the launch or how the launch is tiled, so a row's result is
bit-identical alone, in a batch, or as a tree node. Every kernel in this module must produce
exactly these bits; tile shapes may change with R, the order of arithmetic may not.

Weights are stored as float32, float16, or bfloat16 carried as uint16 bit patterns (numpy has
no bfloat16), and widened to float32 in registers (``_widen``). Activations are float32.

The device tier (``enqueue_*``) takes device arrays only, allocates nothing and reads the live
row count from a device array, so a captured CUDA graph can replay it for any row count.

**Two kernels, one set of bits.** Which one runs is chosen from the row count at enqueue time
(``_choose``); both follow the contract, so the choice never changes a bit.

- ``_tiled_kernel`` (many rows): a block owns a BM x BN output tile, each thread TM x TN of it
  and every chunk of its outputs in order (the running sum and the chunk's fma chain both live
  in registers). k advances in BK-wide tiles staged in shared memory (weights widened to f32
  when staged, since every staged weight feeds BM/TM threads), double-buffered, the next tile's
  global loads in flight while the current one is computed; every KC/BK tiles the chunk partial
  is flushed into the running sum.
- ``_skinny_kernel`` (1..32 rows, decode and verify): one tile of RB rows is too little work
  per weight to keep the GPU busy by output tiles alone, so the chunks of the reduction are
  spread over the NW warps of a block: warp w computes chunk partials g*NW + w for the block's
  RB x BN tile, stages them in shared memory, and after each round of NW chunks the block adds
  them into running sums in ascending chunk order. Each warp stages its own weight sub-tiles
  narrow (as stored) in shared memory; lanes widen them in registers (a staged weight feeds
  only RB/TM lanes).

Weights whose rows are 8-byte aligned (K * itemsize % 8 == 0, as in every real checkpoint)
are loaded as uint64 words (4 bf16/f16 or 2 f32 per load); otherwise element by element.
"""

from __future__ import annotations

import functools
import math
from collections import namedtuple

import numpy as np
from numba import config, cuda, float32, int64, uint32, uint64

from .._checks import check_array
from .._device import ceil_div, device_function, float32_out, fma, launcher_result, rows_device, to_device
from ._widen import ELEM as STORED, PER_WORD, WIDEN, WORD, hi_f32, lo_f32, _weight_kind

KC = 64                    # reduction chunk of the contract above (fixed forever: changing it changes bits)
_SIM = bool(config.ENABLE_CUDASIM)
_SMEM_MAX = 48 * 1024      # static shared memory per block

# Tile shapes. Skinny: RB rows x BN staged weight rows per warp, lanes LR x LC with LR = RB/TM,
# LC = 32/LR, BN = LC*TN; NW warps per block, SK k per staged sub-tile (KC % SK == 0).
# Tiled: BM x BN per block, TM x TN per thread, BK k per staged tile (KC % BK == 0).
# MB: blocks per SM to budget registers for (launch bounds; 0 leaves it to ptxas).
_Skinny = namedtuple("_Skinny", "RB TM TN NW SK GL MB")
_Tiled = namedtuple("_Tiled", "BM BN TM TN BK MB")


if _SIM:
    def _nonneg(i):
        return i
else:
    @device_function
    def _nonneg(i):
        """i (an int32 known >= 0, e.g. a thread index) as int64 through a zero extension, so
        the compiler drops the sign fix-ups of floor division and negative-index wraparound from
        every index built on it (they cost registers once hoisted)."""
        return int64(uint32(i))


@device_function
def _exp(v):
    return math.exp(v)


def _jit(threads, min_blocks):
    """cuda.jit, with launch bounds that cap registers so ``min_blocks`` blocks fit an SM."""
    if _SIM or not min_blocks:
        return cuda.jit
    return cuda.jit(launch_bounds=(threads, min_blocks))


if _SIM:
    # The simulator has no syncwarp; every warp sync below is reached by the whole block.
    @device_function
    def _sync_warp():
        cuda.syncthreads()
else:
    @device_function
    def _sync_warp():
        cuda.syncwarp()


# -- the skinny kernel: chunks spread over warps --------------------------------------------
def _skinny_shape(cfg, swiglu):
    """(LR, LC, BN, BNO, NG): lane grid of a group, staged weight rows, output columns per
    block, lane groups per block."""
    lr = cfg.RB // cfg.TM
    lc = cfg.GL // lr
    bn = lc * cfg.TN
    return lr, lc, bn, bn // 2 if swiglu else bn, cfg.NW * 32 // cfg.GL


def _skinny_xs(rb):
    """Row stride of the staged x sub-tile [SK][XS]: even for 8-byte pair loads, 2 mod 4 so a
    warp storing 32 consecutive k of one row hits 16+ banks."""
    if rb == 1:
        return 2
    return rb if rb % 4 == 2 else rb + 2


def _skinny_narrow(cfg):
    """Stage weights as stored (widened by the lane that reads them) when one lane reads each
    staged weight (LR == 1, memory-bound tiles): half the shared memory, twice the groups.
    Otherwise widen them once when staged, k-major, so the fma loop loads column pairs."""
    return cfg.RB == cfg.TM


def _skinny_smem(cfg, swiglu, kind):
    _, _, bn, _, ng = _skinny_shape(cfg, swiglu)
    xs = cfg.SK * _skinny_xs(cfg.RB) * 4 + cfg.RB * bn * 4
    if _skinny_narrow(cfg):
        isz = 4 if kind == "f32" else 2
        return ng * (bn * (cfg.SK + PER_WORD[kind]) * isz + xs)
    return ng * (cfg.SK * (bn + 2) * 4 + xs)


@functools.lru_cache(maxsize=None)
def _skinny_kernel(kind, swiglu, accumulate, grouped, gather, vec, RB, TM, TN, NW, SK, GL, MB=0):
    """Rows-few projection; same arguments and semantics as ``_tiled_kernel``.

    Block (32*NW threads, NG = 32*NW/GL groups of GL lanes) = BNO output columns (z,
    blockIdx.x) x row tiles of RB rows (blockIdx.y, grid-strided). Group g owns chunks
    round*NG + g. Lane (lr, lc) owns rows lr*TM + i of its group's chunk partial and staged
    columns: narrow staging (``_skinny_narrow``), lc + j*LC, with ``swiglu`` columns [0, BNO)
    gate and [BNO, BN) up; widened staging, lc (TN = 1) or 2*(lc + p*LC) + {0, 1}, with
    ``swiglu`` column s gate (s even) or up (s odd) of output s // 2.
    """
    LR, LC, BN, BNO, NG = _skinny_shape(_Skinny(RB, TM, TN, NW, SK, GL, MB), swiglu)
    E = PER_WORD[kind]
    SKW = SK // E                 # words per staged weight row
    NARROW = _skinny_narrow(_Skinny(RB, TM, TN, NW, SK, GL, MB))
    assert LR * LC == GL and KC % SK == 0 and (TN == 1 or TN % 2 == 0) and (not swiglu or TN % 2 == 0)
    assert (BN * SKW) % GL == 0 and (BN * SK) % GL == 0 and (RB * SK) % min(GL, SK) == 0
    WS = BN + 2                   # widened: staged k row stride (+2: conflict-free transposing stores)
    SKE = SK + E                  # narrow: staged weight row length, one pad word (bank spread)
    WPAIRS = TN % 2 == 0 and not NARROW   # widened weights read two columns at a time
    XS = _skinny_xs(RB)
    PAIRS = TM % 2 == 0           # x read from shared memory two rows at a time
    SUB = KC // SK
    NT = 32 * NW
    TMN = TM * TN
    WCOLS = SKW if vec else SK    # loads per staged weight row
    NWL = BN * WCOLS // GL        # weight loads per lane per sub-tile
    NXL = ceil_div(RB * SK, GL)   # x loads per lane per sub-tile (the last may be partial)
    OWN = ceil_div(RB * BNO, NT)  # outputs whose running sums a thread owns
    ELEM = STORED[kind]
    PW_T = uint64 if vec else ELEM
    widen = WIDEN[kind]
    word = WORD[kind]
    # A tile of ROWS x COLS loaded by GL lanes, load t of lane l: (row, col) =
    #   COLS >= GL: ((t*GL) // COLS, l + (t*GL) % COLS)       COLS < GL: (l // COLS + t*GL/COLS, l % COLS)
    # so every row and column offset is a per-lane base plus a constant (no per-t registers).
    WWIDE, XWIDE = WCOLS >= GL, SK >= GL

    @_jit(NT, MB)
    def kernel(x, x_gs, w, w_up, out, o_gs, n_rows, offsets, row_index):
        tid = _nonneg(cuda.threadIdx.x)
        grp = tid // GL
        lane = tid % GL
        lr = lane // LC
        lc = lane % LC
        wr0 = 0 if WWIDE else lane // WCOLS       # weight load: first row, column
        wc0 = lane if WWIDE else lane % WCOLS
        xr0 = 0 if XWIDE else lane // SK          # x load: first row, column
        xc0 = lane if XWIDE else lane % SK
        z = _nonneg(cuda.blockIdx.z)
        col0 = _nonneg(cuda.blockIdx.x) * BNO
        N = w.shape[1]
        K = w.shape[2]
        C = (K + KC - 1) // KC
        steps = ((C + NG - 1) // NG) * SUB            # same for every group: syncs stay uniform
        if grouped:
            start = offsets[z]
            end = offsets[z + 1]
        else:
            start = 0
            end = n_rows[0]
        xc = z * x_gs
        oc = z * o_gs + col0
        if vec:                       # a constant: numba prunes the other branch
            wv = w.view(np.uint64)
            wuv = w_up.view(np.uint64)
        else:
            wv = w
            wuv = w_up
        if NARROW:                    # a constant: numba prunes the other branch
            sw = cuda.shared.array((NG, BN, SKE), ELEM)   # weights as stored, row-major
            swv = sw.view(np.uint64)                      # [NG, BN, SKW + 1] words
        else:
            sw = cuda.shared.array((NG, SK, WS), float32) # weights widened, k-major
            swv = sw.view(np.uint64)                      # [NG, SK, WS // 2] column pairs
        sx = cuda.shared.array((NG, SK, XS), float32)
        sxv = sx.view(np.uint64)                          # [NG, SK, XS // 2] row pairs
        pbuf = cuda.shared.array((NG, RB, BN), float32)
        pw = cuda.local.array(NWL, PW_T)
        px = cuda.local.array(NXL, float32)
        acc = cuda.local.array(TMN, float32)
        xa = cuda.local.array(TM, float32)
        wb = cuda.local.array(TN, float32)
        ww = cuda.local.array(TN, uint64)
        ys = cuda.local.array(OWN, float32)
        yu = cuda.local.array(OWN, float32)
        for tile0 in range(start + cuda.blockIdx.y * RB, end, cuda.gridDim.y * RB):
            for q in range(OWN):
                ys[q] = float32(0.0)
                yu[q] = float32(0.0)
            for q in range(TMN):
                acc[q] = float32(0.0)
            for s in range(-1, steps):
                if s >= 0:
                    # stage sub-tile s (loaded into registers during step s - 1), widened
                    _sync_warp()                      # the group is done reading sub-tile s - 1
                    for t in range(NWL):
                        r = (t * GL) // WCOLS if WWIDE else wr0 + t * (GL // WCOLS)
                        cc = wc0 + (t * GL) % WCOLS if WWIDE else wc0
                        if NARROW:
                            if vec:
                                swv[grp, r, cc] = pw[t]
                            else:
                                sw[grp, r, cc] = pw[t]
                        elif vec:
                            for e in range(E):
                                sw[grp, cc * E + e, r] = word(pw[t], e)
                        else:
                            sw[grp, cc, r] = widen(pw[t])
                    for t in range(NXL):
                        r = (t * GL) // SK if XWIDE else xr0 + t * (GL // SK)
                        cc = xc0 + (t * GL) % SK if XWIDE else xc0
                        if r < RB:
                            sx[grp, cc, r] = px[t]
                    _sync_warp()
                if s + 1 < steps:
                    # global loads of sub-tile s + 1: in flight while sub-tile s is computed
                    g = (s + 1) // SUB
                    k0 = (g * NG + grp) * KC + ((s + 1) - g * SUB) * SK
                    for t in range(NWL):
                        r = (t * GL) // WCOLS if WWIDE else wr0 + t * (GL // WCOLS)
                        cc = wc0 + (t * GL) % WCOLS if WWIDE else wc0
                        if NARROW:
                            up = swiglu and r >= BNO
                            n = col0 + r - BNO if up else col0 + r
                        else:
                            up = swiglu and r % 2 == 1
                            n = col0 + r // 2 if swiglu else col0 + r
                        if vec:                       # one address: the matrix is a select
                            src = wuv if up else wv
                            val = uint64(0)
                            if n < N and k0 + cc * E < K:
                                val = src[z, n, k0 // E + cc]
                            pw[t] = val
                        else:
                            srce = w_up if up else w
                            ev = ELEM(0)
                            if n < N and k0 + cc < K:
                                ev = srce[z, n, k0 + cc]
                            pw[t] = ev
                    for t in range(NXL):
                        r = (t * GL) // SK if XWIDE else xr0 + t * (GL // SK)
                        cc = xc0 + (t * GL) % SK if XWIDE else xc0
                        j = tile0 + r
                        xv = float32(0.0)
                        if r < RB and j < end and k0 + cc < K:
                            rx = row_index[j] if gather else j
                            xv = x[rx, xc + k0 + cc]
                        px[t] = xv
                if s >= 0 and NARROW:
                    # the fma chains of this sub-tile, ascending k (zero padding leaves them exact)
                    for kw in range(SKW):
                        for jj in range(TN):
                            ww[jj] = swv[grp, lc + jj * LC, kw]
                        for e in range(E):
                            kk = kw * E + e
                            if PAIRS:
                                for p in range(TM // 2):
                                    u = sxv[grp, kk, (lr * TM) // 2 + p]
                                    xa[2 * p] = lo_f32(u)
                                    xa[2 * p + 1] = hi_f32(u)
                            else:
                                for i in range(TM):
                                    xa[i] = sx[grp, kk, lr * TM + i]
                            for jj in range(TN):
                                wn = word(ww[jj], e)
                                for i in range(TM):
                                    acc[i * TN + jj] = fma(xa[i], wn, acc[i * TN + jj])
                if s >= 0 and not NARROW:
                    for kk in range(SK):
                        if PAIRS:
                            for p in range(TM // 2):
                                u = sxv[grp, kk, (lr * TM) // 2 + p]
                                xa[2 * p] = lo_f32(u)
                                xa[2 * p + 1] = hi_f32(u)
                        else:
                            for i in range(TM):
                                xa[i] = sx[grp, kk, lr * TM + i]
                        if WPAIRS:
                            for p in range(TN // 2):
                                u = swv[grp, kk, lc + p * LC]
                                wb[2 * p] = lo_f32(u)
                                wb[2 * p + 1] = hi_f32(u)
                        else:
                            wb[0] = sw[grp, kk, lc]
                        for i in range(TM):
                            for jj in range(TN):
                                acc[i * TN + jj] = fma(xa[i], wb[jj], acc[i * TN + jj])
                if s >= 0:
                    g = s // SUB
                    if s - g * SUB == SUB - 1:
                        # chunk g*NG + grp is complete: hand its partial to the owners
                        for i in range(TM):
                            for jj in range(TN):
                                sc = 2 * (lc + (jj // 2) * LC) + jj % 2 if WPAIRS else lc + jj * LC
                                pbuf[grp, lr * TM + i, sc] = acc[i * TN + jj]
                                acc[i * TN + jj] = float32(0.0)
                        cuda.syncthreads()
                        live = min(NG, C - g * NG)
                        for q in range(OWN):
                            item = tid + q * NT
                            if item < RB * BNO:
                                r = item // BNO
                                o = item - r * BNO
                                for v in range(live):             # ascending chunk order
                                    if swiglu and NARROW:
                                        ys[q] = ys[q] + pbuf[v, r, o]
                                        yu[q] = yu[q] + pbuf[v, r, o + BNO]
                                    elif swiglu:
                                        ys[q] = ys[q] + pbuf[v, r, 2 * o]
                                        yu[q] = yu[q] + pbuf[v, r, 2 * o + 1]
                                    else:
                                        ys[q] = ys[q] + pbuf[v, r, o]
                        cuda.syncthreads()
            for q in range(OWN):
                item = tid + q * NT
                r = item // BNO
                o = item - r * BNO
                j = tile0 + r
                if item < RB * BNO and j < end and col0 + o < N:
                    yv = ys[q]
                    if swiglu:
                        yv = yv / (float32(1.0) + _exp(-yv)) * yu[q]
                    if accumulate:
                        out[j, oc + o] = out[j, oc + o] + yv
                    else:
                        out[j, oc + o] = yv

    return kernel


# -- the tiled kernel: output tiles, every chunk in one thread ----------------------------------
@functools.lru_cache(maxsize=None)
def _tiled_kernel(kind, swiglu, accumulate, grouped, gather, vec, BM, BN, TM, TN, BK, MB=0):
    """The generic projection, group z = blockIdx.z:

        out[j, zo*o_gs + n] (+)= sum_k x[rx, zx*x_gs + k] * w[z, n, k]     (zx = zo = z, or 0
                                                                             when the stride is 0)
    Rows of group z: without ``grouped``, j in [0, n_rows[0]) with x row rx = j; with
    ``grouped``, j in [offsets[z], offsets[z+1]) with rx = ``row_index[j]`` (``gather``) or j.
    ``swiglu``: out = silu(x . w) * (x . w_up), both chains under the contract.

    Block (BM/TM * BN/TN threads) = a BN-wide column block (blockIdx.x; BN/2 outputs with
    ``swiglu``, gate and up rows interleaved) x row tiles of BM (blockIdx.y, grid-strided).
    Thread (tr, tc) owns rows tr*TM + i and staged columns 2*(tc + p*LC) + {0, 1}.
    """
    LR, LC = BM // TM, BN // TN
    NT = LR * LC
    assert TM % 2 == 0 and TN % 2 == 0 and KC % BK == 0
    BNO = BN // 2 if swiglu else BN
    E = PER_WORD[kind]
    BKW = BK // E
    WS, XS = BN + 2, BM + 2       # shared row strides (+2: conflict-free transposing stores)
    TPC = KC // BK                # k tiles per chunk
    TMN, TH = TM * TN, TN // 2
    WCOLS = BKW if vec else BK    # loads per staged weight row
    assert NT % WCOLS == 0 and NT % BK == 0 and (BN * WCOLS) % NT == 0 and (BM * BK) % NT == 0
    NWL = BN * WCOLS // NT        # weight loads per thread per k tile: rows wr0 + q*WSTEP
    NXL = BM * BK // NT           # x loads per thread per k tile: rows xr0 + q*XSTEP
    WSTEP, XSTEP = NT // WCOLS, NT // BK
    ELEM = STORED[kind]
    PW_T = uint64 if vec else ELEM
    widen = WIDEN[kind]
    word = WORD[kind]

    @_jit(NT, MB)
    def kernel(x, x_gs, w, w_up, out, o_gs, n_rows, offsets, row_index):
        tid = _nonneg(cuda.threadIdx.x)
        tr = tid // LC
        tc = tid % LC
        wr0, wc0 = tid // WCOLS, tid % WCOLS
        xr0, xc0 = tid // BK, tid % BK
        z = _nonneg(cuda.blockIdx.z)
        col0 = _nonneg(cuda.blockIdx.x) * BNO
        N = w.shape[1]
        K = w.shape[2]
        nt = (K + BK - 1) // BK
        if grouped:
            start = offsets[z]
            end = offsets[z + 1]
        else:
            start = 0
            end = n_rows[0]
        xc = z * x_gs
        oc = z * o_gs + col0
        if vec:                       # a constant: numba prunes the other branch
            wv = w.view(np.uint64)
            wuv = w_up.view(np.uint64)
        else:
            wv = w
            wuv = w_up
        sw = cuda.shared.array((2, BK, WS), float32)
        sx = cuda.shared.array((2, BK, XS), float32)
        swv = sw.view(np.uint64)      # [2, BK, WS // 2] column pairs
        sxv = sx.view(np.uint64)      # [2, BK, XS // 2] row pairs
        pw = cuda.local.array(NWL, PW_T)
        px = cuda.local.array(NXL, float32)
        acc = cuda.local.array(TMN, float32)
        y = cuda.local.array(TMN, float32)
        xa = cuda.local.array(TM, float32)
        wb = cuda.local.array(TN, float32)
        for tile0 in range(start + cuda.blockIdx.y * BM, end, cuda.gridDim.y * BM):
            for q in range(TMN):
                acc[q] = float32(0.0)
                y[q] = float32(0.0)
            for t in range(-1, nt):
                buf = t % 2
                if t >= 0:
                    # stage k tile t, widened (its buffer was last read two tiles ago, before
                    # the previous barrier)
                    for q in range(NWL):
                        r = wr0 + q * WSTEP
                        if vec:
                            for e in range(E):
                                sw[buf, wc0 * E + e, r] = word(pw[q], e)
                        else:
                            sw[buf, wc0, r] = widen(pw[q])
                    for q in range(NXL):
                        sx[buf, xc0, xr0 + q * XSTEP] = px[q]
                    cuda.syncthreads()
                if t + 1 < nt:
                    k0 = (t + 1) * BK
                    for q in range(NWL):
                        r = wr0 + q * WSTEP
                        up = swiglu and r % 2 == 1
                        n = col0 + r // 2 if swiglu else col0 + r
                        if vec:                       # one address: the matrix is a select
                            src = wuv if up else wv
                            val = uint64(0)
                            if n < N and k0 + wc0 * E < K:
                                val = src[z, n, k0 // E + wc0]
                            pw[q] = val
                        else:
                            srce = w_up if up else w
                            ev = ELEM(0)
                            if n < N and k0 + wc0 < K:
                                ev = srce[z, n, k0 + wc0]
                            pw[q] = ev
                    for q in range(NXL):
                        j = tile0 + xr0 + q * XSTEP
                        xv = float32(0.0)
                        if j < end and k0 + xc0 < K:
                            rx = row_index[j] if gather else j
                            xv = x[rx, xc + k0 + xc0]
                        px[q] = xv
                if t >= 0:
                    for kk in range(BK):
                        for p in range(TM // 2):
                            u = sxv[buf, kk, (tr * TM) // 2 + p]
                            xa[2 * p] = lo_f32(u)
                            xa[2 * p + 1] = hi_f32(u)
                        for p in range(TH):
                            u = swv[buf, kk, tc + p * LC]
                            wb[2 * p] = lo_f32(u)
                            wb[2 * p + 1] = hi_f32(u)
                        for i in range(TM):
                            for jj in range(TN):
                                acc[i * TN + jj] = fma(xa[i], wb[jj], acc[i * TN + jj])
                    if (t + 1) % TPC == 0 or t + 1 == nt:
                        # a chunk ends here: flush its partial into the running sum
                        for q in range(TMN):
                            y[q] = y[q] + acc[q]
                            acc[q] = float32(0.0)
            cuda.syncthreads()        # the next row tile restages buffer 0
            for i in range(TM):
                j = tile0 + tr * TM + i
                if j < end:
                    for p in range(TH):
                        o = tc + p * LC
                        if swiglu:
                            if col0 + o < N:
                                yv = y[i * TN + 2 * p]
                                yv = yv / (float32(1.0) + _exp(-yv)) * y[i * TN + 2 * p + 1]
                                if accumulate:
                                    out[j, oc + o] = out[j, oc + o] + yv
                                else:
                                    out[j, oc + o] = yv
                        else:
                            for e in range(2):
                                o2 = 2 * o + e
                                if col0 + o2 < N:
                                    if accumulate:
                                        out[j, oc + o2] = out[j, oc + o2] + y[i * TN + 2 * p + e]
                                    else:
                                        out[j, oc + o2] = y[i * TN + 2 * p + e]

    return kernel


# -- choosing a kernel ----------------------------------------------------------------------
if _SIM:
    # Tiny tiles: the simulator runs every thread as a Python thread. They still cover several
    # row and column tiles, several chunks and sub-tiles, lane groups of 8..32, and both kernels.
    _SKINNY_TILE = {1: (1, 1), 2: (2, 1), 4: (2, 2), 8: (4, 2), 16: (4, 4), 32: (8, 4)}
    _SKINNY_SK = {1: 16, 2: 16, 4: 16, 8: 16, 16: 16, 32: 16}
    _SKINNY_NW = (2,)
    TILED = {"small": _Tiled(8, 8, 2, 2, 16, 0), "mid": _Tiled(8, 16, 2, 4, 16, 0),
             "large": _Tiled(16, 16, 4, 4, 16, 0)}
    _SKINNY_MAX = 4            # more rows than this: the tiled kernel, or skinny row tiles of
    _SKINNY_TILE_ROWS = 4      # this many when the tiled grid would have fewer than
    _TILED_BLOCKS = 3          # this many blocks
    _BLOCKS_WANTED = 3         # narrower lane groups until a launch has this many column blocks
else:
    # RB -> (TM, TN): lanes LR = RB/TM along rows, LC = GL/LR along staged weight rows.
    _SKINNY_TILE = {1: (1, 1), 2: (2, 1), 4: (4, 1), 8: (4, 2), 16: (4, 4), 32: (8, 4)}
    _SKINNY_SK = {1: 32, 2: 32, 4: 32, 8: 32, 16: 32, 32: 32}
    _SKINNY_NW = (16, 12, 8, 6, 4, 2, 1)
    TILED = {"small": _Tiled(64, 64, 8, 8, 16, 0), "mid": _Tiled(64, 128, 8, 8, 16, 0),
             "large": _Tiled(128, 128, 8, 8, 16, 0)}
    _SKINNY_MAX = 16
    _SKINNY_TILE_ROWS = 16
    _TILED_BLOCKS = 132        # one block per SM of the H200
    _BLOCKS_WANTED = 264       # two blocks per SM


def _skinny_valid(cfg, kind, swiglu) -> bool:
    lr = cfg.RB // cfg.TM
    if lr * cfg.TM != cfg.RB or cfg.GL % lr or cfg.GL > 32 or (cfg.TN > 1 and cfg.TN % 2) \
            or (swiglu and cfg.TN % 2):
        return False
    _, _, bn, _, _ = _skinny_shape(cfg, swiglu)
    skw = cfg.SK // PER_WORD[kind]
    return (KC % cfg.SK == 0 and (bn * skw) % cfg.GL == 0 and (bn * cfg.SK) % cfg.GL == 0
            and (cfg.RB * cfg.SK) % min(cfg.GL, cfg.SK) == 0 and _skinny_smem(cfg, swiglu, kind) <= _SMEM_MAX)


def _skinny_config(rb, kind, swiglu, n_cols=None, gl=None, nw=None, sk=None, mb=None, n_chunks=None):
    """The skinny tile for RB = rb rows: lane tile from the table; the widest lane group that
    still gives ``n_cols`` output columns _BLOCKS_WANTED column blocks (a group owns whole
    chunks, so narrower groups mean more, narrower column blocks; not below 16 lanes from 8
    rows on); the most warps that fit shared memory without more groups than ``n_chunks``."""
    tm, tn = _SKINNY_TILE[rb]
    if swiglu and tn % 2:
        tn += 1
    sk = sk or _SKINNY_SK[rb]
    found = None
    for g in ((gl,) if gl else (32, 16) if rb >= 8 else (32, 16, 8)):
        warps = (nw,) if nw else _SKINNY_NW
        if nw is None and n_chunks is not None:    # no more groups than chunks
            warps = [w for w in warps if w <= max(1, ceil_div(n_chunks * g, 32))] or [min(warps)]
        for w in warps:
            # narrow (memory-bound) tiles of 8+ warps: registers for two blocks an SM
            blocks = mb if mb is not None else (2 if w * 32 >= 256 and rb == tm else 0)
            cfg = _Skinny(rb, tm, tn, w, sk, g, blocks)
            if _skinny_valid(cfg, kind, swiglu):
                found = cfg
                if n_cols is None or ceil_div(n_cols, _skinny_shape(cfg, swiglu)[3]) >= _BLOCKS_WANTED:
                    return cfg
                break
    if found is None:
        raise ValueError(f"no skinny tile for {rb} rows of {kind} weights")
    return found


@functools.lru_cache(maxsize=None)
def _choose(max_rows, n_cols, n_k, kind, swiglu, grouped):
    """The tile for a launch whose groups hold at most ``max_rows`` rows of ``n_cols`` outputs
    over ``n_k`` inputs. Few rows: the skinny kernel. More: the tiled kernel, unless its grid
    would leave SMs idle (few columns), then skinny row tiles."""
    n_chunks = max(1, ceil_div(n_k, KC))
    if max_rows <= _SKINNY_MAX:
        rb = 1
        while rb < max_rows:
            rb *= 2
        # grouped launches have a column block per group: wide lane groups
        return _skinny_config(rb, kind, swiglu, None if grouped else n_cols, n_chunks=n_chunks)
    # (measured on the H200: 64x128 beats 128x128 and 64x64 from 64 to 256 rows)
    mid = TILED["mid"]
    blocks = ceil_div(n_cols, mid.BN // 2 if swiglu else mid.BN) * ceil_div(max_rows, mid.BM)
    if not grouped and blocks < _TILED_BLOCKS:
        return _skinny_config(_SKINNY_TILE_ROWS, kind, swiglu, n_chunks=n_chunks)
    return mid


def _vec_ok(w) -> bool:
    """uint64 weight loads: every row of w [Z, N, K] starts 8-byte aligned."""
    if w.shape[2] == 0 or (w.shape[2] * np.dtype(w.dtype).itemsize) % 8:
        return False
    if _SIM:
        return True
    return w.__cuda_array_interface__["data"][0] % 8 == 0


def _launch(x, x_gs, w, w_up, out, o_gs, n_rows, offsets, row_index, max_rows, accumulate, stream,
            cfg=None, tile_rows=None):
    """Every GEMM of the module: ``cfg`` is the tile (a ``TILED`` entry or a skinny config), or
    None to choose it from the rows (``_choose``)."""
    grouped, gather = offsets is not None, row_index is not None
    kind = _weight_kind(w)
    swiglu = w_up is not None
    vec = _vec_ok(w) and (not swiglu or _vec_ok(w_up))
    Z, N = w.shape[0], w.shape[1]
    if cfg is None:
        cfg = _choose(min(max_rows, tile_rows or max_rows), N, w.shape[2], kind, swiglu, grouped)
    if isinstance(cfg, _Skinny):
        kernel = _skinny_kernel(kind, swiglu, accumulate, grouped, gather, vec, *cfg)
        bno = _skinny_shape(cfg, swiglu)[3]
        rows, block = cfg.RB, 32 * cfg.NW
    else:
        kernel = _tiled_kernel(kind, swiglu, accumulate, grouped, gather, vec, *cfg)
        bno = cfg.BN // 2 if swiglu else cfg.BN
        rows, block = cfg.BM, (cfg.BM // cfg.TM) * (cfg.BN // cfg.TN)
    grid = (ceil_div(N, bno), max(1, ceil_div(max_rows, rows)), Z)
    if grid[0] == 0 or Z == 0:
        return
    idx = n_rows if n_rows is not None else offsets   # stands in for the unused int32 arrays
    kernel[grid, block, stream](x, x_gs, w, w if w_up is None else w_up, out, o_gs,
                                idx if n_rows is None else n_rows,
                                idx if offsets is None else offsets,
                                idx if row_index is None else row_index)


# -- the device tier (device arrays only, no checks, no allocation; docs/DESIGN.md §3) ----------
# Every array is C-contiguous and 2-D except the weights ([N, K] or [Z, N, K]). ``tile``: None
# chooses the tile from the rows (``_choose``), as a forward does; a ``TILED`` entry forces one
# for every launch (the same bits by the contract; the simulator's whole-forward tests take the
# smallest, the fewest Python threads).

def enqueue_linear(x, w, out, n_rows, *, accumulate=False, tile=None, stream=0):
    """out[:n] (+)= x[:n] @ w.T for n = n_rows[0]; twin: ``reference.linear.linear``.

    x [R, K] f32, w [N, K] (f32 / f16 / uint16 bf16 bits), out [R, N] f32, n_rows [>=1] int32
    device; the grid is sized for R rows."""
    _launch(x, 0, w.reshape(1, *w.shape), None, out, 0, n_rows, None, None, x.shape[0],
            accumulate, stream, tile)


def enqueue_linear_heads(x, x_group_stride, w, out, n_rows, *, tile=None, stream=0):
    """Per-group projection; twin: ``reference.linear.linear`` of each group.

    For r < n_rows[0] and each group z of w [Z, N, K]: out[r, z*N : (z+1)*N] = x[r, z*s : z*s + K]
    @ w[z].T with s = ``x_group_stride``. x [R, >= Z*s] f32, out [R, Z*N] f32 (e.g. the per-head
    query absorption of MLA)."""
    _launch(x, x_group_stride, w, None, out, w.shape[1], n_rows, None, None, x.shape[0],
            False, stream, tile)


def enqueue_swiglu(x, w_gate, w_up, out, n_rows, *, tile=None, stream=0):
    """out[r] = silu(x[r] @ w_gate.T) * (x[r] @ w_up.T) for r < n_rows[0]; twin: the activation of
    ``reference.moe.swiglu_mlp``.

    x [R, K] f32, w_gate / w_up [I, K], out [R, I] f32."""
    _launch(x, 0, w_gate.reshape(1, *w_gate.shape), w_up.reshape(1, *w_up.shape), out, 0,
            n_rows, None, None, x.shape[0], False, stream, tile)


def enqueue_grouped_linear(x, w, out, offsets, max_rows, *, row_index=None, w_up=None, tile_rows=None,
                           tile=None, stream=0):
    """Grouped (expert) projection; twin: the per-expert GEMMs of ``reference.moe.moe_experts``.

    For group z, rows j in [offsets[z], offsets[z+1]): out[j] = f(x[row_index[j] if row_index is
    not None else j] @ w[z].T), f = identity, or SwiGLU with ``w_up``. x [Rx, K] f32, w / w_up
    [Z, N, K], out [Ro, N] f32, offsets [Z+1] int32, row_index [Ro] int32; ``max_rows`` bounds the
    rows of one group (sizes the grid). ``tile_rows``: the rows a group typically holds, which
    picks the tile (default max_rows): experts of a verify batch hold T*K/E rows on average, and
    a tile sized for the worst case T would compute mostly padding. The bits do not depend on
    the tile (the contract)."""
    _launch(x, 0, w, w_up, out, 0, None, offsets, row_index, max_rows, False, stream,
            tile, tile_rows=tile_rows)


# -- the public launcher (twin: reference.linear.linear) -------------------------------------

def linear(x, weight, *, out=None, stream=0):
    """``y = x @ weight.T`` on the GPU under the reduction contract above.

    x [T, K] float32, weight [N, K] float32 / float16 / uint16 (bfloat16 bits) -> y [T, N]
    float32. numpy in, numpy out; device arrays in, device array out.
    """
    check_array("x", x, 2, np.float32)
    _weight_kind(weight)
    check_array("weight", weight, 2, weight.dtype)
    t, k = x.shape
    if weight.shape[1] != k:
        raise ValueError(f"weight has {weight.shape[1]} input features but x has {k}")
    n = weight.shape[0]
    y = float32_out(out, (t, n), stream)
    if t and n:
        n_rows = rows_device(t, stream)
        enqueue_linear(to_device(x, stream), to_device(weight, stream), y, n_rows, stream=stream)
    return launcher_result(y, out, x, stream)
