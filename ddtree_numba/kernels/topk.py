"""Top-K log-probabilities per draft depth on the GPU; twin: ``reference.topk.topk_logprobs``.

Shapes: L depths, V vocabulary, K kept tokens (K <= MAX_K).

One block per depth, three phases over the row:
1. log-sum-exp: each thread keeps an online (max, sum-exp) pair in float64 over a strided
   slice, then a shared-memory tree combines the pairs;
2. radix select of the K-th largest *composite key* ``(ordered float bits << 32) | (2^32-1-id)``,
   8 bits a pass, from the top digit down, stopping as soon as the selected bucket is exactly
   what is still needed. Composite keys are distinct, so the keys >= the threshold are exactly K
   tokens, and ties in value go to the lower id for free;
3. the K survivors are gathered into shared memory, bitonic-sorted descending, written out.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, float64, int32, uint32, uint64

from .._checks import check_array, check_int, check_logits_values
from .._device import check_threads, device_function, is_device, to_device

MAX_K = 1024       # shared-memory sort buffer; the tree build takes budgets up to 1024 too
THREADS = 256      # threads per block on a GPU (one block per depth; 1024 runs out of registers)
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


@functools.lru_cache(maxsize=None)
def _topk_logprobs_kernel(threads):
    T = threads

    @cuda.jit
    def kernel(logits, bits, k, lp_out, ids_out):
        row = cuda.blockIdx.x
        t = cuda.threadIdx.x
        V = logits.shape[1]
        red_m = cuda.shared.array(T, float64)
        red_s = cuda.shared.array(T, float64)
        hist = cuda.shared.array(256, int32)
        suffix = cuda.shared.array(257, int32)
        chunk = cuda.shared.array(17, int32)
        sel = cuda.shared.array(2, uint64)        # (desired prefix, mask of decided bits)
        state = cuda.shared.array(3, int32)       # (still needed, done flag, gathered count)
        keys = cuda.shared.array(MAX_K, uint64)

        # -- 1. log-sum-exp, float64, online per thread then a fixed tree
        m = -math.inf
        s = 0.0
        for v in range(t, V, T):
            x = float64(logits[row, v])
            if x > m:
                s = s * math.exp(m - x) + 1.0
                m = x
            elif x != -math.inf:
                s += math.exp(x - m)
        red_m[t] = m
        red_s[t] = s
        if t == 0:
            sel[0] = uint64(0)
            sel[1] = uint64(0)
            state[0] = k
            state[1] = 0
            state[2] = 0
        cuda.syncthreads()  # partial pairs and selection state are written
        stride = T // 2
        while stride > 0:
            if t < stride:
                m1 = red_m[t]
                m2 = red_m[t + stride]
                mm = max(m1, m2)
                if mm != -math.inf:
                    red_s[t] = red_s[t] * math.exp(m1 - mm) + red_s[t + stride] * math.exp(m2 - mm)
                    red_m[t] = mm
            cuda.syncthreads()  # this level of the tree is combined
            stride //= 2
        lse = red_m[0] + math.log(red_s[0])

        # -- 2. radix select of the K-th largest composite key, top digit first
        shift = 56
        while shift >= 0:
            if state[1] != 0:
                break
            for b in range(t, 256, T):
                hist[b] = 0
            cuda.syncthreads()  # histogram cleared
            desired = sel[0]
            mask = sel[1]
            need = state[0]  # read here: it is rewritten below, after several barriers
            for v in range(t, V, T):
                key = _composite_key(bits[row, v], v)
                if key & mask == desired:
                    # plain shared atomics: warp-aggregating them with match_any_sync measured
                    # slower on the H200 (docs/PERFORMANCE.md)
                    cuda.atomic.add(hist, int32((key >> uint64(shift)) & uint64(255)), 1)
            cuda.syncthreads()  # histogram complete
            # suffix[b] = number of candidates in buckets >= b: 16 chunk sums, a serial
            # suffix over the chunks, then a serial suffix inside each chunk (3 barriers)
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
                if suffix[b] >= need and suffix[b + 1] < need:  # the bucket holding the K-th key
                    sel[0] = desired | (uint64(b) << uint64(shift))
                    sel[1] = mask | (uint64(255) << uint64(shift))
                    need_in_bucket = need - suffix[b + 1]
                    state[0] = need_in_bucket
                    if suffix[b] - suffix[b + 1] == need_in_bucket:
                        state[1] = 1  # the whole bucket is needed: the threshold is final
            cuda.syncthreads()  # selection for this digit is published
            shift -= 8

        # -- 3. gather the K survivors, bitonic sort descending, write out
        desired = sel[0]
        mask = sel[1]
        for v in range(t, V, T):
            key = _composite_key(bits[row, v], v)
            if key & mask >= desired:
                keys[cuda.atomic.add(state, 2, 1)] = key
        p = 1
        while p < k:
            p *= 2
        for i in range(k + t, p, T):
            keys[i] = uint64(0)  # padding sorts last
        cuda.syncthreads()  # survivors and padding are in place
        size = 2
        while size <= p:
            half = size // 2
            while half > 0:
                for i in range(t, p // 2, T):
                    lo = 2 * half * (i // half) + (i % half)
                    hi = lo + half
                    a = keys[lo]
                    b = keys[hi]
                    if (a < b) == ((lo & size) == 0):
                        keys[lo] = b
                        keys[hi] = a
                cuda.syncthreads()  # this compare-exchange stage is done
                half //= 2
            size *= 2
        for r in range(t, k, T):
            tok = int32(uint64(_LOW32) - (keys[r] & uint64(_LOW32)))
            ids_out[row, r] = tok
            lp_out[row, r] = float32(float64(logits[row, tok]) - lse)

    return kernel


def topk_logprobs(logits, k, *, out=None, stream=0, threads=THREADS):
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
    if L and k:
        _topk_logprobs_kernel(threads)[L, threads, stream](
            d_logits, d_logits.view(np.uint32), k, out[0], out[1])
    if host:
        return out[0].copy_to_host(stream=stream), out[1].copy_to_host(stream=stream)
    return out
