"""Top-K log-probabilities per draft depth on the GPU; twin: ``reference.topk.topk_logprobs``.

Shapes: L depths, V vocabulary, K kept tokens (K <= MAX_K), G slices a row, each keeping a list of
at most cap keys (``_split``: G about one a SLICE entries and cap = K; from K = CAPPED_FROM on, G =
CAPPED_SLICES and cap < K; G * P <= MERGE_SLOTS for P the power of two >= cap).

G blocks a row, so that a row is read by G blocks at once instead of one (issue 15), then a merge
of the row's G results, by the row's last block to finish (one launch) or by a merge kernel:

1. ``_topk_partial_kernel``, grid (G, L): block (b, row) takes slice b of the row, its runs of
   SLICE_RUN = 32 entries (a warp's coalesced load) b, b + G, b + 2G, ... (interleaved, so that a
   range of token ids, frequent tokens say, is dealt out over every slice), each thread UNROLL
   entries at a time (the loads, then the exps, in flight together). Its log-sum-exp pair: each
   thread keeps an online (max, rest) in float64 over its entries, then warp shuffles and the warps
   in order combine the threads' (two barriers). Its min(cap, entries) largest entries, by *composite key*
   ``(ordered float bits << 32) | (2^32-1-id)`` (distinct, so ties in value go to the lower id for
   free): while reading for the log-sum-exp each thread keeps its few largest keys; a radix select
   over the kept keys' top two digits gives tau, with at least cap kept keys >= it, and the keys >=
   tau are gathered in shared memory (a thread's kept ones, or, where every key it kept is >= tau,
   all of its entries read again), where each one's rank is the number of larger ones
   (a candidate a thread; a bitonic sort when there are more). If more than FILTER_CAP pass (a
   slice whose large logits sit in a few threads' strides), a radix select of the cap-th largest
   key, 8 bits a pass from the top digit down, stopping as soon as the selected bucket is exactly
   what is still needed. They go to a ``TopKScratch``, sorted descending.
2. ``merge_row``: the row's log-sum-exp from the slices' pairs (in slice order); every slice's
   sorted list in shared memory, each candidate's rank its place in its own list plus a binary
   search in each other list; the K ranked first written out (no sort). With lists capped below K,
   a check that no full list reaches into the top K - 1, so that no slice can have held more than
   cap of the row's top K (else the block selects the row's top K from the whole row: exact, and
   slow). When the G lists fit the partial kernel's shared
   keys (G * P <= FILTER_CAP), the row's last partial block to finish runs it (an arrival counter
   a row, after a fence; that block resets the counter for the next launch). Otherwise
   ``_topk_merge_kernel``, grid L (up to 1024 threads a block), runs it after the partial kernel.

Short rows (a DFlash drafter's vocabulary of a few hundred) take ``_topk_rows_kernel`` instead: a
warp a row, one launch, no scratch (``method="rows"``; the default where ``_rows_path`` says it
was measured faster).

The log-sum-exp is the twin's lse = max + log1p(rest), rest the float64 sum of exp(x - max) over
every entry but one at the max (each partial pair (max, rest) leaves out its own max's 1; two
pairs combined put one of the two back, rescaled). The float32 log-probabilities then do not depend
on the order of the reduction unless its last-ulp difference (libdevice's exp / log against
numpy's too) crosses a float32 rounding midpoint: no mismatch in 300 full rows (307 k entries)
emulated at V = 163840, G = 16. Summing the whole s = 1 + rest instead, s's rounding at 1 (its
2^-53 different in each order) moved a confident row's top log-prob (~-1e-7) by a float32 ulp or
two in about 1 % of such rows (tests/test_topk.py, the dominant rows); rest rounds relative to
itself.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numba import config, cuda, float32, float64, int32, int64, uint32, uint64

from .._checks import check_array, check_int, check_logits_values
from .._device import LINEINFO, cached, check_threads, device_function, grid_dependency_after, is_device, to_device
from ._warp import FULL, WARP_OPS, claim, group_max, hist_add, warp_sum

MAX_K = 1024       # shared-memory sort buffer; the tree build takes budgets up to 1024 too
_SIGN = 0x80000000
_NEG_INF_BITS = 0xFF800000
_LOW32 = 0xFFFFFFFF


@device_function
def _ordered_bits(bits):
    """The top half of ``_composite_key``: a uint32 that orders as the float32 logit does."""
    u = uint32(bits)
    if u == uint32(_SIGN):  # -0.0 sorts as +0.0, as numpy's comparison does
        u = uint32(0)
    if u & uint32(_SIGN):
        return ~u
    return u | uint32(_SIGN)


@device_function
def _composite_key(bits, v):
    """Order-preserving uint64 key of (logit bits, token id): larger logit first, then lower id."""
    return (uint64(_ordered_bits(bits)) << uint64(32)) | uint64(uint32(_LOW32) - uint32(v))


# -- exp(d) for d <= 0, float64, within an ulp, for the partial kernel's first read -------------------
# libdevice's exp handles every double, so its overflow and special-case checks cost it about half of
# its instructions; the first read calls it once an entry (V of them a row) on d = x - max <= 0. Here:
# d = k ln2/16 + r, |r| <= ln2/32 (Cody-Waite: k * EXP_LN2_HI is exact for |k| < 2^29), exp(r) - 1 by
# its Taylor polynomial of degree 7 (truncation < 1.2e-18), times 2^(j/16) from a 16-entry table in
# shared memory (16 doubles fill the 32 banks once: no bank conflicts), times 2^(k >> 4). Error: the
# table's rounding plus the last one, plus a few hundredths from the polynomial: about an ulp, as
# libdevice's (tests/test_topk.py holds it within 1.1 ulp of a long-double exp). d < -700 gives 0: such a term is below 2^-1000 of the sum's own max term. NaN
# stays NaN.
EXP_STEPS = 16
EXP_TABLE = np.exp2(np.arange(EXP_STEPS, dtype=np.longdouble) / EXP_STEPS).astype(np.float64)
_LN2_STEP = np.log(np.longdouble(2)) / EXP_STEPS
EXP_LN2_HI = float(np.float32(_LN2_STEP))                  # 24 significant bits
EXP_LN2_LO = float(np.float64(_LN2_STEP - np.longdouble(EXP_LN2_HI)))
EXP_INV_STEP = float(np.float64(1 / _LN2_STEP))


EXP_ROUNDER = 1.5 * 2.0**52   # y + EXP_ROUNDER rounds y to an integer, kept in the low word


if config.ENABLE_CUDASIM:
    def _pow2(e):
        return math.ldexp(1.0, int(e))

    def _low_word(y):
        return int32(np.float64(y).view(np.int64) & _LOW32)

    def _as_float(bits):
        return np.uint32(bits).view(np.float32)
else:
    # bit views, free on a GPU (a register read as another type)
    @cuda.jit(device=True, forceinline=True)
    def _pow2(e):
        """2^e for -1022 <= e <= 1023, from its bits (libdevice's ldexp takes any e: 16 instructions)."""
        return cuda.libdevice.hiloint2double(int32((e + 1023) << 20), int32(0))

    @cuda.jit(device=True, forceinline=True)
    def _low_word(y):
        """The low 32 bits of float64 y, as an int32."""
        return cuda.libdevice.double2loint(y)

    @cuda.jit(device=True, forceinline=True)
    def _as_float(bits):
        """The float32 whose bits are the uint32 ``bits``."""
        return cuda.libdevice.int_as_float(int32(bits))


@device_function
def _exp_nonpositive(d, table):
    """exp(d) for float64 d <= 0 (or NaN), ``table`` = EXP_TABLE in shared memory. No branch: the
    first read runs it on 8 entries at once, and per-entry branches (with their convergence
    barriers) made its instructions an entry about twice the arithmetic's (ncu at 5097553)."""
    dc = d if d >= -700.0 else -700.0   # below: exp(d) < 2^-1009, selected away at the end (NaN too)
    # k = round(d / (ln2/16)) with no float-to-integer conversion (a quarter of a DFMA's rate):
    # adding 1.5 * 2^52 leaves k in the low word
    rounded = dc * EXP_INV_STEP + EXP_ROUNDER
    kd = rounded - EXP_ROUNDER
    ki = _low_word(rounded)
    r = (dc - kd * EXP_LN2_HI) - kd * EXP_LN2_LO
    p = r * (1.0 + r * (1.0 / 2 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120 + r * (
        1.0 / 720 + r * (1.0 / 5040)))))))
    tj = table[ki & (EXP_STEPS - 1)]
    e = (tj + tj * p) * _pow2(ki >> 4)
    return e if d >= -700.0 else (d if d != d else 0.0)


@device_function
def _count_above(keys, base, n, key):
    """How many of keys[base : base + n] (descending) are > key: a binary search. In 32-bit
    unsigned indices (base + n <= MERGE_SLOTS): numba's int64 ones, with Python's floor division
    and the negative-index check, took ~25 instructions a step (static SASS of the merge kernel),
    and the merge runs up to G - 1 of these searches for each of its G * P candidates."""
    lo = uint32(0)
    hi = uint32(n)
    b = uint32(base)
    while lo < hi:
        mid = uint32((lo + hi) >> uint32(1))
        if keys[uint32(b + mid)] > key:
            lo = uint32(mid + uint32(1))
        else:
            hi = mid
    return int32(lo)


# A thread's kept keys (the filter's, up to MAX_KEEP = 8) as a tuple of eight uint64 in registers:
# every access is at a constant index and the entries past M stay 0, so the compiler keeps the M
# in use in registers and drops the rest (a local array indexed by the slot of the smallest key
# went to local memory from M = 2). M is the kernel's constant.
@device_function
def _kept_put(kept, M, j, key):
    """kept with entry j (< M) replaced by key."""
    return (key if j == 0 else kept[0], key if M > 1 and j == 1 else kept[1],
            key if M > 2 and j == 2 else kept[2], key if M > 3 and j == 3 else kept[3],
            key if M > 4 and j == 4 else kept[4], key if M > 5 and j == 5 else kept[5],
            key if M > 6 and j == 6 else kept[6], key if M > 7 and j == 7 else kept[7])


@device_function
def _kept_low(kept, M):
    """(the smallest of kept[:M], its index): the first one on ties."""
    low = kept[0]
    j = 0
    if M > 1 and kept[1] < low:
        low, j = kept[1], 1
    if M > 2 and kept[2] < low:
        low, j = kept[2], 2
    if M > 3 and kept[3] < low:
        low, j = kept[3], 3
    if M > 4 and kept[4] < low:
        low, j = kept[4], 4
    if M > 5 and kept[5] < low:
        low, j = kept[5], 5
    if M > 6 and kept[6] < low:
        low, j = kept[6], 6
    if M > 7 and kept[7] < low:
        low, j = kept[7], 7
    return low, j


@device_function
def _kept_at(kept, j):
    """kept[j] for a j known only at run time (a select chain: registers, no local memory)."""
    v = kept[0]
    v = kept[1] if j == 1 else v
    v = kept[2] if j == 2 else v
    v = kept[3] if j == 3 else v
    v = kept[4] if j == 4 else v
    v = kept[5] if j == 5 else v
    v = kept[6] if j == 6 else v
    return kept[7] if j == 7 else v


SLICE_RUN = 32   # a slice's runs of consecutive entries (a warp's load), dealt round the slices


@device_function
def _slice_entries(V, G, R, b):
    """Entries of slice b of a row of V split over G slices of R-entry runs (run r to slice r % G)."""
    cycles = V // (G * R)
    rest = V - cycles * G * R
    return cycles * R + min(R, max(0, rest - b * R))


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

    @device_function
    def reset_selection(sel, state, kk):
        """A radix select's state (one thread): no digit decided, kk still needed, nothing gathered."""
        sel[0] = uint64(0)
        sel[1] = uint64(0)
        state[0] = kk
        state[1] = 0
        state[2] = 0

    @device_function
    def radix_gather(bits, row, mine, stop, step, kk, keys, hist, suffix, chunk, sel, state, t):
        """The kk largest composite keys of the entries bits[row, v], v = mine + j * step < stop
        over the block's threads (``mine`` each thread's first entry) and j >= 0 (kk at most their
        number), into keys[:kk], in no
        order: a radix select of the kk-th largest, 8 bits a pass from the top digit down (a read
        of the range a pass), stopping as soon as the selected bucket is exactly what is still
        needed, then one more read gathers the keys >= it. Uses sel and state (reset here)."""
        cuda.syncthreads()                  # every thread is done with sel and state
        if t == 0:
            reset_selection(sel, state, kk)
        cuda.syncthreads()                  # the selection state is reset
        shift = 56
        while shift >= 0:
            if state[1] != 0:
                break
            clear(hist, t)
            cuda.syncthreads()  # histogram cleared
            desired = sel[0]
            mask = sel[1]
            need = state[0]  # read here: it is rewritten below, after several barriers
            for v in range(mine, stop, step):
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
        for v in range(mine, stop, step):
            key = _composite_key(bits[row, v], v)
            if key & mask >= desired:
                keys[claim(state, 2)] = key
        cuda.syncthreads()                  # the survivors are in

    @device_function
    def merge_row(bits, row, k, cap, G, part_m, part_s, cand, cnt, lp_out, ids_out, keys, pm, ps, pc, lse_sh,
                  hist, suffix, chunk, sel, state, over, t):
        """Row ``row``'s top-K out of its G slices' results: the log-sum-exp from the slices' (max,
        rest) pairs (each rest but the first top slice's with its max's 1, rescaled to the row's
        max, summed in slice order: lse = max + log1p(sum)), and the k largest of the slices' sorted
        candidate lists (each of at most ``cap`` keys: a slice's cap largest), all G * P of them in
        ``keys`` (shared, each list padded to P, a power of two >= cap, with 0 keys that sort last).
        A candidate's rank among them is its place in its own list plus, for each other list, how
        many keys there are larger (a binary search): composite keys are distinct, so the ranks are
        too, and a candidate whose rank is below k writes its token and log-prob there. No sort. 4
        barriers.

        With cap < k the lists may leave out a key of the row's top k: a *full* list (cap keys of
        a slice of more) leaves out keys below its last. If every full list's last key ranks k - 1
        or lower among the candidates (at or below their k-th largest, which is at or below the
        row's), every key left out is below the row's k-th largest, so the candidates' top k is the
        row's. Otherwise the block selects the row's top k from the whole row (``radix_gather``
        over the row, a bitonic sort): exact either way, slow only for such rows. A slice holding
        more than cap of the row's top k always takes that path; one holding exactly cap of its
        top k - 1 takes it too, needed or not (the exact test would compare each slice's best key
        left out, its (cap + 1)-th, with the k-th candidate: not built). (tests/test_topk.py holds
        the rule to brute force.)"""
        for b in range(t, G, T):                  # (the simulator's blocks may be smaller than G)
            pm[b] = part_m[row, b]
            ps[b] = part_s[row, b]
            pc[b] = min(cap, cnt[row, b])         # (cnt: the slice's entries)
        if t == 0:
            over[0] = 0                           # no full list reaches into the top k (yet)
        cuda.syncthreads()                        # the pairs and counts are in
        P = 1
        LG = 0                                    # log2(P): a list's slot by shift and mask, not
        while P < cap:                            # a 64-bit division
            P *= 2
            LG += 1
        for idx in range(t, G * P, T):
            b = idx >> LG
            j = idx & (P - 1)
            keys[idx] = cand[row, b * cap + j] if j < pc[b] else uint64(0)
        if t == 0:
            mm = -math.inf
            top = 0                               # the first slice holding the row's max
            for b in range(G):
                if pm[b] > mm:
                    mm = pm[b]
                    top = b
            lse_sh[0] = mm
            lse_sh[1] = float64(top)
        cuda.syncthreads()                        # the lists and the row's max are in
        top = int32(lse_sh[1])
        for b in range(t, G, T):                  # each slice's rest, rescaled to the row's max:
            if pm[b] != -math.inf and b != top:   # its own max's 1 joins it, but the top slice's
                ps[b] = (ps[b] + 1.0) * math.exp(pm[b] - lse_sh[0])
            # else 0, or NaN from NaN logits (flagged by the caller), as it is
        cuda.syncthreads()                        # the rescaled sums are in
        if t == 0:
            ss = 0.0
            for b in range(G):                    # slice order: a fixed sum
                ss += ps[b]
            lse_sh[0] = lse_sh[0] + math.log1p(ss)   # -inf for a row of -inf; NaN for NaN
        cuda.syncthreads()                        # the log-sum-exp is in
        lse = lse_sh[0]
        for idx in range(t, G * P, T):
            key = keys[idx]
            b = idx >> LG
            rank = idx & (P - 1)
            if key == uint64(0) or rank >= k:
                continue                          # padding, or k larger keys in its own list
            for other in range(G):
                if other != b and rank < k:       # past k - rank larger keys it is out anyway
                    rank += _count_above(keys, other * P, min(P, k - rank), key)
            if rank < k:
                tok = int32(uint64(_LOW32) - (key & uint64(_LOW32)))
                ids_out[row, rank] = tok
                lp_out[row, rank] = float32(float64(_as_float(bits[row, tok])) - lse)
                j = idx - b * P
                if j == cap - 1 and rank < k - 1 and cnt[row, b] > cap:
                    over[0] = 1                       # a full list's last key inside the top k - 1:
                                                      # keys of its slice may be missing (the doc above)
        cuda.syncthreads()                        # every rank is written, and the flag
        if over[0] != 0:
            # a full list reaches into the top k - 1 (a slice may hold more than cap of the row's
            # top k): the row's top k from the whole row
            radix_gather(bits, row, t, bits.shape[1], T, k, keys, hist, suffix, chunk, sel, state, t)
            P2 = 1
            while P2 < k:
                P2 *= 2
            for j in range(k + t, P2, T):
                keys[j] = uint64(0)                   # padding sorts last
            cuda.syncthreads()                        # the padding is in
            sort_desc(keys, P2, t)
            for j in range(t, k, T):
                key = keys[j]
                tok = int32(uint64(_LOW32) - (key & uint64(_LOW32)))
                ids_out[row, j] = tok
                lp_out[row, j] = float32(float64(_as_float(bits[row, tok])) - lse)

    return clear, pick_digit, sort_desc, reset_selection, radix_gather, merge_row


FILTER_CAP = 2048  # shared slots of the partial kernel's filter (candidates >= its threshold)
TAU_DIGITS = 2     # 8-bit digits of the filter's threshold: sign, exponent and 7 mantissa bits
MAX_KEEP = 8       # keys a thread keeps while it reads its part of the slice
UNROLL = 8         # entries a partial-kernel thread loads at once


def _keep_per_thread(k: int, threads: int) -> int:
    """Keys each partial-kernel thread keeps (a power of two): about min(4k, FILTER_CAP) over the
    block, at least one a thread, so that the bound from the k-th best kept key is tight without
    slowing the first read; 0 turns the filter off (more than MAX_KEEP a thread). On the H200
    (89a98e1, top-K µs by keys a thread 1 / 2 / 4 / 8): k 16 (256 threads) 41.3 / 44.3 / 49.2 /
    58.4; k 64 (512) 42.6 / 44.4 / 49.2 / 56.2; k 256 (512) 80.6 / 70.7 / 74.4 / 82.3 (and 69.7
    with one a thread of 1024); k 1024 (512) 179.0 / 185.0 / 111.9 / 121.8 (and 103.9 with two a
    thread of 1024). With the kept keys in registers and the second read only where a thread's
    smallest kept key is >= tau (forty-second session, H100, tools/topk_keep.py at V 163840, L 15,
    the default splits; k: keep 1 / 2 / 4 / 8, µs): k 16 34.0 / 35.7 / 36.9 / 46.1; k 64 31.0 / 32.2 /
    32.8 / 41.1; k 256 33.1 / 33.4 / 36.8 / 42.4; k 1024 54.0 / 54.1 / 56.6 / 63.8. One a thread is
    still the fastest: what more kept keys cost the first read is more than the second read they spare."""
    need = -(-min(4 * max(k, 1), FILTER_CAP) // threads)
    m = 1
    while m < need:
        m *= 2
    return m if m <= MAX_KEEP else 0


@functools.lru_cache(maxsize=None)
def _topk_partial_kernel(threads, keep=0, stop=0, fuse=False, min_blocks=1):
    """Grid (G, L): block (b, row) takes slice b of the row: its runs of min(SLICE_RUN, T) entries
    b, b + G, b + 2G, ... (``_slice_entries`` of them). It writes the slice's log-sum-exp pair
    (max, rest: the sum of exp(x - max) but one max entry's 1), float64, and the composite keys of
    its min(cap, entries) largest entries, sorted descending, to cand[row, b*cap :], its number of
    entries to cnt[row, b].

    ``keep`` > 0 (``_keep_per_thread``): while reading the slice for the log-sum-exp, each thread
    also keeps its ``keep`` largest keys. A radix select of the kk-th largest kept key, stopped
    after TAU_DIGITS digits, gives tau (its bucket's lower edge) with at least kk keys of the slice
    >= it (kept ones), so the slice's kk largest are the kk largest of the keys >= tau: usually a
    few more than kk, gathered in shared memory and ranked there: a thread's kept keys >= tau, or,
    where all its kept keys are >= tau (it may hold more), its entries >= tau read again.
    Only if more than FILTER_CAP keys pass does the block fall back to the radix select over the
    slice (``keep`` = 0 always does). Two reads of the slice instead of four to eight. ``stop``
    (benchmarks/tree_build.py --kernels times the stages with it) ends the block early: 1 after
    the log-sum-exp pair (then the compiler drops the kept keys too: the first read's loads and
    exps alone), 2 once tau is known, 3 after the second read.

    ``fuse``: the row's last block to finish (an arrival counter a row, ``arrive``, that it resets
    for the next launch) merges the row's slices (``merge_row``) into ``lp_out`` / ``ids_out``,
    its shared keys taking the lists (G * P <= FILTER_CAP): no merge kernel, no second launch.
    Otherwise ``arrive``, ``lp_out`` and ``ids_out`` are not touched (``_topk_merge_kernel``)."""
    T = threads
    if fuse and stop:
        raise ValueError("a partial kernel stopped early (stop > 0) does not merge (fuse)")
    M = keep
    if M and (T & (T - 1) or M > MAX_KEEP):
        raise ValueError(f"the filter needs a power-of-two block and keep <= {MAX_KEEP} "
                         f"(threads = {T}, keep = {M}); the launcher uses _keep_per_thread")
    CAP = FILTER_CAP
    U = UNROLL
    RUN = min(SLICE_RUN, T)             # entries a run of a slice (a warp's: one coalesced load)
    WARP = WARP_OPS and T % 32 == 0     # the log-sum-exp's warp shuffles (not the simulator)
    NW = max(T // 32, 1)
    GRP = min(32, T)                    # the log-sum-exp's groups (a warp, or the whole block)
    clear, pick_digit, sort_desc, reset_selection, radix_gather, merge_row = _block_helpers(T)

    # launch bounds: registers capped so that a block of T threads always fits an SM
    @cached
    @(cuda.jit if config.ENABLE_CUDASIM else cuda.jit(launch_bounds=(T, min_blocks), lineinfo=LINEINFO))
    def kernel(bits, k, cap, part_m, part_s, cand, cnt, arrive, lp_out, ids_out):
        grid_dependency_after((bits, k, cap, part_m, part_s, cand, cnt, arrive, lp_out, ids_out))   # PDL (_device.py)
        b_ = cuda.blockIdx.x
        row = cuda.blockIdx.y
        G = cuda.gridDim.x
        t = cuda.threadIdx.x
        V = bits.shape[1]
        # slice b_: the row's runs of RUN (a warp's 32) entries b_, b_ + G, b_ + 2G, ... (interleaved:
        # a range of token ids spreads over every slice); warp w takes the slice's runs w, w + W, ...
        # (W warps), lane l entry l of each: a thread's entries first, first + STEP, ...
        first = (b_ + (t // RUN) * G) * RUN + t % RUN
        STEP = G * T
        n = _slice_entries(V, G, RUN, b_)
        red_m = cuda.shared.array(T, float64)
        red_s = cuda.shared.array(T, float64)
        hold = cuda.shared.array(32, int32)      # each warp's lowest thread at its max
        hist = cuda.shared.array(256, int32)
        suffix = cuda.shared.array(257, int32)
        chunk = cuda.shared.array(17, int32)
        sel = cuda.shared.array(2, uint64)        # (desired prefix, mask of decided bits)
        state = cuda.shared.array(3, int32)       # (still needed, done flag, gathered count)
        over = cuda.shared.array(1, int32)        # the fused merge's: a slice's list too short
        kk = min(cap, n)

        fkeys = cuda.shared.array(CAP, uint64)    # the filter's kept keys, then its candidates
        z = uint64(0)                           # no composite key is 0 (its id part is < 2^31)
        mine = (z, z, z, z, z, z, z, z)         # this thread's M largest keys (0: none), _kept_put
        low_j = 0                               # the slot of this thread's smallest kept key
        low_key = uint64(0)
        low_top = uint32(0)                     # its top half: an entry below it cannot replace it
        lse_sh = cuda.shared.array(2, float64)  # the fused merge's: the row's log-sum-exp,
        pm = cuda.shared.array(MAX_SLICES, float64)     # the slices' pairs and counts
        ps = cuda.shared.array(MAX_SLICES, float64)
        pc = cuda.shared.array(MAX_SLICES, int32)
        exp_table = cuda.shared.array(EXP_STEPS, float64)
        exp_const = cuda.const.array_like(EXP_TABLE)
        for j in range(t, EXP_STEPS, T):
            exp_table[j] = exp_const[j]
        cuda.syncthreads()                      # the exp table is in

        # -- 1. the slice's log-sum-exp, float64, online per thread then over the block. A thread
        # reads U entries at a time (U loads in flight, then U independent exps): one entry at a
        # time, each load and exp waited on in turn, the block was latency-bound. The next U are
        # loaded before this U's exps, so that their loads are in flight while the exps run.
        m = -math.inf
        s = 0.0
        xs = cuda.local.array(U, float32)
        ub = cuda.local.array(U, uint32)
        nb = cuda.local.array(U, uint32)        # the next U entries' bits, in flight
        # 32-bit indices (numba's are 64-bit: two instructions an add or a compare, in a loop of
        # about 60 an entry); a step whose U entries all lie in the slice skips the bounds selects
        T32 = int32(STEP)                       # (the stride between a thread's entries)
        hi32 = int32(V)
        base = int32(first)
        for u in range(U):
            # every lane loads (past the slice, its last entry again), without a branch; an
            # unsigned index spares numba's negative-index wraparound check
            nb[u] = bits[row, uint32(min(int32(base + int32(u) * T32), int32(max(hi32, 1) - 1)))]
        while base < hi32:
            cmax = float32(-math.inf)
            full = int32(base + int32(U - 1) * T32) < hi32     # this step's U entries are in the slice
            nxt = int32(base + int32(U) * T32)
            if full:
                for u in range(U):
                    ub[u] = nb[u]
            else:
                for u in range(U):
                    ub[u] = nb[u] if int32(base + int32(u) * T32) < hi32 else uint32(_NEG_INF_BITS)
            if int32(nxt + int32(U - 1) * T32) < hi32:
                for u in range(U):
                    nb[u] = bits[row, uint32(int32(nxt + int32(u) * T32))]
            elif nxt < hi32:
                for u in range(U):
                    nb[u] = bits[row, uint32(min(int32(nxt + int32(u) * T32), int32(hi32 - 1)))]
            for u in range(U):
                x = _as_float(ub[u])
                xs[u] = x
                if x > cmax:                    # float32: one conversion to float64 an entry, below
                    cmax = x
            skip = False
            if float64(cmax) > m:               # rescale to the new max; the old max's 1 joins
                s = (s + 1.0) * math.exp(m - float64(cmax))    # (0 while m is -inf)
                m = float64(cmax)
                skip = True                     # the first entry at the new max adds nothing
            for u in range(U):
                x = xs[u]
                # -inf adds exp(-inf) = 0 (x - m would be NaN while m is -inf too); NaN passes,
                # and makes the sum NaN. Selects, not branches (see _exp_nonpositive)
                e = _exp_nonpositive(float64(x) - m if x != float32(-math.inf) else -math.inf, exp_table)
                at_max = skip and x == cmax
                s += 0.0 if at_max else e
                skip = skip and not at_max
            if M > 0:
                for u in range(U):
                    v = int32(base + int32(u) * T32)
                    # the 32-bit compare first: most entries stop there, without the 64-bit key
                    if (full or v < hi32) and _ordered_bits(ub[u]) >= low_top:
                        key = _composite_key(ub[u], v)
                        if key > low_key:       # replace the smallest kept key, find the new one
                            mine = _kept_put(mine, M, low_j, key)
                            low_key, low_j = _kept_low(mine, M)
                            low_top = uint32(low_key >> uint64(32))
            base = nxt
        # -- the slice's (max, rest) from the threads' pairs: first the max and the lowest thread
        # holding it (exact in any order); then rest = that thread's rest plus every other
        # thread's (rest + 1) * exp(m - max), summed in a fixed order: trees over aligned groups
        # of G = min(32, T) threads (a warp's xor shuffles on a GPU, the same pairs in shared
        # memory in the simulator), then the groups' sums in group order. Two barriers and one
        # exp a thread on a GPU, where a tree of (max, rest) pairs over the block took log2(T)
        # barriers with a libdevice exp at each level.
        if t == 0:
            reset_selection(sel, state, kk)
        if WARP:
            wmax = group_max(m, 32)
            # the lowest lane at the warp's max (m is never NaN: some lane is), by a max of
            # negated lanes (a ballot here failed NVVM in the lineinfo build of small blocks)
            low = -group_max(int32(-(t % 32)) if m == wmax else int32(-32), 32)
            if t % 32 == 0:
                red_m[t // 32] = wmax
                hold[t // 32] = int32(t + low)
        else:
            red_m[t] = m
        cuda.syncthreads()  # the warps' maxima and holders (or every thread's pair) are in
        top_m = red_m[0]
        holder = int32(hold[0]) if WARP else int32(0)
        for j in range(1, NW if WARP else T):
            if red_m[j] > top_m:
                top_m = red_m[j]
                holder = int32(hold[j]) if WARP else int32(j)
        c = s                                   # the holder's rest leaves out its max's 1
        if t != holder:
            c = 0.0 if m == -math.inf else (s + 1.0) * _exp_nonpositive(m - top_m, exp_table)
        if WARP:
            c = warp_sum(c)
            if t % 32 == 0:
                red_s[t] = c
        else:
            red_s[t] = c
            cuda.syncthreads()  # every thread's term is in
            stride = GRP // 2
            while stride > 0:
                if t % GRP < stride:
                    red_s[t] = red_s[t] + red_s[t + stride]
                cuda.syncthreads()  # this level of the groups' trees is combined
                stride //= 2
        cuda.syncthreads()  # the groups' sums are in
        if t == 0:
            rest = red_s[0]
            for g in range(1, T // GRP):
                rest += red_s[g * GRP]
            part_m[row, b_] = top_m
            part_s[row, b_] = rest
            cnt[row, b_] = n                    # the merge's list length is min(cap, n)
        if stop == 1:
            return

        if kk > 0:                              # (an empty slice: nothing to select)
            C = 0                                   # candidates in fkeys
            if M > 0:
                # -- 2a. tau, a lower bound of the kk-th largest kept key: a radix select over the
                # kept keys (in registers) of TAU_DIGITS digits from the top, the selected bucket's lower
                # edge (at least kk kept keys are >= it: those of the buckets above and of this one).
                # 12 barriers, against the 36-66 of sorting the kept keys (d076322-6b3f0ee, ~250 ns each).
                shift = 56
                while shift >= 64 - 8 * TAU_DIGITS:
                    if state[1] != 0:
                        break                       # the whole bucket was needed: exactly kk kept keys
                    clear(hist, t)
                    cuda.syncthreads()              # histogram cleared
                    desired = sel[0]
                    mask = sel[1]
                    need = state[0]
                    for j in range(M):
                        key = _kept_at(mine, j)
                        if key != uint64(0) and key & mask == desired:
                            hist_add(hist, int32((key >> uint64(shift)) & uint64(255)))
                    cuda.syncthreads()              # histogram complete
                    pick_digit(hist, suffix, chunk, sel, state, shift, need, desired, mask, t)
                    shift -= 8
                tau = sel[0]
                tau_top = uint32(tau >> uint64(32))
                if stop == 2:
                    if t == 0:
                        cand[row, b_ * cap] = tau   # (so that the compiler keeps the work before)
                    return
                # -- 2b. the keys >= tau (at least kk), gathered while they fit. A thread kept its
                # M largest keys, so unless the smallest of them is >= tau (then it may hold more
                # >= tau) its keys >= tau are kept ones: only such a thread reads its entries again
                # (at one key a thread, the default and the fastest, about kk threads of the block)
                if low_key < tau:
                    for j in range(M):
                        key = _kept_at(mine, j)
                        if key >= tau:
                            slot = claim(state, 2)
                            if slot < CAP:
                                fkeys[slot] = key
                else:
                    for base in range(first, V, STEP * U):
                        for u in range(U):
                            ub[u] = bits[row, uint64(min(base + u * STEP, V - 1))]   # as in the first read
                        for u in range(U):
                            v = base + u * STEP
                            if v < V and _ordered_bits(ub[u]) >= tau_top:
                                key = _composite_key(ub[u], v)
                                if key >= tau:
                                    slot = claim(state, 2)
                                    if slot < CAP:
                                        fkeys[slot] = key
                cuda.syncthreads()                  # the candidates and their count are in
                C = state[2]
                if stop == 3:
                    return
            if C == 0 or C > CAP:
                # -- 2. radix select of the slice's kk largest composite keys, top digit first
                radix_gather(bits, row, first, V, STEP, kk, fkeys, hist, suffix, chunk, sel, state, t)
                C = kk

            # -- 3. the kk best candidates out, sorted descending (the merge takes sorted lists)
            if C <= T:
                # a candidate a thread, its rank how many of the C are larger (keys are distinct): every
                # lane of a warp loads the same fkeys[j], a broadcast, and the loads do not wait on each
                # other. C steps and no barrier, where a bitonic sort takes log2(C)(log2(C) + 1) / 2
                # barriers; past a candidate a thread the steps grow as C^2 (on the H200 at 97a451a:
                # +3.1 µs at k 64 against +5.0 sorting, +26 at k 256 against +8, +158 at k 1024)
                if t < C:
                    key = fkeys[t]
                    rank = int32(0)
                    n32 = uint32(C)
                    j = uint32(0)
                    while j < n32:              # 32-bit unsigned: no int64 range, no wraparound check
                        if fkeys[j] > key:
                            rank = int32(rank + int32(1))
                        j = uint32(j + uint32(1))
                    if rank < kk:
                        cand[row, b_ * cap + rank] = key
            else:
                P2 = 1
                while P2 < C:
                    P2 *= 2
                for j in range(C + t, P2, T):
                    fkeys[j] = uint64(0)            # padding sorts last
                cuda.syncthreads()
                sort_desc(fkeys, P2, t)
                for j in range(t, kk, T):
                    cand[row, b_ * cap + j] = fkeys[j]

        if fuse:
            # -- 4. the row's last block to finish merges the row's slices. As cooperative groups'
            # grid sync: the barrier orders the block's writes before thread 0's, whose fence then
            # makes them visible to every block before its arrival is counted; the last arrival's
            # fence orders its block's reads (after the barrier) after every other block's writes.
            # (A fence in every thread, as at 5097553, cost a serialising MEMBAR a warp.)
            cuda.syncthreads()                  # the block's lists and pair are written
            if t == 0:
                cuda.threadfence()
                arrived = cuda.atomic.add(arrive, row, 1)
                if arrived == G - 1:
                    cuda.threadfence()
                    arrive[row] = 0             # for the next launch (a replayed graph)
                state[0] = arrived
            cuda.syncthreads()                  # the arrival's count is in
            if state[0] == G - 1:
                merge_row(bits, row, k, cap, G, part_m, part_s, cand, cnt, lp_out, ids_out, fkeys, pm, ps, pc,
                          lse_sh, hist, suffix, chunk, sel, state, over, t)

    return kernel


@functools.lru_cache(maxsize=None)
def _topk_merge_kernel(threads):
    """Grid L: each row's top-K from its slices' results (``merge_row``), for when the lists do
    not fit the partial kernel's shared keys (G * P > FILTER_CAP; ``_slices`` keeps G * P <=
    MERGE_SLOTS). Otherwise the partial kernel's last block a row merges it (``fuse``)."""
    T = threads
    merge_row = _block_helpers(T)[-1]

    # launch bounds: registers capped so that a block of T threads always fits an SM
    @cached
    @(cuda.jit if config.ENABLE_CUDASIM else cuda.jit(launch_bounds=(T,), lineinfo=LINEINFO))
    def kernel(bits, k, cap, part_m, part_s, cand, cnt, lp_out, ids_out):
        grid_dependency_after((bits, k, cap, part_m, part_s, cand, cnt, lp_out, ids_out))   # PDL (_device.py)
        lse_sh = cuda.shared.array(2, float64)
        pm = cuda.shared.array(MAX_SLICES, float64)     # the slices' pairs and counts, loaded at once
        ps = cuda.shared.array(MAX_SLICES, float64)     # (one thread looping over global memory
        pc = cuda.shared.array(MAX_SLICES, int32)       # waited on each load in turn: ~10 µs)
        keys = cuda.shared.array(MERGE_SLOTS, uint64)
        hist = cuda.shared.array(256, int32)            # the fallback's radix select (merge_row)
        suffix = cuda.shared.array(257, int32)
        chunk = cuda.shared.array(17, int32)
        sel = cuda.shared.array(2, uint64)
        state = cuda.shared.array(3, int32)
        over = cuda.shared.array(1, int32)
        merge_row(bits, cuda.blockIdx.x, k, cap, part_m.shape[1], part_m, part_s, cand, cnt, lp_out, ids_out,
                  keys, pm, ps, pc, lse_sh, hist, suffix, chunk, sel, state, over, cuda.threadIdx.x)

    return kernel


# -- a row a warp, for short rows (a DFlash drafter's small vocabulary) ------------------------------
ROWS_MAX_VOCAB = 1024   # entries a row: a lane holds ceil(V / 32) of them in registers
# The default rule (``_rows_path``), measured on an H100 (tools/topk_short_rows.py, 15 rows, µs a
# launch in graph replay, warp a row / split kernels): V 264: k 1 3.5 / 11.4, k 16 7.1 / 11.9,
# k 32 11.2 / 12.2, k 64 19.3 / 14.0; V 1024: k 1 9.9 / 11.6, k 16 16.1 / 12.4. Its k rounds run one
# after another (~0.25 µs each) and its first read grows with V, while the split kernels' time
# barely moves at these sizes.
ROWS_DEFAULT_VOCAB = 320
ROWS_DEFAULT_K = 32


@functools.lru_cache(maxsize=None)
def _topk_rows_kernel(nper):
    """Grid L, one warp a block: row ``blockIdx.x``'s log-sum-exp and k best tokens, for V <=
    32 * nper <= ROWS_MAX_VOCAB. Lane l holds entries l, l + 32, ... (coalesced loads, one trip to
    memory), as float32 values and composite keys (``_composite_key``: 0 for none). The row's max
    is a warp max (exact); rest, the sum of exp(x - max) over every entry but the top key's, is
    float64, each lane's entries in order, then an xor butterfly (every lane ends with the same
    bits: a + b == b + a); lse = max + log1p(rest), as the twin takes it. Then k rounds: the
    warp's largest key (a warp max of each lane's largest), whose lane writes its log-prob and id
    at that rank and drops it. No shared memory but the exp table, no barrier but the table's on
    a GPU; the simulator, which has no shuffles, exchanges through shared memory (the same values:
    max is exact, the sum's pairs the same).

    Against the split kernels at V 264 (the demo drafter's 15 rows), µs a launch: 7.1 against 11.9
    at k 16, 3.5 against 11.4 at k 1 (dflash's chain); slower past k 32 or V ~300 (ROWS_DEFAULT_*)."""
    NPER = nper

    # x of lane (this lane ^ off): a shuffle on a GPU; in the simulator, through ``sh`` (an array
    # of x's type a lane), between barriers
    if WARP_OPS:
        @device_function
        def xor_lane(x, off, sh):                 # float32 and float64
            return cuda.shfl_xor_sync(FULL, x, off)

        @device_function
        def xor_u64(x, off, sh):
            return uint64(cuda.shfl_xor_sync(FULL, int64(x), off))
    else:
        @device_function
        def xor_lane(x, off, sh):
            lane = cuda.threadIdx.x
            sh[lane] = x
            cuda.syncthreads()
            y = sh[lane ^ off]
            cuda.syncthreads()
            return y
        xor_u64 = xor_lane

    @cached
    @(cuda.jit if config.ENABLE_CUDASIM else cuda.jit(launch_bounds=(32,), lineinfo=LINEINFO))
    def kernel(bits, k, lp_out, ids_out):
        grid_dependency_after((bits, k, lp_out, ids_out))   # PDL: nothing before it touches global memory (_device.py)
        row = cuda.blockIdx.x
        lane = cuda.threadIdx.x
        V = bits.shape[1]
        sh32 = cuda.shared.array(32, float32)     # the simulator's exchanges (unused on a GPU)
        sh64 = cuda.shared.array(32, float64)
        shk = cuda.shared.array(32, uint64)
        exp_table = cuda.shared.array(EXP_STEPS, float64)
        exp_const = cuda.const.array_like(EXP_TABLE)
        if lane < EXP_STEPS:
            exp_table[lane] = exp_const[lane]
        xs = cuda.local.array(NPER, float32)
        keys = cuda.local.array(NPER, uint64)
        for u in range(NPER):                     # a constant count: the loads go out together
            j = lane + 32 * u
            b = uint32(_NEG_INF_BITS)
            if j < V:
                b = bits[row, j]
            xs[u] = _as_float(b)
            keys[u] = _composite_key(b, j) if j < V else uint64(0)
        cmax = float32(-math.inf)
        best = uint64(0)
        for u in range(NPER):
            cmax = max(cmax, xs[u])
            if keys[u] > best:
                best = keys[u]
        for i in range(5):                        # a constant count: unrolled
            cmax = max(cmax, xor_lane(cmax, 16 >> i, sh32))
        top = best                                # the row's largest key: one lane holds it
        for i in range(5):
            y = xor_u64(top, 16 >> i, shk)
            if y > top:
                top = y
        cuda.syncthreads()                        # the exp table is in
        m = float64(cmax)
        rest = 0.0                                # sum of exp(x - m) but the top entry's 1
        for u in range(NPER):                     # -inf (and padding) adds 0; NaN passes
            x = xs[u]
            e = _exp_nonpositive(float64(x) - m if x != float32(-math.inf) else -math.inf, exp_table)
            rest += 0.0 if keys[u] == top and x == cmax else e
        for i in range(5):
            rest = rest + xor_lane(rest, 16 >> i, sh64)
        lse = m + math.log1p(rest)                # -inf for a row of -inf; NaN for NaN
        for r in range(k):
            w = best
            for i in range(5):
                y = xor_u64(w, 16 >> i, shk)
                if y > w:
                    w = y
            if best == w:                         # keys are distinct: one lane holds it
                tok = int32(uint64(_LOW32) - (w & uint64(_LOW32)))
                ids_out[row, r] = tok
                # the value from memory (an L1 hit): picking it out of xs by predicates compiled
                # to a branch per entry (static SASS); -0.0 keeps its sign either way
                lp_out[row, r] = float32(float64(_as_float(bits[row, tok])) - lse)
                uw = tok >> 5                     # entry tok = lane + 32 * uw of this lane
                nb = uint64(0)
                for u in range(NPER):             # predicated, not an index: keys stay in registers
                    if u == uw:
                        keys[u] = uint64(0)
                    elif keys[u] > nb:
                        nb = keys[u]
                best = nb

    return kernel


def _rows_path(vocab: int, k: int) -> bool:
    """Whether ``topk_logprobs`` takes the warp-a-row kernel by default: where it was measured
    faster than the split kernels (the table above ROWS_DEFAULT_VOCAB)."""
    return (vocab <= ROWS_DEFAULT_VOCAB and k <= ROWS_DEFAULT_K) or (k <= 1 and vocab <= ROWS_MAX_VOCAB)


SLICE = 10240      # vocabulary entries a slice block takes (at least)
MAX_SLICES = 64    # slices a row
MAX_VOCAB = 2**31 - 1 - 2 * UNROLL * MAX_SLICES * 1024   # the first read's int32 indices reach two
                                                         # steps (of UNROLL x G x T) past V
MERGE_SLOTS = 4096  # the merge's shared keys: G slices' lists, each padded to a power of two >= k


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _slices(vocab: int, k: int) -> int:
    """Slices (blocks) a depth: about one per SLICE entries, at most MAX_SLICES, few enough that
    the merge holds every slice's list in shared memory (G * P <= MERGE_SLOTS, P the power of two
    >= k), and at most 16 (P <= 32) or 8 (larger P), where the merge's binary searches (G - 1 per
    key, G * P keys) start to cost more than the slices save. Measured on the H200 (V 163840, L 15,
    f4b0ae1; benchmarks/tree_build.py --kernels), top-K µs by G: k 16: G 8 / 16 / 32 = 57.8 / 53.0
    / 79.1; k 64: 59.8 / 66.6 / 141.3; k 256: G 4 / 8 / 16 = 103.3 / 83.3 / 125.7 (its merge alone
    75 µs at G 16); k 1024: G 2 / 4 = 161.6 / 133.1."""
    P = _pow2_at_least(max(k, 1))
    return max(1, min(MAX_SLICES, vocab // SLICE, MERGE_SLOTS // P, 16 if P <= 32 else 8))


# From this k on, slices keep capped lists (``_split``), so that a row is read by as many blocks as
# at small k and the lists fit the partial kernel's last block. Exact for every row: the merge checks
# that no full list reaches into the top k - 1 (as it must when a slice held more than cap of the
# row's top k), else selects the row's top k from the whole row (``_block_helpers.merge_row``:
# ~270-470 µs at V 163840, k 128-1024, on an H100).
CAPPED_FROM = 32
CAPPED_SLICES = 8   # G * L blocks within one wave of an H100's 132 SMs at L = 15: more slices ran in
                    # waves, each as long as the first (tools/topk_caps.py, µs at k 128: G 8 / 16 /
                    # 32 = 33.4 / 52.3 / 108.4 with lists of 32)
CAP_SIGMAS = 4      # a list's cap: this many standard deviations above a slice's mean share of the top k
SMALL_K_SLICE = 4000  # below CAPPED_FROM: entries a slice at least (up to CAPPED_SLICES slices). Measured
                    # (H100, forty-third session, tools/topk_occupancy.py, top-K µs at k 16 / 24 by G
                    # slices, threads): V 163840: G 16, 256 threads (then the default) 33.7 / 40.3; G 8,
                    # 512: 29.9 / 29.9; V 32000: G 3, 256: 24.9 / 25.1; G 8, 512: 19.6 / 19.3; G 4, 512:
                    # 20.3 / 20.1. G 8 of 512 threads was the fastest at every k from 1 to 24 and V
                    # 32000, 129280 and 163840
CAP_MAX = 256       # longer lists stay uncapped: V 32000, k 1024 (3 slices, lists of 512) took 76 µs
                    # against 68 uncapped on an H200 (tools/topk_caps.py --vocab 32000)


def _split(vocab: int, k: int) -> tuple[int, int]:
    """(G slices a row, cap on each slice's list) for k kept out of ``vocab``: below CAPPED_FROM,
    uncapped lists over up to CAPPED_SLICES slices of at least SMALL_K_SLICE entries; from
    CAPPED_FROM on, (``_slices``, k), or (G = CAPPED_SLICES slices of at least SLICE entries)
    lists capped at the smallest power of two >= m + CAP_SIGMAS * sqrt(m), m = k / G, when that is below k, at most
    CAP_MAX, and G * cap <= FILTER_CAP (the fused merge).

    Why that cap: a row whose top k falls on the slices' 32-id runs at random gives each slice a
    Binomial(k, 1/G) share of it (mean m, standard deviation below sqrt(m)), and the merge falls
    back to the whole row (slow) only when a slice held cap of the top k - 1. At G 8 the caps are
    16 / 32 / 32 / 64 / 128 / 256 at k 32 / 64 / 128 / 256 / 512 / 1024, a row falling back with
    probability about 1e-6 / 2e-12 / 6e-4 / 3e-7 / 1e-13 / 1e-26 (the binomial tail over 8 slices,
    ``reference.topk.fallback_odds``). At k 16 the cap would be 8 (odds 1e-3: left uncapped). Measured
    (V 163840, L 15, tools/topk_caps.py, µs; uncapped first): H200 k 32: 47.5 -> 33.0; k 64: 38.0
    -> 34.6; H100 k 128: 51.2 -> 33.4; k 256: 68.4 -> 37.5; k 512: 119.3 -> 49.5; k 1024: 100.6 ->
    75.3."""
    if CAPPED_FROM is not None and k >= CAPPED_FROM:
        g = max(1, min(CAPPED_SLICES, vocab // SLICE))
        cap = _capped_list(k, g)
        return (g, cap) if cap else (_slices(vocab, k), k)
    return max(1, min(CAPPED_SLICES, vocab // SMALL_K_SLICE)), k


def _capped_list(k: int, g: int) -> int | None:
    """``_split``'s cap on each of g slices' lists for k kept (its docstring says why), or None where
    lists stay uncapped: one slice, a cap not below k, above CAP_MAX, or g lists past FILTER_CAP."""
    share = k / g
    cap = _pow2_at_least(math.ceil(share + CAP_SIGMAS * math.sqrt(share)))
    return cap if g > 1 and cap < k and cap <= CAP_MAX and g * cap <= FILTER_CAP else None


def _capped_threads(cap: int) -> int:
    """The partial kernel's block for lists of ``cap`` < k (H100, tools/topk_caps.py: 512 threads
    best to cap 128, 1024 at 256 by ~2 %)."""
    if config.ENABLE_CUDASIM:
        return 32
    return 512 if cap <= 128 else 1024


def _fused_merge(slices: int, cap: int) -> bool:
    """Whether the partial kernel's last block a row merges the row (its shared keys hold the
    slices' lists of up to ``cap`` keys: G * P <= FILTER_CAP, P the power of two >= cap), rather
    than a merge kernel after it."""
    return slices * _pow2_at_least(max(cap, 1)) <= FILTER_CAP


def _default_threads(k: int, cap: int) -> int:
    """The partial kernel's block for k kept in lists of ``cap``: ``_partial_threads(k)`` for
    lists of k, ``_capped_threads(cap)`` for lists capped below k."""
    return _partial_threads(k) if cap >= k else _capped_threads(cap)


def _partial_threads(k: int) -> int:
    """The partial kernel's block for k kept. On the H200 (89a98e1, top-K µs with 256 / 512 / 1024
    threads): k 16: 41.2 / 50.2 / 55.9 (then at G 16; at G 8, ``SMALL_K_SLICE``, 512 threads are the
    fastest: H100, forty-third session); k 64: 50.9 / 42.0 / 42.8; k 256: 77.8 / 80.6 / 69.7; k 1024:
    153.8 / 112.4 / 103.9 (its ~2k candidates spread over more threads). The simulator takes a
    warp (each thread is a Python thread there)."""
    if config.ENABLE_CUDASIM:
        return 32
    return 512 if k <= 64 else 1024


@dataclass(frozen=True)
class TopKScratch:
    """Device memory between the two top-K kernels, for L rows, G slices a row and lists of up to
    cap keys a slice (``allocate`` takes the vocabulary and k and chooses G and cap as
    ``topk_logprobs`` does, ``_split``)."""

    part_m: object   # [L, G] float64: each slice's max
    part_s: object   # [L, G] float64: its rest, the sum of exp(x - max) but one max entry's 1
    cand: object     # [L, G*cap] uint64: its candidates' composite keys
    cnt: object      # [L, G] int32: how many
    arrive: object   # [L] int32: slices of the row finished (the fused merge's counter; 0 between launches)

    @classmethod
    def allocate(cls, rows: int, vocab: int, k: int, stream=0, slices: int | None = None,
                 cap: int | None = None) -> "TopKScratch":
        slices, cap = _choose_split(vocab, k, slices, cap)

        def arr(shape, dt):
            return cuda.device_array(shape, dt, stream=stream)
        return cls(arr((rows, slices), np.float64), arr((rows, slices), np.float64),
                   arr((rows, slices * max(cap, 1)), np.uint64), arr((rows, slices), np.int32),
                   cuda.to_device(np.zeros(rows, np.int32), stream=stream))

    def fits(self, rows: int, slices: int, cap: int) -> bool:
        return self.part_m.shape == (rows, slices) and self.cand.shape[1] == slices * max(cap, 1)


def _choose_split(vocab: int, k: int, slices, cap) -> tuple[int, int]:
    """(G, cap): ``_split``'s when neither is given, else ``_slices`` for G and k for cap, each
    given one checked."""
    if slices is None and cap is None:
        return _split(vocab, k)
    G = _slices(vocab, k) if slices is None else check_int("slices", slices, 1, MAX_SLICES)
    cap = max(k, 1) if cap is None else check_int("cap", cap, 1, max(k, 1))
    if G * cap < k:
        raise ValueError(f"slices x cap = {G} x {cap} lists hold fewer than k = {k} keys")
    return G, cap


def topk_logprobs(logits, k, *, out=None, stream=0, threads=None, slices=None, scratch=None, keep=None,
                  fuse=None, method=None, cap=None):
    """Log-softmax of each row and its ``k`` best tokens, on the GPU.

    logits [L, V] float32 (numpy or device) -> (lp [L, K] float32, ids [L, K] int32),
    numpy if ``logits`` was numpy, else device arrays (or the ``out`` pair, filled in place).
    Bit-identical to ``reference.topk_logprobs``. ``method``: "rows" (a warp a row,
    ``_topk_rows_kernel``, V <= ROWS_MAX_VOCAB) or "split" (the slice blocks and their merge);
    default "rows" where it was measured faster (``_rows_path``: V <= 320 and k <= 32, or k = 1)
    and no knob of the split kernels below is given, else "split". ``scratch`` is the split
    kernels' (unused by "rows", so that a caller may pass it whichever runs); ``threads``,
    ``slices``, ``keep`` and ``fuse`` are refused with "rows". ``threads``: the partial kernel's block
    (default ``_default_threads(k, cap)``); ``slices``: G; ``keep``: the keys a
    thread keeps for the filter, 0 (off) to MAX_KEEP (default ``_keep_per_thread``); ``fuse``:
    whether the partial kernel's last block a row merges the row (True), or a merge kernel after
    it does (False); default True when the slices' lists fit its shared keys (``_fused_merge``).
    ``cap``: the most keys a slice's list holds (1 to k; G * cap >= k). ``slices`` and ``cap``
    default to ``_split``'s (capped lists from k = CAPPED_FROM); with one of them given, the other
    defaults to ``_slices`` or k.
    """
    check_array("logits", logits, 2, np.float32)
    L, V = logits.shape
    k = check_int("k", k, 0, V)
    if k > MAX_K:
        raise ValueError(f"k = {k} is more than the kernel's MAX_K = {MAX_K}")
    if V > MAX_VOCAB:
        raise ValueError(f"vocabulary of {V} is more than the kernel's MAX_VOCAB = {MAX_VOCAB} (int32 token "
                         f"ids, and 32-bit indices that run up to two steps of {UNROLL} x {MAX_SLICES} x 1024 past V)")
    split_knobs = any(v is not None for v in (threads, slices, keep, fuse, cap))
    if method is None:
        method = "rows" if _rows_path(V, k) and not split_knobs else "split"
    if method not in ("rows", "split"):
        raise ValueError(f"method must be 'rows' or 'split', got {method!r}")
    if method == "rows" and V > ROWS_MAX_VOCAB:
        raise ValueError(f"method 'rows' takes V <= {ROWS_MAX_VOCAB} (a lane holds V / 32 entries), got V = {V}")
    if method == "rows" and split_knobs:
        raise ValueError("threads, slices, keep, fuse and cap are the split kernels' (method 'split'), not 'rows'")
    if threads is not None:
        threads = check_threads(threads)
    if keep is not None:
        keep = check_int("keep", keep, 0, MAX_KEEP)
    check_logits_values("logits", logits)
    host = not is_device(logits)
    d_logits = to_device(logits, stream)
    if out is None:
        out = (cuda.device_array((L, k), np.float32, stream=stream),
               cuda.device_array((L, k), np.int32, stream=stream))
    else:
        check_array("out[0]", out[0], 2, np.float32, shape=(L, k))
        check_array("out[1]", out[1], 2, np.int32, shape=(L, k))
    if method == "rows":
        if L and k:
            _topk_rows_kernel(max(1, -(-V // 32)))[L, 32, stream](d_logits.view(np.uint32), k, out[0], out[1])
        if host:
            return out[0].copy_to_host(stream=stream), out[1].copy_to_host(stream=stream)
        return out
    G, cap = _choose_split(V, k, slices, cap)
    if threads is None:
        threads = _default_threads(k, cap)
    if G * _pow2_at_least(cap) > MERGE_SLOTS:
        raise ValueError(f"slices = {G} with lists of {cap}: the merge holds at most {MERGE_SLOTS} keys, "
                         f"{G} lists of {_pow2_at_least(cap)}")
    if fuse is None:
        fuse = _fused_merge(G, cap)
    elif fuse and not _fused_merge(G, cap):
        raise ValueError(f"fuse=True with slices = {G} and lists of {cap}: the partial kernel's shared keys "
                         f"hold at most {FILTER_CAP}, {G} lists of {_pow2_at_least(cap)}")
    if scratch is None:
        scratch = TopKScratch.allocate(L, V, k, stream, slices=G, cap=cap) if L and k else None
    elif not scratch.fits(L, G, cap):
        raise ValueError(f"scratch is for {list(scratch.part_m.shape)} rows x slices and lists of "
                         f"{scratch.cand.shape[1] // max(scratch.part_m.shape[1], 1)}; this call needs "
                         f"{[L, G]} and {cap}")
    if L and k:
        sc = scratch
        if keep is None:
            keep = _keep_per_thread(cap, threads)        # keep * threads ~ min(4 cap, FILTER_CAP)
        bits = d_logits.view(np.uint32)
        _topk_partial_kernel(threads, keep, 0, fuse)[(G, L), threads, stream](
            bits, k, cap, sc.part_m, sc.part_s, sc.cand, sc.cnt, sc.arrive, out[0], out[1])
        if not fuse:
            merge_threads = min(1024, 4 * threads) if config.ENABLE_CUDASIM else 1024   # L blocks only
            _topk_merge_kernel(merge_threads)[L, merge_threads, stream](
                bits, k, cap, sc.part_m, sc.part_s, sc.cand, sc.cnt, out[0], out[1])
    if host:
        return out[0].copy_to_host(stream=stream), out[1].copy_to_host(stream=stream)
    return out
