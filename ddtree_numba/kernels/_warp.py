"""Warp-level helpers for the top-K, tree-build and MLA softmax kernels (a GPU only).

The CUDA simulator has no shuffles, ballots or active masks. ``hist_add`` and ``claim`` are plain
atomic adds there, so kernels call them unconditionally; a kernel that uses the shuffles
branches on ``WARP_OPS`` (a constant at compile time) and keeps a plain shared-memory path for
the simulator. Both paths compute the same thing; the warp path is held to the twins by the
same tests on the H200.

Why they exist: a histogram or a counter that every thread bumps with ``cuda.atomic.add`` on
the same shared address is serialised, one lane at a time. Radix-select digits of log-probs and
tree scores are concentrated (most keys share their top bits), so the plain atomics made the
first passes thousands of serial adds (the level build measured 1.7 ms at budget 1024 before).
"""

from __future__ import annotations

from numba import config, cuda, int32, int64, uint32, uint64

from .._device import device_function

WARP_OPS = not config.ENABLE_CUDASIM
FULL = 0xFFFFFFFF

if WARP_OPS:
    @device_function
    def lowest_lane(m):
        """The lowest lane set in the lane mask m (uint32); the mask's width (read as lane 0 by a
        shuffle) when m is 0."""
        return cuda.popc((m & (~m + uint32(1))) - uint32(1))

    @device_function
    def hist_add(hist, b):
        """hist[b] += 1 for each calling lane (any subset of the warp, diverged is fine): the
        lanes whose b equals the lowest lane's add together with one atomic, the others alone."""
        m = cuda.activemask()
        leader = lowest_lane(m)
        lb = cuda.shfl_sync(m, b, leader)
        same = cuda.ballot_sync(m, b == lb)
        if b == lb:
            if cuda.laneid == leader:
                cuda.atomic.add(hist, lb, int32(cuda.popc(same)))
        else:
            cuda.atomic.add(hist, b, 1)

    @device_function
    def claim(counter, i):
        """A distinct slot for each calling lane from counter[i] (one atomic for the warp's
        calling lanes; their slots follow lane order)."""
        m = cuda.activemask()
        leader = lowest_lane(m)
        base = 0
        if cuda.laneid == leader:
            base = cuda.atomic.add(counter, i, int32(cuda.popc(m)))
        base = cuda.shfl_sync(m, base, leader)
        return base + cuda.popc(m & cuda.lanemask_lt())

    @device_function
    def group_max(x, lanes):
        """The max of x over each aligned group of ``lanes`` lanes (a power of two <= 32; every
        lane of the warp must call), in every lane of the group. Exact in any order."""
        off = lanes // 2
        while off > 0:
            x = max(x, cuda.shfl_xor_sync(FULL, x, off))
            off //= 2
        return x

    @device_function
    def warp_sum(x):
        """The sum of x over the full warp (every lane must call), in every lane."""
        off = 16
        while off > 0:
            x += cuda.shfl_xor_sync(FULL, x, off)
            off //= 2
        return x

    @device_function
    def warp_min_u64(x):
        """The minimum of the uint64 x over the full warp (every lane must call), in every lane."""
        off = 16
        while off > 0:
            y = uint64(cuda.shfl_xor_sync(FULL, int64(x), off))
            if y < x:
                x = y
            off //= 2
        return x

    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    @intrinsic
    def _redux_max_u32(typingctx, x):
        sig = uint32(uint32)

        def codegen(context, builder, signature, args):
            fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(32)])
            asm = ir.InlineAsm(fnty, "redux.sync.max.u32 $0, $1, 0xffffffff;", "=r,r", side_effect=True)
            return builder.call(asm, args)

        return sig, codegen

    @device_function
    def warp_max_u64(x):
        """The maximum of the uint64 x over the full warp (every lane must call), in every lane: two
        ``redux.sync`` of 32-bit halves (sm_80+), the high words', then the low words' of the lanes
        holding the greatest high word, where five shuffle rounds of 64-bit compares
        (``warp_min_u64``) make a chain of ten shuffles."""
        hi = uint32(x >> uint64(32))
        top_hi = _redux_max_u32(hi)
        top_lo = _redux_max_u32(uint32(x & uint64(0xFFFFFFFF)) if hi == top_hi else uint32(0))
        return (uint64(top_hi) << uint64(32)) | uint64(top_lo)

    @device_function
    def warp_inclusive_scan(x):
        """Inclusive prefix sum of the int x over the full warp's lanes (every lane must call)."""
        lane = cuda.laneid
        off = 1
        while off < 32:
            y = cuda.shfl_up_sync(FULL, x, off)
            if lane >= off:
                x += y
            off *= 2
        return x
else:
    # The simulator runs a kernel's threads as Python threads and swaps a fake ``cuda`` module into
    # the launching kernel's globals only, so these use its atomics directly: one add a lane.
    from numba.cuda.simulator.kernelapi import FakeCUDAAtomic

    _ATOMIC = FakeCUDAAtomic()

    def hist_add(hist, b):
        """hist[b] += 1 (the simulator: a plain atomic add)."""
        _ATOMIC.add(hist, b, 1)

    def claim(counter, i):
        """A distinct slot from counter[i] (the simulator: a plain atomic add)."""
        return _ATOMIC.add(counter, i, 1)

    def _no_warp_ops(*args):
        raise RuntimeError("warp shuffles do not exist in the CUDA simulator (branch on WARP_OPS)")

    group_max = warp_sum = warp_min_u64 = warp_max_u64 = warp_inclusive_scan = lowest_lane = _no_warp_ops
