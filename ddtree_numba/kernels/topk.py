"""Top-K log-probabilities per draft depth on the GPU; twin: ``reference.topk.topk_logprobs``.

Shapes: L depths, V vocabulary, K kept tokens (K <= MAX_K), G slices a row (``_slices``: about one a
SLICE entries, G * K <= MERGE_KEYS).

Two launches, so that a row is read by G blocks at once instead of one (issue 15):

1. ``_topk_partial_kernel``, grid (G, L): block (b, row) takes slice b of the row. A first read
   finds the slice's max (a block reduction) while each thread keeps its few largest *composite
   keys* ``(ordered float bits << 32) | (2^32-1-id)`` (distinct, so ties in value go to the lower
   id for free). Groups of 32 kept keys rank themselves in shared memory; the least of the groups'
   q-th largest, tau, has at least k keys of the slice >= it. A second read sums exp(x - max) in
   float64 and writes every key >= tau as a candidate (no sort), with tau as the slice's bound. If
   more keys pass than the slice's slots (``_slice_slots``), a radix select finds the slice's exact
   k largest instead (8 bits a pass from the top digit down). All go to a ``TopKScratch``.
2. ``_topk_merge_kernel``, grid L (up to 1024 threads a block): the row's log-sum-exp from the
   slices' pairs (in slice order); the row's bound, the largest slice bound (the row's k-th key is
   >= each); the candidates >= it gathered and bitonic-sorted in shared memory (a radix select over
   all of them if more than ``MERGE_SORT``); the k best written out.

The float32 log-probabilities do not depend on the order of the float64 reduction unless the
log-sum-exp's last-ulp difference (about 1e-15; libdevice's exp / log against numpy's too) crosses a
float32 rounding midpoint, about 2^-28 a row: no mismatch in 300 full rows (307 k entries) emulated
at V = 163840, G = 16; every test compares bits.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numba import config, cuda, float32, float64, int32, int64, uint32, uint64

from .._checks import check_array, check_int, check_logits_values
from .._device import LINEINFO, cached, check_threads, device_function, is_device, to_device
from ._warp import FULL as _FULL, WARP_OPS, claim, hist_add

MAX_K = 1024       # shared-memory sort buffer; the tree build takes budgets up to 1024 too
THREADS = 32 if config.ENABLE_CUDASIM else 256   # threads a block: a GPU (1024 runs out of registers);
# the simulator runs each thread as a Python thread, so it takes a warp (the same steps)
_SIGN = 0x80000000
_LOW32 = 0xFFFFFFFF


@device_function
def _composite_key(bits, v):
    """Order-preserving uint64 key of (logit bits, token id): larger logit first, then lower id."""
    u = uint32(bits)
    if u == uint32(_SIGN):  # -0.0 sorts as +0.0, as numpy's comparison does
        u = uint32(0)
    if u & uint32(_SIGN):
        okey = ~u
    else:
        okey = u | uint32(_SIGN)
    return (uint64(okey) << uint64(32)) | uint64(uint32(_LOW32) - uint32(v))


@device_function
def _slice_of(idx, k, inv_k):
    """idx // k for 0 <= idx < 2^31 without a 64-bit integer division (about 70 instructions on a
    GPU): a float64 estimate, off by at most one, corrected."""
    b = int64(float64(idx) * inv_k)
    if b * k > idx:
        b -= 1
    elif (b + 1) * k <= idx:
        b += 1
    return b


@device_function
def _candidate(cand, cnt, row, idx, k, inv_k):
    """(present, key) of entry idx of a row of the merge's candidates: slice b = idx // k holds its
    first cnt[row, b] entries."""
    b = _slice_of(idx, k, inv_k)
    if idx - b * k < cnt[row, b]:
        return True, cand[row, idx]
    return False, uint64(0)


@functools.lru_cache(maxsize=None)
def _block_helpers(threads):
    """Device functions both top-K kernels share, for blocks of ``threads`` threads."""
    T = threads

    @device_function
    def clear(hist, t):
        for b in range(t, 256, T):
            hist[b] = 0

    @device_function
    def pick_digit(hist, suffix, chunk, sel, state, shift, need, desired, mask, t):
        """From a complete histogram of one digit: the bucket holding the ``need``-th largest
        key, published in sel (prefix and mask) and state (still needed; done when the whole
        bucket is needed). suffix[b] = keys in buckets >= b: 16 chunk sums, a serial suffix over
        the chunks, a serial suffix inside each chunk (3 barriers)."""
        for c in range(t, 16, T):
            acc = 0
            for b in range(16 * c, 16 * c + 16):
                acc += hist[b]
            chunk[c] = acc
        cuda.syncthreads()  # chunk sums are in
        if t == 0:
            acc = 0
            chunk[16] = 0
            for c in range(15, -1, -1):
                acc += chunk[c]
                chunk[c] = acc
            suffix[256] = 0
        cuda.syncthreads()  # chunk suffixes are in
        for c in range(t, 16, T):
            acc = chunk[c + 1]
            for b in range(16 * c + 15, 16 * c - 1, -1):
                acc += hist[b]
                suffix[b] = acc
        cuda.syncthreads()  # suffix sums are complete
        for b in range(t, 256, T):
            if suffix[b] >= need and suffix[b + 1] < need:  # the bucket holding the need-th key
                sel[0] = desired | (uint64(b) << uint64(shift))
                sel[1] = mask | (uint64(255) << uint64(shift))
                need_in_bucket = need - suffix[b + 1]
                state[0] = need_in_bucket
                if suffix[b] - suffix[b + 1] == need_in_bucket:
                    state[1] = 1  # the whole bucket is needed: the threshold is final
        cuda.syncthreads()  # selection for this digit is published

    @device_function
    def sort_desc(keys, p, t):
        """Bitonic sort of keys[:p] (p a power of two) in descending order."""
        size = 2
        while size <= p:
            half = size // 2
            while half > 0:
                for i in range(t, p // 2, T):
                    # the i-th pair: half is a power of two, so bit operations, not a division
                    lo = ((i & ~(half - 1)) << 1) | (i & (half - 1))
                    hi = lo + half
                    a = keys[lo]
                    b = keys[hi]
                    if (a < b) == ((lo & size) == 0):
                        keys[lo] = b
                        keys[hi] = a
                cuda.syncthreads()  # this compare-exchange stage is done
                half //= 2
            size *= 2

    return clear, pick_digit, sort_desc


FILTER_CAP = 2048  # shared slots of the keys the partial kernel's threads keep
MAX_KEEP = 8       # keys a thread keeps while it reads its part of the slice
GROUP = 32         # kept keys a group ranks among themselves for tau
MERGE_SORT = 4096  # shared slots of the merge: candidates above the row's bound, sorted there


def _keep_per_thread(k: int, threads: int) -> int:
    """Keys each partial-kernel thread keeps (a power of two): about 2k over the block, so that
    the groups' bound tau is a tight one; 0 turns the filter off (k too large for MAX_KEEP keys a
    thread)."""
    need = -(-2 * max(k, 1) // threads)
    m = 1
    while m < need:
        m *= 2
    return m if m <= MAX_KEEP and m * threads <= FILTER_CAP else 0


def _slice_slots(k: int) -> int:
    """Candidate slots of a slice in ``TopKScratch.cand``: the filter's keys >= tau (at least k,
    usually under 2k) while they fit, else the radix select's exact k."""
    return max(4 * max(k, 1), 512)


@functools.lru_cache(maxsize=None)
def _block_reducers(threads):
    """Block-wide max (float32) and sum (float64) of one value a thread, in every thread: warp
    shuffles and one barrier on a GPU, a shared-memory tree in the simulator (no shuffles)."""
    T = threads
    NW = max(T // 32, 1)
    SHUFFLE = WARP_OPS and T % 32 == 0

    @device_function
    def block_max(red, x, t):
        if SHUFFLE:
            off = 16
            while off > 0:
                x = max(x, cuda.shfl_xor_sync(_FULL, x, off))
                off //= 2
            if t % 32 == 0:
                red[t // 32] = x
            cuda.syncthreads()                 # every warp's max is in
            x = red[0]
            for w in range(1, NW):
                x = max(x, red[w])
        else:
            red[t] = x
            cuda.syncthreads()
            stride = T // 2
            while stride > 0:
                if t < stride:
                    red[t] = max(red[t], red[t + stride])
                cuda.syncthreads()
                stride //= 2
            x = red[0]
        cuda.syncthreads()                     # red is free again
        return x

    @device_function
    def block_sum(red, x, t):
        if SHUFFLE:
            off = 16
            while off > 0:
                x += cuda.shfl_xor_sync(_FULL, x, off)
                off //= 2
            if t % 32 == 0:
                red[t // 32] = x
            cuda.syncthreads()                 # every warp's sum is in
            x = red[0]
            for w in range(1, NW):             # the warps in order: a fixed sum
                x += red[w]
        else:
            red[t] = x
            cuda.syncthreads()
            stride = T // 2
            while stride > 0:
                if t < stride:
                    red[t] = red[t] + red[t + stride]
                cuda.syncthreads()
                stride //= 2
            x = red[0]
        cuda.syncthreads()                     # red is free again
        return x

    return block_max, block_sum


@functools.lru_cache(maxsize=None)
def _topk_partial_kernel(threads, keep=0):
    """Grid (G, L): block (b, row) takes slice b of the row, [b*S, min(V, (b+1)*S)), S = ceil(V/G).
    It writes the slice's log-sum-exp pair (its max, and the sum of exp(x - max) in float64), and
    candidate composite keys for the merge at cand[row, b*W :] (W = cand's width / G), their number
    to cnt[row, b] and a bound to part_tau[row, b]: the row's k-th largest key is >= it (0: none).

    ``keep`` > 0 (``_keep_per_thread``): while reading the slice for its max, each thread keeps its
    ``keep`` largest keys. Groups of GROUP kept keys rank themselves in shared memory; with NG
    groups, each group's q-th largest (q = ceil(k / NG)) has q keys of the slice >= it, so tau, the
    least of those, has NG * q >= k keys >= it: the second read (for the sum) writes every key >=
    tau as a candidate, no sort. If more than W pass, or ``keep`` = 0, or the slice holds fewer than
    k entries, a radix select finds the slice's exact min(k, slice) largest instead (8 bits a pass
    from the top digit down, stopping once the selected bucket is exactly what is still needed)."""
    T = threads
    M = keep
    if M and (T & (T - 1) or M > MAX_KEEP or M * T > FILTER_CAP):
        raise ValueError(f"the filter needs a power-of-two block and keep * threads <= {FILTER_CAP} "
                         f"(threads = {T}, keep = {M}); the launcher uses _keep_per_thread")
    NKEEP = max(1, M * T)                       # kept keys of the block (a power of two)
    GK = min(GROUP, NKEEP)                      # keys a group ranks
    NG = NKEEP // GK
    MLOC = max(M, 1)
    clear, pick_digit, sort_desc = _block_helpers(T)
    block_max, block_sum = _block_reducers(T)

    # launch bounds: registers capped so that a block of T threads always fits an SM
    @cached
    @(cuda.jit if config.ENABLE_CUDASIM else cuda.jit(launch_bounds=(T,), lineinfo=LINEINFO))
    def kernel(logits, bits, k, part_m, part_s, part_tau, cand, cnt):
        b_ = cuda.blockIdx.x
        row = cuda.blockIdx.y
        G = cuda.gridDim.x
        t = cuda.threadIdx.x
        V = logits.shape[1]
        S = (V + G - 1) // G
        W = cand.shape[1] // G
        lo = min(V, b_ * S)
        hi = min(V, lo + S)
        base = b_ * W
        red_f = cuda.shared.array(T, float32)
        red_d = cuda.shared.array(T, float64)
        hist = cuda.shared.array(256, int32)
        suffix = cuda.shared.array(257, int32)
        chunk = cuda.shared.array(17, int32)
        sel = cuda.shared.array(2, uint64)        # (desired prefix, mask of decided bits)
        state = cuda.shared.array(3, int32)       # (still needed, done flag, gathered count)
        fkeys = cuda.shared.array(NKEEP, uint64)  # the threads' kept keys
        gsel = cuda.shared.array(64, uint64)      # each group's q-th largest kept key
        kk = min(k, hi - lo)
        filtered = M > 0 and kk == k              # else the exact radix select
        whole = kk > 0 and kk == hi - lo          # a slice no larger than k: every key, no select

        # -- 1. the slice's max, and each thread's M largest keys
        mine = cuda.local.array(MLOC, uint64)   # (0: none; no composite key is 0)
        for j in range(M):
            mine[j] = uint64(0)
        low_j = 0                               # the slot of this thread's smallest kept key
        low_key = uint64(0)
        xm = float32(-math.inf)
        for v in range(lo + t, hi, T):
            xm = max(xm, logits[row, v])
            if M > 0:
                key = _composite_key(bits[row, v], v)
                if key > low_key:               # replace the smallest kept key, find the new one
                    mine[low_j] = key
                    low_j = 0
                    low_key = mine[0]
                    for j in range(1, M):
                        if mine[j] < low_key:
                            low_key = mine[j]
                            low_j = j
        for j in range(M):
            fkeys[t * M + j] = mine[j]
        if t < 64:
            gsel[t] = uint64(0)                 # a group whose q-th key is none: tau 0, every key
        if t == 0:
            sel[0] = uint64(0)
            sel[1] = uint64(0)
            state[0] = kk
            state[1] = 0
            state[2] = 0
        xm = block_max(red_f, xm, t)            # (its barriers publish the kept keys too)

        # -- 2. tau: the least of the groups' q-th largest kept keys (ranks are distinct: keys are)
        tau = uint64(0)
        if filtered and not whole:
            q = (k + NG - 1) // NG
            for j in range(M):
                i = t * M + j
                g0 = i - i % GK
                key = fkeys[i]
                rank = 0
                for u in range(GK):
                    if fkeys[g0 + u] > key:
                        rank += 1
                if rank == q - 1 and key != uint64(0):
                    gsel[i // GK] = key
            cuda.syncthreads()                  # every group's q-th is in
            tau = gsel[0]
            for g in range(1, NG):
                tau = min(tau, gsel[g])

        # -- 3. the sum of exp(x - max), float64; the keys >= tau are the candidates
        m = float64(xm)
        acc = 0.0
        for v in range(lo + t, hi, T):
            x = logits[row, v]
            if x != -math.inf:
                acc += math.exp(float64(x) - m)
            if filtered or whole:
                key = _composite_key(bits[row, v], v)
                if key >= tau:
                    slot = claim(state, 2)
                    if slot < W:
                        cand[row, base + slot] = key
        acc = block_sum(red_d, acc, t)          # (its barriers publish the count too)
        if t == 0:
            part_m[row, b_] = m
            part_s[row, b_] = acc
            part_tau[row, b_] = tau             # 0 unless filtered: no bound
        if kk <= 0:
            if t == 0:
                cnt[row, b_] = 0
            return
        C = state[2]
        if (filtered or whole) and C <= W:
            if t == 0:
                cnt[row, b_] = C
            return
        cuda.syncthreads()                      # every thread has read the count
        if t == 0:
            state[2] = 0
            cnt[row, b_] = kk
            part_tau[row, b_] = uint64(0)       # (the exact kk below: no bound kept)
        cuda.syncthreads()

        # -- the fallback: a radix select of the slice's kk-th largest composite key, top digit first
        shift = 56
        while shift >= 0:
            if state[1] != 0:
                break
            clear(hist, t)
            cuda.syncthreads()  # histogram cleared
            desired = sel[0]
            mask = sel[1]
            need = state[0]  # read here: it is rewritten below, after several barriers
            for v in range(lo + t, hi, T):
                key = _composite_key(bits[row, v], v)
                if key & mask == desired:
                    # the digits are concentrated (most logits share their top bits): the
                    # warp's lanes in the lowest lane's bin add with one atomic (_warp.hist_add)
                    hist_add(hist, int32((key >> uint64(shift)) & uint64(255)))
            cuda.syncthreads()  # histogram complete
            pick_digit(hist, suffix, chunk, sel, state, shift, need, desired, mask, t)
            shift -= 8

        # the kk survivors (composite keys are distinct: exactly kk are >= the threshold)
        desired = sel[0]
        mask = sel[1]
        for v in range(lo + t, hi, T):
            key = _composite_key(bits[row, v], v)
            if key & mask >= desired:
                cand[row, base + claim(state, 2)] = key

    return kernel


@functools.lru_cache(maxsize=None)
def _topk_merge_kernel(threads, sort_slots=MERGE_SORT):
    """Grid L: the row's log-sum-exp from its G slice pairs (combined in slice order); the row's
    bound, the largest of the slices' tau (its k-th largest key is >= each); the slices'
    candidates >= it gathered in shared memory and sorted there while they fit (MERGE_SORT), else
    a radix select over all the candidates; the k best written out."""
    T = threads
    CAP = max(sort_slots, MAX_K)             # (the fallback's k survivors are sorted there too)
    OFFS = MAX_SLICES + 1
    clear, pick_digit, sort_desc = _block_helpers(T)

    # launch bounds: registers capped so that a block of T threads always fits an SM
    @cached
    @(cuda.jit if config.ENABLE_CUDASIM else cuda.jit(launch_bounds=(T,), lineinfo=LINEINFO))
    def kernel(logits, k, part_m, part_s, part_tau, cand, cnt, lp_out, ids_out):
        row = cuda.blockIdx.x
        t = cuda.threadIdx.x
        G = part_m.shape[1]
        W = cand.shape[1] // G
        hist = cuda.shared.array(256, int32)
        suffix = cuda.shared.array(257, int32)
        chunk = cuda.shared.array(17, int32)
        sel = cuda.shared.array(2, uint64)
        state = cuda.shared.array(3, int32)
        lse_sh = cuda.shared.array(1, float64)
        bound = cuda.shared.array(1, uint64)
        sm = cuda.shared.array(MAX_SLICES, float64)   # per slice: max, then its exp-scaled sum
        sv = cuda.shared.array(MAX_SLICES, float64)
        off = cuda.shared.array(OFFS, int32)  # candidates before each slice
        keys = cuda.shared.array(CAP, uint64)
        for b in range(t, G, T):
            sm[b] = part_m[row, b]
            sv[b] = part_s[row, b]
            off[b + 1] = cnt[row, b]
        cuda.syncthreads()
        if t == 0:
            mm = -math.inf
            tau = uint64(0)
            off[0] = 0
            for b in range(G):
                mm = max(mm, sm[b])
                tau = max(tau, part_tau[row, b])
                off[b + 1] += off[b]
            lse_sh[0] = mm
            bound[0] = tau
            sel[0] = uint64(0)
            sel[1] = uint64(0)
            state[0] = k
            state[1] = 0
            state[2] = 0
        cuda.syncthreads()
        mm = lse_sh[0]
        for b in range(t, G, T):                  # each slice's term, in parallel
            if sm[b] != -math.inf:
                sv[b] = sv[b] * math.exp(sm[b] - mm)
        cuda.syncthreads()
        if t == 0:
            ss = 0.0
            for b in range(G):                    # slice order: a fixed sum (NaN logits give NaN,
                ss += sv[b]                       # flagged by the caller)
            if ss > 0.0:
                lse_sh[0] = mm + math.log(ss)
            elif ss == 0.0:
                lse_sh[0] = -math.inf             # every entry -inf
            else:
                lse_sh[0] = ss                    # NaN
        cuda.syncthreads()
        lse = lse_sh[0]
        tau = bound[0]
        # the candidates >= the row's bound, gathered while they fit (slot j of the row's
        # candidates is in the slice whose range [off[b], off[b + 1]) holds it)
        for j in range(t, off[G], T):
            lo_ = 0
            hi_ = G
            while hi_ - lo_ > 1:
                mid = (lo_ + hi_) // 2
                if off[mid] <= j:
                    lo_ = mid
                else:
                    hi_ = mid
            key = cand[row, lo_ * W + j - off[lo_]]
            if key >= tau:
                slot = claim(state, 2)
                if slot < sort_slots:
                    keys[slot] = key
        cuda.syncthreads()
        C = state[2]
        if C > sort_slots:                        # too many: the radix select over all of them
            cuda.syncthreads()                    # every thread has read the count
            if t == 0:
                state[2] = 0
            inv_w = 1.0 / W
            shift = 56
            while shift >= 0:
                if state[1] != 0:
                    break
                clear(hist, t)
                cuda.syncthreads()
                desired = sel[0]
                mask = sel[1]
                need = state[0]
                for idx in range(t, G * W, T):
                    present, key = _candidate(cand, cnt, row, idx, W, inv_w)
                    if present and key & mask == desired:
                        hist_add(hist, int32((key >> uint64(shift)) & uint64(255)))
                cuda.syncthreads()
                pick_digit(hist, suffix, chunk, sel, state, shift, need, desired, mask, t)
                shift -= 8
            desired = sel[0]
            mask = sel[1]
            for idx in range(t, G * W, T):
                present, key = _candidate(cand, cnt, row, idx, W, inv_w)
                if present and key & mask >= desired:
                    keys[claim(state, 2)] = key
            cuda.syncthreads()
            C = k
        p = 1
        while p < C:
            p *= 2
        for i in range(C + t, p, T):
            keys[i] = uint64(0)  # padding sorts last
        cuda.syncthreads()  # candidates and padding are in place
        sort_desc(keys, p, t)
        for r in range(t, k, T):
            tok = int32(uint64(_LOW32) - (keys[r] & uint64(_LOW32)))
            ids_out[row, r] = tok
            lp_out[row, r] = float32(float64(logits[row, tok]) - lse)

    return kernel


SLICE = 10240      # vocabulary entries a slice block takes (at least)
MAX_SLICES = 64    # slices a row
MERGE_KEYS = 8192  # at most this many candidate keys a row reach the merge (G * k), unless G is 1


def _slices(vocab: int, k: int) -> int:
    """Slices (blocks) a depth: about one per SLICE entries, at most MAX_SLICES, and few enough
    that the merge's one block sees at most MERGE_KEYS candidates (G * k). Measured on the H200
    (V 163840, L 15; benchmarks/tree_build.py --kernels): G 16 beats 64 at k 16 and 64 (59 and 68
    µs against 88 and 109: a block's fixed sorts and reductions outweigh its share of the row), G 8
    beats 16 at k 1024 (184 against 210: the merge's keys)."""
    return max(1, min(MAX_SLICES, vocab // SLICE, MERGE_KEYS // max(k, 1)))


@dataclass(frozen=True)
class TopKScratch:
    """Device memory between the two top-K kernels, for L rows, G slices a row and k kept
    (``allocate`` takes the vocabulary and chooses G as ``topk_logprobs`` does)."""

    part_m: object   # [L, G] float64: each slice's max
    part_s: object   # [L, G] float64: its sum of exp(x - max)
    part_tau: object  # [L, G] uint64: a bound on the row's k-th largest composite key (0: none)
    cand: object     # [L, G * W] uint64: its candidates' composite keys (W = _slice_slots(k))
    cnt: object      # [L, G] int32: how many

    @classmethod
    def allocate(cls, rows: int, vocab: int, k: int, stream=0, slices: int | None = None) -> "TopKScratch":
        slices = _slices(vocab, k) if slices is None else slices

        def arr(shape, dt):
            return cuda.device_array(shape, dt, stream=stream)
        return cls(arr((rows, slices), np.float64), arr((rows, slices), np.float64), arr((rows, slices), np.uint64),
                   arr((rows, slices * _slice_slots(k)), np.uint64), arr((rows, slices), np.int32))

    def fits(self, rows: int, slices: int, k: int) -> bool:
        return self.part_m.shape == (rows, slices) and self.cand.shape[1] == slices * _slice_slots(k)


def _launch_partial(d_logits, k, sc, stream, threads):
    L, G = sc.part_m.shape
    keep = _keep_per_thread(k, threads) if threads & (threads - 1) == 0 else 0   # keep * threads >= 2k
    _topk_partial_kernel(threads, keep)[(G, L), threads, stream](
        d_logits, d_logits.view(np.uint32), k, sc.part_m, sc.part_s, sc.part_tau, sc.cand, sc.cnt)


def _launch_merge(d_logits, k, sc, out, stream, threads, sort_slots=MERGE_SORT):
    L = sc.part_m.shape[0]
    merge_threads = min(1024, 4 * threads)   # L blocks only: each may take a whole SM
    _topk_merge_kernel(merge_threads, sort_slots)[L, merge_threads, stream](
        d_logits, k, sc.part_m, sc.part_s, sc.part_tau, sc.cand, sc.cnt, out[0], out[1])


def topk_logprobs(logits, k, *, out=None, stream=0, threads=THREADS, slices=None, scratch=None):
    """Log-softmax of each row and its ``k`` best tokens, on the GPU.

    logits [L, V] float32 (numpy or device) -> (lp [L, K] float32, ids [L, K] int32),
    numpy if ``logits`` was numpy, else device arrays (or the ``out`` pair, filled in place).
    Bit-identical to ``reference.topk_logprobs``.
    """
    check_array("logits", logits, 2, np.float32)
    L, V = logits.shape
    k = check_int("k", k, 0, V)
    if k > MAX_K:
        raise ValueError(f"k = {k} is more than the kernel's MAX_K = {MAX_K}")
    if V >= 2**31:
        raise ValueError(f"vocabulary of {V} does not fit int32 token ids")
    check_threads(threads)
    check_logits_values("logits", logits)
    host = not is_device(logits)
    d_logits = to_device(logits, stream)
    if out is None:
        out = (cuda.device_array((L, k), np.float32, stream=stream),
               cuda.device_array((L, k), np.int32, stream=stream))
    else:
        check_array("out[0]", out[0], 2, np.float32, shape=(L, k))
        check_array("out[1]", out[1], 2, np.int32, shape=(L, k))
    G = _slices(V, k) if slices is None else check_int("slices", slices, 1, MAX_SLICES)
    if scratch is None:
        scratch = TopKScratch.allocate(L, V, k, stream, slices=G) if L and k else None
    elif not scratch.fits(L, G, k):
        raise ValueError(f"scratch is for {list(scratch.part_m.shape)} rows x slices and "
                         f"{scratch.cand.shape[1] // max(scratch.part_m.shape[1], 1)} candidate slots a slice; "
                         f"this call needs {[L, G]} and {_slice_slots(k)} (k = {k})")
    if L and k:
        _launch_partial(d_logits, k, scratch, stream, threads)
        _launch_merge(d_logits, k, scratch, out, stream, threads)
    if host:
        return out[0].copy_to_host(stream=stream), out[1].copy_to_host(stream=stream)
    return out
