"""Tensor-core instructions from numba: ``mma.sync`` on bf16 tiles and the bf16 packing it needs.

numba-cuda has no tensor-core API. Its documented extension route does: an ``intrinsic`` whose
code generation emits the PTX instruction as LLVM inline assembly (measured on the H200:
385 TFLOP/s from registers, docs/PERFORMANCE.md). The simulator cannot run inline PTX, so each
intrinsic has a simulator implementation with the same meaning: ``mma_bf16`` gathers the whole
warp's fragments in a per-warp buffer behind a per-warp barrier (every lane of a warp must call
it the same number of times, as the GPU requires anyway).

**The one instruction: m16n8k16, A row-major, B column-major, bf16 in, float32 accumulate.**
Lane l of a warp, g = l // 4 (group), t = l % 4 (thread in group), holds (PTX ISA, "Matrix
Fragments for mma.m16n8k16"):

- A [16 x 16]: four uint32 words of two bf16 each (lower k in the low half):
  a0 = A[g, 2t:2t+2], a1 = A[g+8, 2t:2t+2], a2 = A[g, 2t+8:2t+10], a3 = A[g+8, 2t+8:2t+10];
- B [16 x 8]: b0 = B[2t:2t+2, g], b1 = B[2t+8:2t+10, g];
- C, D [16 x 8] float32: c0 = C[g, 2t], c1 = C[g, 2t+1], c2 = C[g+8, 2t], c3 = C[g+8, 2t+1].

D = A @ B + C. Products of bf16 are exact in float32; the hardware adds them and C in an order
of its own (each output depends only on its own row of A, column of B and C element, which is
what batch invariance needs, docs/DESIGN.md §4). The simulator adds them exactly (float64) and
rounds once.
"""

from __future__ import annotations

import numpy as np
from numba import config, float32, types, uint32

from .._device import device_function

_SIM = bool(config.ENABLE_CUDASIM)

MMA_PTX = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
CVT_PTX = "cvt.rn.bf16x2.f32"


if _SIM:
    import struct
    import threading

    class _Warp:
        """One simulated warp's mma: its lanes' fragments, and a barrier of its own (a block
        barrier would cost the simulator a poll of every thread of the block)."""

        def __init__(self):
            self.cv = threading.Condition()
            self.arrived = 0
            self.generation = 0
            self.A, self.B, self.C = np.zeros((16, 16)), np.zeros((16, 8)), np.zeros((16, 8))
            self.D = np.zeros((16, 8), np.float32)

    _warps_lock = threading.Lock()

    _F32 = struct.Struct("<f")
    _U32 = struct.Struct("<I")
    _U32X2 = struct.Struct("<2I")
    _F32X2 = struct.Struct("<2f")

    def _bf16_bits(v):
        """float32 -> bf16 bits, nearest even (``dtypes.to_bf16_bits`` for one Python float)."""
        b = _U32.unpack(_F32.pack(v))[0]
        if (b & 0x7F800000) == 0x7F800000 and b & 0x7FFFFF:      # NaN stays NaN
            return (b >> 16) | 0x40
        return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF

    def pack_bf16x2(lo, hi):
        """Two float32 -> one uint32 of two bf16 (``lo`` in the low half), each rounded to nearest
        even (``cvt.rn.bf16x2.f32``)."""
        return np.uint32(_bf16_bits(lo) | (_bf16_bits(hi) << 16))

    def _unpack(word):
        w = int(word)
        return _F32X2.unpack(_U32X2.pack((w & 0xFFFF) << 16, (w >> 16) << 16))

    def mma_bf16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """D = A @ B + C on one warp's m16n8k16 fragments (module docstring); returns (d0, d1, d2,
        d3). Every lane of the warp must call it: the last lane to arrive computes D (exact
        products and sums, rounded once) and wakes the others."""
        me = threading.current_thread()           # the simulator's thread of this lane
        lane = me.thread_id % 32
        with _warps_lock:                         # a fresh state for every block it runs
            warps = me._manager.__dict__.setdefault("_mma_warps", {})
            warp = warps.get(me.thread_id // 32)
            if warp is None:
                warp = warps[me.thread_id // 32] = _Warp()
        g, t = lane // 4, lane % 4
        with warp.cv:
            A, B, C = warp.A, warp.B, warp.C
            A[g, 2 * t:2 * t + 2] = _unpack(a0)
            A[g + 8, 2 * t:2 * t + 2] = _unpack(a1)
            A[g, 2 * t + 8:2 * t + 10] = _unpack(a2)
            A[g + 8, 2 * t + 8:2 * t + 10] = _unpack(a3)
            B[2 * t:2 * t + 2, g] = _unpack(b0)
            B[2 * t + 8:2 * t + 10, g] = _unpack(b1)
            C[g, 2 * t:2 * t + 2] = (c0, c1)
            C[g + 8, 2 * t:2 * t + 2] = (c2, c3)
            generation = warp.generation
            warp.arrived += 1
            if warp.arrived == 32:
                warp.D = (A @ B + C).astype(np.float32)
                warp.arrived = 0
                warp.generation += 1
                warp.cv.notify_all()
            else:
                while warp.generation == generation:
                    warp.cv.wait(0.05)
                    if me.abort:                      # another thread of the block raised:
                        raise RuntimeError("simulated block aborted")   # leave no thread waiting
            # read before releasing the lock: the next D needs this lane's next fragments first
            D = warp.D
            return D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1]
else:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    @intrinsic
    def _mma_bf16(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        sig = types.UniTuple(float32, 4)(uint32, uint32, uint32, uint32, uint32, uint32,
                                         float32, float32, float32, float32)

        def codegen(context, builder, signature, args):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            fnty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * 6 + [f32] * 4)
            asm = ir.InlineAsm(fnty, MMA_PTX + " {$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};",
                               "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")
            res = builder.call(asm, args)
            vals = [builder.extract_value(res, i) for i in range(4)]
            return context.make_tuple(builder, signature.return_type, vals)

        return sig, codegen

    @intrinsic
    def _cvt_bf16x2(typingctx, lo, hi):
        sig = uint32(float32, float32)

        def codegen(context, builder, signature, args):
            fnty = ir.FunctionType(ir.IntType(32), [ir.FloatType(), ir.FloatType()])
            # cvt.rn.bf16x2.f32 d, a, b puts a in the upper half and b in the lower
            asm = ir.InlineAsm(fnty, CVT_PTX + " $0, $1, $2;", "=r,f,f")
            return builder.call(asm, [args[1], args[0]])

        return sig, codegen

    @device_function
    def mma_bf16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        """D = A @ B + C on one warp's m16n8k16 fragments (module docstring); returns (d0, d1, d2,
        d3). Every lane of the warp must call it (``mma.sync.aligned``)."""
        return _mma_bf16(uint32(a0), uint32(a1), uint32(a2), uint32(a3), uint32(b0), uint32(b1),
                         float32(c0), float32(c1), float32(c2), float32(c3))

    @device_function
    def pack_bf16x2(lo, hi):
        """Two float32 -> one uint32 of two bf16 (``lo`` in the low half), each rounded to nearest
        even (``cvt.rn.bf16x2.f32``)."""
        return _cvt_bf16x2(float32(lo), float32(hi))
