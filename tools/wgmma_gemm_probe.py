"""A dense bf16 GEMM on wgmma, against the package's GEMM and torch (H200; a probe, not the package).

Usage: python tools/wgmma_gemm_probe.py [--rows 65] [--workspace 128] [--shapes "K,N;..."]
[--blocks "SPEC;..."]. Offline, ``--ptx PTXAS`` compiles every SPEC for sm_90a and assembles it.
In the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, stand-ins from ``tools/wgmma_sim.py``;
``tests/test_wgmma_probe.py``) it checks the bits only: give it small shapes, e.g. ``--rows 17
--workspace 32 --shapes 128,64``. A SPEC (``make``) is ``BR,NS[,XA,OV]`` (``build``),
``L,BR,NS[,F,P,WG]`` (``build_lean``) or ``S,BN,NS[,PERM,F,BULK,OV,XH,WG]`` (``build_swapped``).

out[r, n] = x[r] . w[n] for x [R, K] float32 and w [N, K] bf16 bits, rows r < n_rows[0], under the
package's reduction contract (``kernels/linear.py``): 64-k chunks, each a chain of four k steps
from zero, the chunk partials added in ascending order in float32. So the output must equal the
package's ``_launch`` bit for bit; "DIFF n" marks a spec whose n outputs do not.

``build`` and ``build_lean``: a block is one warpgroup (128 threads), 64 output features x BR rows.
- The weights ride a ``cp.async`` ring of NS slots in shared memory. Each warp reads its 16
  features' A fragments from the slot as the staged kernel does (lane (g, t): the four
  consecutive k 4t..4t+3 of a k step, as one uint64, for rows g and g + 8).
- The activations are rounded to bf16 and stored once a chunk as wgmma's B operand: K-major core
  matrices of 8 rows x 16 bytes, with the lanes' k order (a step's core matrix 0 holds k 4t,
  4t + 1 in word t, core matrix 1 holds k 4t + 2, 4t + 3). That is the order the package's
  mma.sync kernels feed, so the products meet in the same tensor-core slots.
- Four m64nBRk16 wgmma a chunk, from zero (``tools/wgmma_bits.py``: on the H200 a chain of them
  gives mma.sync's bits), then added into the running sums.

``build_swapped``: the operands the other way round, 64 activation rows x BN features a block
(its docstring).

Twenty-first session (docs/PERFORMANCE.md): every ``build`` / ``build_lean`` spec gave the
package's bits on the H200; the lean one is ~28 % faster than ``build``'s, and at 65 rows still ~3x
torch. ``build_swapped`` was written after the device was paused: checked in the simulator only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from numba import config, cuda   # cuda a module global: the simulator swaps it in the kernels' globals

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

SIM = bool(config.ENABLE_CUDASIM)                  # the simulator: stand-ins from tools/wgmma_sim.py
ALIGN = None if SIM else 16                        # (the simulator takes no alignment)
BF = 64          # output features a block (one warpgroup)
NT = 128
QP = 18          # uint64 words a weight row of a slot: 16 (64 bf16) + 2 of padding (rows stay 16-byte aligned)


def build(BR, NS, XA=0, OV=0):
    """The kernel for blocks of BF features x BR rows and a ring of NS weight slots. ``XA``: the
    activations ride the ring too (float32 slots, each thread converting its own copies); else
    they are loaded a chunk ahead into registers. ``OV``: a chunk's wgmma run while the next chunk
    is staged (two accumulator sets, ``wgmma.wait_group 1``); else each chunk waits for its own."""
    from numba import float32, uint32, uint64

    from ddtree_numba._device import device_function, nonneg
    from ddtree_numba.kernels._async import cp_async16, cp_async_commit
    from ddtree_numba.kernels._mma import pack_bf16x2
    from ddtree_numba.kernels._widen import hi_f32, lo_f32
    from wgmma_probe import asm_void, commit, desc_hi, fence, proxy_fence, shared_address, wait_all, wgmma_rs

    assert BR % 8 == 0 and 8 <= BR <= 256 and 2 <= NS <= 8
    M = BR // 2                     # accumulators a thread
    XQ = BR * 16 // NT if BR * 16 >= NT else 1   # activation quads (4 k) a thread stages per chunk
    XR = 2 * XQ                     # their uint64 words (float32 pairs)
    XW = BR * 32                    # uint32 words of one chunk's B (4 steps x BR rows x 16 bf16)
    XB = 3 if OV else 2             # B buffers: OV keeps a chunk's in use until the next one's wait
    WOFF = NS * BF * QP             # the dynamic shared array: NS weight slots, then (XA) NS activation slots
    wg = wgmma_rs(BR)
    wait_one = asm_void("wgmma.wait_group.sync.aligned 1;")
    wait_ring = asm_void(f"cp.async.wait_group {NS - 2};")
    DESC_HI = desc_hi()             # K-major core matrices, LBO 128 / SBO 256 (wgmma_probe)

    @device_function
    def copy_chunk(c, slot, tid, col0, row0, n, N, dyn, wv, xv):
        for i in range(4):                # 64 rows x 8 pieces of 16 bytes: 4 a thread
            m = tid + i * NT
            r = m // 8
            piece = m % 8
            ok = col0 + r < N
            cp_async16(dyn, (uint64((slot * BF + r) * QP + 2 * piece),), wv,
                       (uint64(col0 + r) if ok else uint64(0), uint64(c * 16 + 2 * piece)),
                       uint32(16) if ok else uint32(0))
        if XA:
            for i in range(XQ):
                m = tid + i * NT
                if m < BR * 16:
                    r = m // 16
                    u = m % 16
                    ok = row0 + r < n
                    cp_async16(dyn, (uint64(WOFF + (slot * BR + r) * 32 + 2 * u),), xv,
                               (uint64(row0 + r) if ok else uint64(0), uint64(c * 32 + 2 * u)),
                               uint32(16) if ok else uint32(0))

    @device_function
    def load_x(c, tid, row0, n, xr, xv):
        for i in range(XQ):
            m = tid + i * NT
            r = m // 16
            u = m % 16
            if m < BR * 16 and row0 + r < n:
                xr[2 * i] = xv[row0 + r, c * 32 + 2 * u]
                xr[2 * i + 1] = xv[row0 + r, c * 32 + 2 * u + 1]
            else:
                xr[2 * i] = uint64(0)
                xr[2 * i + 1] = uint64(0)

    @device_function
    def store_x(b, slot, tid, xsm, dyn, xr):
        for i in range(XQ):
            m = tid + i * NT
            if m < BR * 16:
                r = m // 16
                u = m % 16                # step u // 4, lane word u % 4
                if XA:
                    p0 = dyn[WOFF + (slot * BR + r) * 32 + 2 * u]
                    p1 = dyn[WOFF + (slot * BR + r) * 32 + 2 * u + 1]
                else:
                    p0 = xr[2 * i]
                    p1 = xr[2 * i + 1]
                base = (u // 4) * (BR * 8) + (r // 8) * 64 + (r % 8) * 4 + u % 4
                xsm[b, base] = pack_bf16x2(lo_f32(p0), hi_f32(p0))
                xsm[b, base + 32] = pack_bf16x2(lo_f32(p1), hi_f32(p1))

    @device_function
    def chunk(c, acc, prev, C, tid, col0, row0, n, N, dyn, wv, xv, xsm, xr, wa, ys, xbase, r0, t):
        """Stage chunk c, start its wgmma into acc; with OV, then finish chunk c - 1's (prev)."""
        slot = c % NS
        b = c % XB
        wait_ring()
        store_x(b, slot, tid, xsm, dyn, xr)
        proxy_fence()
        cuda.syncthreads()
        if c + NS - 1 < C:
            copy_chunk(c + NS - 1, (c + NS - 1) % NS, tid, col0, row0, n, N, dyn, wv, xv)
        cp_async_commit()
        if not XA and c + 1 < C:
            load_x(c + 1, tid, row0, n, xr, xv)
        for st in range(4):               # A fragments first: one fence covers every wgmma's registers
            wa[st] = dyn[(slot * BF + r0) * QP + 4 * st + t]
            wa[4 + st] = dyn[(slot * BF + r0 + 8) * QP + 4 * st + t]
        for i in range(M):
            acc[i] = float32(0.0)
        fence()
        for st in range(4):
            u = wa[st]
            u8 = wa[4 + st]
            addr = xbase + uint64(4 * (b * XW + st * BR * 8))
            desc = ((addr & uint64(0x3FFFF)) >> uint64(4)) | uint64(DESC_HI)
            wg(acc, uint32(u & uint64(0xFFFFFFFF)), uint32(u8 & uint64(0xFFFFFFFF)),
               uint32(u >> uint64(32)), uint32(u8 >> uint64(32)), desc)
        commit()
        if OV:
            if c > 0:
                wait_one()
                for i in range(M):
                    ys[i] = ys[i] + prev[i]
        else:
            wait_all()
            for i in range(M):
                ys[i] = ys[i] + acc[i]


    @(cuda.jit if SIM else cuda.jit(launch_bounds=(NT,)))
    def kernel(xv, wv, out, n_rows):
        """xv [R, K/2] uint64 (float32 pairs), wv [N, K/4] uint64 (bf16 quads), out [R, N] float32."""
        tid = nonneg(cuda.threadIdx.x)
        warp = tid // 32
        lane = tid % 32
        g = lane // 4
        t = lane % 4
        col0 = nonneg(cuda.blockIdx.x) * BF
        row0 = nonneg(cuda.blockIdx.y) * BR
        n = n_rows[0]
        if row0 >= n:
            return
        N = wv.shape[0]
        C = xv.shape[1] // 32                 # chunks (K % 64 == 0 here)
        dyn = cuda.shared.array(0, uint64, alignment=ALIGN)
        xsm = cuda.shared.array((XB, XW), uint32, alignment=ALIGN)
        ys = cuda.local.array(M, float32)
        acc0 = cuda.local.array(M, float32)
        acc1 = cuda.local.array(M, float32)
        xr = cuda.local.array(XR, uint64)
        wa = cuda.local.array(8, uint64)
        for i in range(M):
            ys[i] = float32(0.0)

        for c in range(NS - 1):
            if c < C:
                copy_chunk(c, c, tid, col0, row0, n, N, dyn, wv, xv)
            cp_async_commit()
        if not XA:
            load_x(0, tid, row0, n, xr, xv)
        xbase = shared_address(xsm)
        r0 = 16 * warp + g
        for c2 in range(0, C, 2):
            chunk(c2, acc0, acc1, C, tid, col0, row0, n, N, dyn, wv, xv, xsm, xr, wa, ys, xbase, r0, t)
            if c2 + 1 < C:
                chunk(c2 + 1, acc1, acc0, C, tid, col0, row0, n, N, dyn, wv, xv, xsm, xr, wa, ys, xbase, r0, t)
        if OV:
            wait_all()
            if C % 2 == 1:
                for i in range(M):
                    ys[i] = ys[i] + acc0[i]
            else:
                for i in range(M):
                    ys[i] = ys[i] + acc1[i]
        for i in range(M):                    # d[4j + 2h + e]: feature g + 8h, row 8j + 2t + e
            j = i // 4
            h = (i // 2) % 2
            e = i % 2
            r = row0 + 8 * j + 2 * t + e
            f = col0 + r0 + 8 * h
            if r < n and f < N:
                out[r, f] = ys[i]

    kernel.dyn_bytes = 8 * (WOFF + (NS * BR * 32 if XA else 0))
    kernel.threads, kernel.features = NT, BF
    return kernel


def allow_dynamic_shared(kernel, args):
    """Compile ``kernel`` for ``args`` and let it take ``kernel.dyn_bytes`` of dynamic shared memory
    (past 48 KiB the driver needs the opt-in; numba-cuda issue 94's route to the function)."""
    from numba import cuda
    from numba.cuda.cudadrv.driver import binding, driver
    kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))
    k = next(iter(kernel.overloads.values()))
    fn = k._codelibrary.get_cufunc()
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attr, kernel.dyn_bytes, fn.handle, cuda.get_current_device().id)


def _raw_intrinsics():
    """Shared-memory and cp.async instructions on raw 32-bit shared addresses (and 64-bit global
    ones), so a chunk's addresses are a base plus a constant, not numba's int64 index arithmetic."""
    if SIM:
        import wgmma_sim as S
        return S.smem_base, S.gmem_base, S.cp16, S.lds64, S.lds128, S.sts32, S.cp4, S.ldg64
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    i32, i64 = ir.IntType(32), ir.IntType(64)

    @intrinsic
    def smem_base(typingctx, arr):
        """The 32-bit shared address of a shared array's first element."""
        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            p = builder.ptrtoint(ary.data, i64)
            fn = ir.FunctionType(i32, [i64])
            return builder.call(ir.InlineAsm(fn, "{ .reg .u64 a; cvta.to.shared.u64 a, $1; cvt.u32.u64 $0, a; }",
                                             "=r,l"), [p])
        return types.uint32(arr), codegen

    @intrinsic
    def gmem_base(typingctx, arr):
        """The address of a device array's first element."""
        def codegen(context, builder, signature, args):
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            return builder.ptrtoint(ary.data, i64)
        return types.uint64(arr), codegen

    @intrinsic
    def cp16(typingctx, saddr, gaddr, nbytes):
        def codegen(context, builder, signature, args):
            fn = ir.FunctionType(ir.VoidType(), [i32, i64, i32])
            builder.call(ir.InlineAsm(fn, "cp.async.cg.shared.global [$0], [$1], 16, $2;", "r,l,r,~{memory}",
                                      side_effect=True), args)
            return context.get_dummy_value()
        return types.void(types.uint32, types.uint64, types.uint32), codegen

    @intrinsic
    def lds64(typingctx, saddr):
        def codegen(context, builder, signature, args):
            fn = ir.FunctionType(i64, [i32])
            return builder.call(ir.InlineAsm(fn, "ld.shared.u64 $0, [$1];", "=l,r,~{memory}", side_effect=True), args)
        return types.uint64(types.uint32), codegen

    @intrinsic
    def lds128(typingctx, saddr):
        """Four float32 at a 16-byte aligned shared address."""
        def codegen(context, builder, signature, args):
            f32 = ir.FloatType()
            fn = ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32])
            res = builder.call(ir.InlineAsm(fn, "ld.shared.v4.f32 {$0, $1, $2, $3}, [$4];", "=f,=f,=f,=f,r,~{memory}",
                                            side_effect=True), args)
            return context.make_tuple(builder, signature.return_type, [builder.extract_value(res, i) for i in range(4)])
        return types.UniTuple(types.float32, 4)(types.uint32), codegen

    @intrinsic
    def sts32(typingctx, saddr, v):
        def codegen(context, builder, signature, args):
            fn = ir.FunctionType(ir.VoidType(), [i32, i32])
            builder.call(ir.InlineAsm(fn, "st.shared.u32 [$0], $1;", "r,r,~{memory}", side_effect=True), args)
            return context.get_dummy_value()
        return types.void(types.uint32, types.uint32), codegen

    @intrinsic
    def cp4(typingctx, saddr, gaddr):
        """4 bytes global -> shared (cp.async.ca; part of the thread's current group)."""
        def codegen(context, builder, signature, args):
            fn = ir.FunctionType(ir.VoidType(), [i32, i64])
            builder.call(ir.InlineAsm(fn, "cp.async.ca.shared.global [$0], [$1], 4;", "r,l,~{memory}",
                                      side_effect=True), args)
            return context.get_dummy_value()
        return types.void(types.uint32, types.uint64), codegen

    @intrinsic
    def ldg64(typingctx, gaddr):
        """Two float32 at an 8-byte aligned global address (read-only path)."""
        def codegen(context, builder, signature, args):
            f32 = ir.FloatType()
            fn = ir.FunctionType(ir.LiteralStructType([f32] * 2), [i64])
            res = builder.call(ir.InlineAsm(fn, "ld.global.nc.v2.f32 {$0, $1}, [$2];", "=f,=f,l"), args)
            return context.make_tuple(builder, signature.return_type, [builder.extract_value(res, i) for i in range(2)])
        return types.UniTuple(types.float32, 2)(types.uint64), codegen

    return smem_base, gmem_base, cp16, lds64, lds128, sts32, cp4, ldg64


def _ldg32():
    """``ldg32(gaddr)``: a uint32 at a 4-byte aligned global address (read-only path)."""
    if SIM:
        import wgmma_sim as S
        return S.ldg32
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def ldg32(typingctx, gaddr):
        def codegen(context, builder, signature, args):
            fn = ir.FunctionType(ir.IntType(32), [ir.IntType(64)])
            return builder.call(ir.InlineAsm(fn, "ld.global.nc.u32 $0, [$1];", "=r,l"), args)
        return types.uint32(types.uint64), codegen
    return ldg32


def _bulk_intrinsics():
    """mbarrier and bulk-copy instructions (sm_90) on raw shared / global addresses:
    ``mbar_init(bar, count)``, ``mbar_arrive_tx(bar, nbytes)`` (arrive, expecting nbytes of copies),
    ``bulk16(dst, src, bar)`` (16 bytes by the async proxy, completing on bar), ``mbar_try(bar,
    parity)`` (1 once the phase of that parity has completed)."""
    if SIM:
        import wgmma_sim as S
        return S.mbar_init, S.mbar_arrive_tx, S.bulk16, S.mbar_try
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    i32, i64 = ir.IntType(32), ir.IntType(64)

    def void2(text, cons, t0, t1, ir0, ir1):
        @intrinsic
        def f(typingctx, a, b):
            def codegen(context, builder, signature, args):
                fn = ir.FunctionType(ir.VoidType(), [ir0, ir1])
                builder.call(ir.InlineAsm(fn, text, cons, side_effect=True), args)
                return context.get_dummy_value()
            return types.void(t0, t1), codegen
        return f

    mbar_init = void2("mbarrier.init.shared::cta.b64 [$0], $1;", "r,r,~{memory}", types.uint32, types.uint32, i32, i32)
    mbar_arrive_tx = void2("mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", "r,r,~{memory}",
                           types.uint32, types.uint32, i32, i32)

    @intrinsic
    def bulk16(typingctx, dst, src, bar):
        def codegen(context, builder, signature, args):
            fn = ir.FunctionType(ir.VoidType(), [i32, i64, i32])
            builder.call(ir.InlineAsm(
                fn, "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], 16, [$2];",
                "r,l,r,~{memory}", side_effect=True), args)
            return context.get_dummy_value()
        return types.void(types.uint32, types.uint64, types.uint32), codegen

    @intrinsic
    def mbar_try(typingctx, bar, parity):
        def codegen(context, builder, signature, args):
            fn = ir.FunctionType(i32, [i32, i32])
            return builder.call(ir.InlineAsm(
                fn, "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2; selp.u32 $0, 1, 0, p; }",
                "=r,r,r,~{memory}", side_effect=True), args)
        return types.uint32(types.uint32, types.uint32), codegen

    return mbar_init, mbar_arrive_tx, bulk16, mbar_try


def _bulk_n():
    """``bulk_n(dst, src, nbytes, bar)``: one bulk copy of nbytes (a multiple of 16) completing on bar."""
    if SIM:
        import wgmma_sim as S
        return S.bulk_n
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def bulk_n(typingctx, dst, src, nbytes, bar):
        def codegen(context, builder, signature, args):
            i32, i64 = ir.IntType(32), ir.IntType(64)
            fn = ir.FunctionType(ir.VoidType(), [i32, i64, i32, i32])
            builder.call(ir.InlineAsm(
                fn, "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];",
                "r,l,r,r,~{memory}", side_effect=True), args)
            return context.get_dummy_value()
        return types.void(types.uint32, types.uint64, types.uint32, types.uint32), codegen
    return bulk_n


def tile_weights(w: np.ndarray, BN: int, perm: bool) -> np.ndarray:
    """w [N, K] bf16 bits -> [N / BN, K / 64, BN * 64]: each (block of BN features, 64-k chunk) the
    bytes of its shared slot, K-major core matrices (step, 8-feature group, core matrix, feature,
    position) as ``build_swapped`` lays them out, with the k order baked in (``perm``: the
    package's lane order, position 2t + e <- k 4t + e and 8 + 2t + e <- 4t + 2 + e of each step)."""
    N, K = w.shape
    f = np.arange(BN)[:, None]
    k = np.arange(64)[None, :]
    kk = k % 16
    if perm:
        t, r = kk // 4, kk % 4
        pos = np.where(r < 2, 2 * t + r, 8 + 2 * t + (r - 2))
    else:
        pos = kk
    off = (k // 16) * (BN * 16) + (f // 8) * 128 + (pos // 8) * 64 + (f % 8) * 8 + pos % 8   # in bf16 elements
    tiles = np.empty((N // BN, K // 64, BN * 64), np.uint16)
    for b in range(N // BN):
        for c in range(K // 64):
            tiles[b, c, off.reshape(-1)] = w[b * BN:(b + 1) * BN, c * 64:(c + 1) * 64].reshape(-1)
    return tiles


def build_lean(BR, NS, F=1, P=0, WG=1):
    """The XA kernel of ``build`` written on raw addresses (``_raw_intrinsics``): each thread's
    copy addresses computed once and advanced by a constant a chunk, 32-bit shared offsets, the
    chunk loop's slot found by a mask (NS a power of two). ``F`` 0: no proxy fence after the B
    stores (a timing knockout: wgmma may read stale B); 2: the one-way release form of the fence.
    ``P``: chunk c + 1's B converted while chunk c's wgmma run (NS >= 4). ``WG`` warpgroups a block, 64 features each, sharing one B.
    (``kernel.threads``, ``kernel.features``: the launch's block size and features a block.)"""
    from numba import float32, uint32, uint64

    from ddtree_numba._device import device_function
    from ddtree_numba.kernels._async import cp_async_commit
    from ddtree_numba.kernels._mma import pack_bf16x2
    from wgmma_probe import asm_void, commit, desc_hi, fence, proxy_fence, wait_all, wgmma_rs

    assert BR % 8 == 0 and 8 <= BR <= 128 and NS in (2, 4, 8) and not (P and NS < 4) and WG in (1, 2)
    NT = 128 * WG
    BF = 64 * WG
    smem_base, gmem_base, cp16, lds64, lds128, sts32, _, _ = _raw_intrinsics()
    M = BR // 2
    XQ = max(1, BR * 16 // NT)
    WSLOT = BF * QP * 8             # bytes a weight slot (BF rows)
    XSLOT = BR * 256                # bytes an activation slot (float32)
    XOFF = NS * WSLOT
    BOFF = XOFF + NS * XSLOT        # the two bf16 B buffers
    BBUF = BR * 128
    wg = wgmma_rs(BR)
    wait_ring = asm_void(f"cp.async.wait_group {NS - 2};")
    wait_next = asm_void(f"cp.async.wait_group {max(0, NS - 3)};")
    pfence = {0: asm_void(""), 1: proxy_fence,
              2: asm_void("fence.proxy.async::generic.release.sync_restrict::shared::cta.cluster;")}[F]
    DESC_HI = desc_hi()
    XMINE = BR * 16 >= NT            # every thread holds activation quads (else the first BR * 16)
    wg_first = wgmma_rs(BR, first=True)

    @device_function
    def issue(c, tid, wdst, wsrc, wnb, xdst, xsrc, xnb):
        """This thread's weight pieces and activation quads of chunk c into its ring slot."""
        slot = c & uint32(NS - 1)
        for i in range(4):
            cp16(wdst[i] + slot * uint32(WSLOT), wsrc[i] + uint64(c) * uint64(128), wnb[i])
        for i in range(XQ):
            if XMINE or tid < uint32(BR * 16):
                cp16(xdst[i] + slot * uint32(XSLOT), xsrc[i] + uint64(c) * uint64(256), xnb[i])

    @device_function
    def convert(c, tid, xdst, bdst):
        """This thread's activation quads of chunk c (its own copies, landed) -> B buffer c % 2."""
        slot = c & uint32(NS - 1)
        for i in range(XQ):
            if XMINE or tid < uint32(BR * 16):
                f = lds128(xdst[i] + slot * uint32(XSLOT))
                bo = bdst[i] + (c & uint32(1)) * uint32(BBUF)
                sts32(bo, pack_bf16x2(f[0], f[1]))
                sts32(bo + uint32(128), pack_bf16x2(f[2], f[3]))
        pfence()

    @(cuda.jit if SIM else cuda.jit(launch_bounds=(NT,)))
    def kernel(x, w, out, n_rows):
        """x [R, K] float32, w [N, K] uint16 (bf16 bits), out [R, N] float32; K % 64 == 0."""
        tid = uint32(cuda.threadIdx.x)
        warp = tid >> uint32(5)
        g = (tid & uint32(31)) >> uint32(2)
        t = tid & uint32(3)
        col0 = uint32(cuda.blockIdx.x) * uint32(BF)
        row0 = uint32(cuda.blockIdx.y) * uint32(BR)
        n = uint32(n_rows[0])
        if row0 >= n:
            return
        N = uint32(w.shape[0])
        K = uint64(x.shape[1])
        C = uint32(K >> uint64(6))
        dyn = cuda.shared.array(0, uint64, alignment=ALIGN)
        sbase = smem_base(dyn)
        wg0 = gmem_base(w)
        xg0 = gmem_base(x)
        # this thread's copies: 4 weight pieces, XQ activation quads (addresses of chunk 0)
        wsrc = cuda.local.array(4, uint64)
        wdst = cuda.local.array(4, uint32)
        wnb = cuda.local.array(4, uint32)
        for i in range(4):
            m = tid + uint32(i * NT)
            r = m >> uint32(3)
            p = m & uint32(7)
            ok = col0 + r < N
            wsrc[i] = wg0 + ((uint64(col0 + r) * K + uint64(8 * p)) * uint64(2) if ok else uint64(0))
            wdst[i] = sbase + r * uint32(QP * 8) + p * uint32(16)
            wnb[i] = uint32(16) if ok else uint32(0)
        xsrc = cuda.local.array(XQ, uint64)
        xdst = cuda.local.array(XQ, uint32)
        xnb = cuda.local.array(XQ, uint32)
        bdst = cuda.local.array(XQ, uint32)
        for i in range(XQ):
            m = tid + uint32(i * NT)
            r = m >> uint32(4)
            u = m & uint32(15)
            ok = m < uint32(BR * 16) and row0 + r < n
            xsrc[i] = xg0 + ((uint64(row0 + r) * K + uint64(4 * u)) * uint64(4) if ok else uint64(0))
            xdst[i] = sbase + uint32(XOFF) + r * uint32(256) + u * uint32(16)
            xnb[i] = uint32(16) if ok else uint32(0)
            bdst[i] = sbase + uint32(BOFF) + (u >> uint32(2)) * uint32(BR * 32) + (r >> uint32(3)) * uint32(256) + \
                (r & uint32(7)) * uint32(16) + (u & uint32(3)) * uint32(4)
        r0 = warp * uint32(16) + g           # warp w of the block: features 16w .. 16w + 15
        aoff = sbase + r0 * uint32(QP * 8) + t * uint32(8)
        ys = cuda.local.array(M, float32)
        acc = cuda.local.array(M, float32)
        wa = cuda.local.array(8, uint64)      # A: rows g (0..3) and g + 8 (4..7) of each step
        for i in range(M):
            ys[i] = float32(0.0)
        for c in range(NS - 1):
            if uint32(c) < C:
                issue(uint32(c), tid, wdst, wsrc, wnb, xdst, xsrc, xnb)
            cp_async_commit()
        bdesc = (uint64(sbase + uint32(BOFF)) & uint64(0x3FFFF)) >> uint64(4) | uint64(DESC_HI)
        if P:
            wait_ring()
            convert(uint32(0), tid, xdst, bdst)
            cuda.syncthreads()
        c = uint32(0)
        while c < C:
            slot = c & uint32(NS - 1)
            if not P:
                wait_ring()
                convert(c, tid, xdst, bdst)
                cuda.syncthreads()            # B(c) visible; every thread past chunk c - 1
                if c + uint32(NS - 1) < C:
                    issue(c + uint32(NS - 1), tid, wdst, wsrc, wnb, xdst, xsrc, xnb)
                cp_async_commit()
            ao = aoff + slot * uint32(WSLOT)
            for st in range(4):               # A fragments first: one fence covers every wgmma's registers
                wa[st] = lds64(ao + uint32(32 * st))
                wa[4 + st] = lds64(ao + uint32(8 * QP * 8 + 32 * st))
            d0 = bdesc + uint64((c & uint32(1)) * uint32(BBUF >> 4))
            fence()
            wg_first(acc, uint32(wa[0] & uint64(0xFFFFFFFF)), uint32(wa[4] & uint64(0xFFFFFFFF)),
                     uint32(wa[0] >> uint64(32)), uint32(wa[4] >> uint64(32)), d0)
            for st in range(1, 4):
                wg(acc, uint32(wa[st] & uint64(0xFFFFFFFF)), uint32(wa[4 + st] & uint64(0xFFFFFFFF)),
                   uint32(wa[st] >> uint64(32)), uint32(wa[4 + st] >> uint64(32)), d0 + uint64(st * BR * 2))
            commit()
            if P and c + uint32(1) < C:       # chunk c + 1's B while chunk c's wgmma run
                wait_next()
                convert(c + uint32(1), tid, xdst, bdst)
            wait_all()
            for i in range(M):
                ys[i] = ys[i] + acc[i]
            if P:
                cuda.syncthreads()            # B(c + 1) visible; slot c and B(c) free
                if c + uint32(NS - 1) < C:
                    issue(c + uint32(NS - 1), tid, wdst, wsrc, wnb, xdst, xsrc, xnb)
                cp_async_commit()
            c += uint32(1)
        for i in range(M):                    # d[4j + 2h + e]: feature g + 8h, row 8j + 2t + e
            r = row0 + uint32(8 * (i // 4) + i % 2) + uint32(2) * t
            f = col0 + r0 + uint32(8 * ((i // 2) % 2))
            if r < n and f < N:
                out[r, f] = ys[i]

    kernel.dyn_bytes = BOFF + 2 * BBUF
    kernel.threads, kernel.features = NT, BF
    return kernel


def build_swapped(BN, NS, PERM=0, F=1, BULK=0, OV=0, XH=0, WG=1):
    """The operands swapped: A = 64 activation rows a block, rounded to bf16 straight from global
    memory into the A registers (a chunk ahead), B = BN weight rows (features) on a cp.async ring of
    NS slots as K-major core matrices, so no thread writes a wgmma operand to shared memory.
    ``PERM`` 0: the natural k order (position p of a k step holds k p: the B pieces are 16 bytes of
    8 consecutive k), a test of whether the tensor core's sum depends on the order of its products
    (the package's mma.sync kernels feed the lanes' order); 1: the package's order (a step's core
    matrix 0 holds k 4t, 4t + 1 in word t, core matrix 1 holds 4t + 2, 4t + 3: 4-byte B pieces).
    ``F``: a proxy fence after the ring's wait (cp.async writes, wgmma reads). ``BULK`` 1: the B pieces
    by ``cp.async.bulk`` (the async proxy, as wgmma reads: no proxy fence at all), each slot with an
    mbarrier (natural order only; N a multiple of BN). (ptxas issues a bulk copy of per-lane
    addresses one lane at a time.) ``BULK`` 2: the weights pre-tiled in global memory
    (``tile_weights``: w [N / BN, K / 64, BN * 64], a slot's bytes in order, either k order), so
    one thread copies a chunk's slot in one bulk copy. ``OV``: chunk c's wgmma run while chunk c + 1
    is waited for, the barrier passed and the ring refilled (the slot of chunk c - 1). Two chunks'
    chains in flight (two accumulator sets, ``wgmma.wait_group 1``) cannot be had with A in
    registers: packing the next chunk's A words while a wgmma is in flight makes ptxas serialize
    every wgmma ("non wgmma instructions defining input registers of a wgmma between start and end
    of the pipeline stage"), so OV waits for each chunk before packing the next. ``XH``: the
    activations arrive as bf16 (x [R, K] uint16 bits, as a producer's bf16 copy would give them):
    the A words are loaded as they are, half the bytes and no packing. ``WG`` warpgroups a block,
    64 rows each, sharing the weights' slots: 65 rows (a 64-node tree) read the weights once
    with WG 2, twice with WG 1. (``kernel.rows``: rows a block.)"""
    from numba import float32, uint32, uint64

    from ddtree_numba._device import device_function
    from ddtree_numba.kernels._async import cp_async_commit
    from ddtree_numba.kernels._mma import pack_bf16x2
    from wgmma_probe import asm_void, commit, desc_hi, fence, proxy_fence, wait_all, wgmma_rs

    assert BN in (16, 32, 64, 128) and NS in (2, 4, 8) and not (BULK == 1 and PERM) and not (OV and NS < 4)
    assert WG in (1, 2) and BN * 8 >= 128 * WG
    NT = 128 * WG
    smem_base, gmem_base, cp16, lds64, lds128, sts32, cp4, ldg64 = _raw_intrinsics()
    ldg32 = _ldg32()
    XN = 16 if XH else 32              # activation registers a chunk: A words (XH) or float32
    XE = 2 if XH else 4                # bytes an activation
    mbar_init, mbar_arrive_tx, bulk16, mbar_try = _bulk_intrinsics()
    fence_init = asm_void("fence.mbarrier_init.release.cluster;")
    MOFF = 128 if BULK else 0        # BULK: the slots' mbarriers first
    M = BN // 2
    WSLOT = BN * 128
    NP = 1 if BULK == 2 else BN * 8 // NT if not PERM else BN * 32 // NT   # B pieces a thread copies a chunk
    bulk_n = _bulk_n()
    wg = wgmma_rs(BN)
    wg_first = wgmma_rs(BN, first=True)
    wait_first = asm_void(f"cp.async.wait_group {NS - 2};")   # chunk c landed, chunks past it in flight
    wait_ring = asm_void(f"cp.async.wait_group {NS - 3 if OV else NS - 2};")
    pfence = proxy_fence if F and not BULK else asm_void("")
    DESC_HI = desc_hi()
    XT = uint32 if XH else float32

    @device_function
    def issue(c, sbase, wdst, wsrc, wnb):
        """This thread's B pieces of chunk c into its slot (then a cp.async group closes)."""
        slot = c & uint32(NS - 1)
        bar = sbase + slot * uint32(8)
        if BULK == 2:                    # one thread, the slot's bytes in one copy
            if wnb[0]:
                mbar_arrive_tx(bar, uint32(WSLOT))
                bulk_n(wdst[0] + slot * uint32(WSLOT), wsrc[0] + uint64(c) * uint64(WSLOT), uint32(WSLOT), bar)
            return
        if BULK:
            mbar_arrive_tx(bar, uint32(16 * NP))
        for i in range(NP):
            dst = wdst[i] + slot * uint32(WSLOT)
            src = wsrc[i] + uint64(c) * uint64(128)
            if BULK:
                bulk16(dst, src, bar)
            elif PERM:
                cp4(dst, src)
            else:
                cp16(dst, src, wnb[i])

    @device_function
    def land(c, sbase, first):
        """Until chunk c's slot holds it (every thread's pieces, after the barrier that follows)."""
        if BULK:
            slot = c & uint32(NS - 1)
            while mbar_try(sbase + slot * uint32(8), (c // uint32(NS)) & uint32(1)) == uint32(0):
                pass
        elif first:
            wait_first()
        else:
            wait_ring()
        pfence()

    @device_function
    def load_x(c, xr, okA, okB, pA, pB, k0, k1):
        """Chunk c's activations of rows A and B: xr[16 * (row B) + 4 * step + 2 * pair + e]
        (XH: the A words, xr[4 * step + (a0, a1, a2, a3)])."""
        off = uint64(c) * uint64(64 * XE)
        if XH:
            for st in range(4):
                if okA:
                    xr[4 * st] = ldg32(pA + off + uint64(32 * st) + k0)
                    xr[4 * st + 2] = ldg32(pA + off + uint64(32 * st) + k1)
                if okB:
                    xr[4 * st + 1] = ldg32(pB + off + uint64(32 * st) + k0)
                    xr[4 * st + 3] = ldg32(pB + off + uint64(32 * st) + k1)
            return
        for st in range(4):
            if okA:
                v = ldg64(pA + off + uint64(64 * st) + k0)
                xr[4 * st] = v[0]
                xr[4 * st + 1] = v[1]
                v = ldg64(pA + off + uint64(64 * st) + k1)
                xr[4 * st + 2] = v[0]
                xr[4 * st + 3] = v[1]
            if okB:
                v = ldg64(pB + off + uint64(64 * st) + k0)
                xr[16 + 4 * st] = v[0]
                xr[16 + 4 * st + 1] = v[1]
                v = ldg64(pB + off + uint64(64 * st) + k1)
                xr[16 + 4 * st + 2] = v[0]
                xr[16 + 4 * st + 3] = v[1]

    @device_function
    def start_mma(c, xr, aw, acc, bdesc):
        """Chunk c's four wgmma into acc, from zero (committed, not waited for)."""
        for st in range(4):
            if XH:
                for e in range(4):
                    aw[4 * st + e] = xr[4 * st + e]
                continue
            aw[4 * st] = pack_bf16x2(xr[4 * st], xr[4 * st + 1])
            aw[4 * st + 1] = pack_bf16x2(xr[16 + 4 * st], xr[16 + 4 * st + 1])
            aw[4 * st + 2] = pack_bf16x2(xr[4 * st + 2], xr[4 * st + 3])
            aw[4 * st + 3] = pack_bf16x2(xr[16 + 4 * st + 2], xr[16 + 4 * st + 3])
        d0 = bdesc + uint64((c & uint32(NS - 1)) * uint32(WSLOT >> 4))
        fence()
        wg_first(acc, aw[0], aw[1], aw[2], aw[3], d0)          # the chain starts from zero
        for st in range(1, 4):
            wg(acc, aw[4 * st], aw[4 * st + 1], aw[4 * st + 2], aw[4 * st + 3], d0 + uint64(st * BN * 2))
        commit()

    @device_function
    def step(c, C, acc, xa, xn, aw, ys, sbase, wdst, wsrc, wnb, okA, okB, pA, pB, k0, k1, bdesc):
        """Chunk c (not OV): land it, refill the ring (the slot chunk c - 1 left), fetch chunk c + 1's
        activations, run its wgmma, add its partial into ys."""
        land(c, sbase, False)
        cuda.syncthreads()               # chunk c visible; every thread past chunk c - 1
        if c + uint32(NS - 1) < C:
            issue(c + uint32(NS - 1), sbase, wdst, wsrc, wnb)
        if not BULK:
            cp_async_commit()
        if c + uint32(1) < C:
            load_x(c + uint32(1), xn, okA, okB, pA, pB, k0, k1)
        start_mma(c, xa, aw, acc, bdesc)
        wait_all()
        for i in range(M):
            ys[i] = ys[i] + acc[i]
        for i in range(XN):
            xa[i] = xn[i]

    @device_function
    def step_ov(c, C, acc, xa, xn, aw, ys, sbase, wdst, wsrc, wnb, okA, okB, pA, pB, k0, k1, bdesc):
        """Chunk c (OV; landed and visible, its activations in xa, chunk c + 1's in xn): start its
        wgmma, then under them land chunk c + 1, refill the slot chunk c - 1 left, fetch chunk
        c + 2's activations; then wait and add."""
        start_mma(c, xa, aw, acc, bdesc)
        if c + uint32(1) < C:
            land(c + uint32(1), sbase, False)
            cuda.syncthreads()           # chunk c + 1 visible; every thread past chunk c - 1's wgmma
            if c + uint32(NS - 1) < C:
                issue(c + uint32(NS - 1), sbase, wdst, wsrc, wnb)
        if not BULK:
            cp_async_commit()
        for i in range(XN):
            xa[i] = xn[i]
        if c + uint32(2) < C:
            load_x(c + uint32(2), xn, okA, okB, pA, pB, k0, k1)
        wait_all()
        for i in range(M):
            ys[i] = ys[i] + acc[i]

    @(cuda.jit if SIM else cuda.jit(launch_bounds=(NT,)))
    def kernel(x, w, out, n_rows):
        """x [R, K] float32 (XH: uint16 bf16 bits), w [N, K] uint16 (bf16 bits), out [R, N] float32;
        K % 64 == 0."""
        tid = uint32(cuda.threadIdx.x)
        warp = tid >> uint32(5)
        g = (tid & uint32(31)) >> uint32(2)
        t = tid & uint32(3)
        col0 = uint32(cuda.blockIdx.x) * uint32(BN)
        row0 = uint32(cuda.blockIdx.y) * uint32(64 * WG)
        n = uint32(n_rows[0])
        if row0 >= n:
            return
        N = uint32(w.shape[0] * BN if BULK == 2 else w.shape[0])
        K = uint64(x.shape[1])
        C = uint32(K >> uint64(6))
        dyn = cuda.shared.array(0, uint64, alignment=ALIGN)
        sbase = smem_base(dyn)
        wbase = sbase + uint32(MOFF)
        if BULK:
            if tid < uint32(NS):
                mbar_init(sbase + tid * uint32(8), uint32(1 if BULK == 2 else NT))
            fence_init()
            cuda.syncthreads()
        wg0 = gmem_base(w)
        xg0 = gmem_base(x)
        wsrc = cuda.local.array(NP, uint64)
        wdst = cuda.local.array(NP, uint32)
        wnb = cuda.local.array(NP, uint32)
        for i in range(0 if BULK == 2 else NP):
            m = tid + uint32(i * NT)
            if PERM:
                f = m >> uint32(5)
                q = m & uint32(31)            # step q // 8, core matrix (q // 4) % 2, word q % 4
                st = q >> uint32(3)
                cm = (q >> uint32(2)) & uint32(1)
                tw = q & uint32(3)
                k = st * uint32(16) + tw * uint32(4) + cm * uint32(2)
                wdst[i] = wbase + st * uint32(BN * 32) + (f >> uint32(3)) * uint32(256) + cm * uint32(128) + \
                    (f & uint32(7)) * uint32(16) + tw * uint32(4)
            else:
                f = m >> uint32(3)
                j = m & uint32(7)             # k 8j .. 8j + 7: step j // 2, core matrix j % 2
                k = j * uint32(8)
                wdst[i] = wbase + (j >> uint32(1)) * uint32(BN * 32) + (f >> uint32(3)) * uint32(256) + \
                    (j & uint32(1)) * uint32(128) + (f & uint32(7)) * uint32(16)
            ok = col0 + f < N
            wsrc[i] = wg0 + ((uint64(col0 + f) * K + uint64(k)) * uint64(2) if ok else uint64(0))
            wnb[i] = uint32(16) if ok else uint32(0)
        if BULK == 2:                         # thread 0 copies the block's column of tiles
            wsrc[0] = wg0 + uint64(cuda.blockIdx.x) * uint64(C) * uint64(WSLOT)
            wdst[0] = wbase
            wnb[0] = uint32(1) if tid == uint32(0) else uint32(0)
        rA = row0 + warp * uint32(16) + g
        okA = rA < n
        okB = rA + uint32(8) < n
        pA = xg0 + (uint64(rA) * K * uint64(XE) if okA else uint64(0))
        pB = xg0 + (uint64(rA + uint32(8)) * K * uint64(XE) if okB else uint64(0))
        # a lane's first k of each pair in a step: natural 2t and 2t + 8; PERM 4t and 4t + 2 (bytes)
        k0 = uint64(2 * XE) * uint64(t) if not PERM else uint64(4 * XE) * uint64(t)
        k1 = k0 + (uint64(8 * XE) if not PERM else uint64(2 * XE))
        xa = cuda.local.array(XN, XT)         # this chunk's activations (``load_x``)
        xn = cuda.local.array(XN, XT)         # the next chunk's
        aw = cuda.local.array(16, uint32)     # their A words: 4 * step + (a0, a1, a2, a3)
        ys = cuda.local.array(M, float32)
        acc = cuda.local.array(M, float32)
        for i in range(M):
            ys[i] = float32(0.0)
        for i in range(XN):
            xa[i] = XT(0)
            xn[i] = XT(0)
        for c in range(NS - 1):
            if uint32(c) < C:
                issue(uint32(c), sbase, wdst, wsrc, wnb)
            if not BULK:
                cp_async_commit()
        load_x(uint32(0), xa, okA, okB, pA, pB, k0, k1)
        bdesc = (uint64(wbase) & uint64(0x3FFFF)) >> uint64(4) | uint64(DESC_HI)
        if OV:
            land(uint32(0), sbase, True)
            cuda.syncthreads()
            if C > uint32(1):
                load_x(uint32(1), xn, okA, okB, pA, pB, k0, k1)
        c = uint32(0)
        while c < C:
            if OV:
                step_ov(c, C, acc, xa, xn, aw, ys, sbase, wdst, wsrc, wnb, okA, okB, pA, pB, k0, k1, bdesc)
            else:
                step(c, C, acc, xa, xn, aw, ys, sbase, wdst, wsrc, wnb, okA, okB, pA, pB, k0, k1, bdesc)
            c += uint32(1)
        for i in range(M):                    # d[4j + 2h + e]: row g + 8h of the warp, feature 8j + 2t + e
            r = rA + uint32(8 * ((i // 2) % 2))
            f = col0 + uint32(8 * (i // 4) + i % 2) + uint32(2) * t
            if r < n and f < N:
                out[r, f] = ys[i]

    kernel.dyn_bytes = MOFF + NS * WSLOT
    kernel.threads, kernel.features, kernel.rows = NT, BN, 64 * WG
    return kernel


def make(spec):
    """The kernel of a block spec: (BR, NS[, XA, OV]), ("L", BR, NS[, F, P]) or ("S", BN, NS[, PERM, F])."""
    if spec[0] == "L":
        return build_lean(*spec[1:])
    if spec[0] == "S":
        return build_swapped(*spec[1:])
    return build(*spec)


def launcher(spec, kern, x, w, n_rows, workspace, stream, tiles=None):
    """(fn, out): a launch of spec's kernel ``kern`` for x [W, K] float32 and w [1, N, K] bf16 bits
    (device arrays; W = ``workspace``) into out [W, N] float32 (NaN-filled first), and its output.
    XH specs get a bf16 copy of x, BULK 2 specs the tiled weights (``tiles`` overrides them: the
    simulator test's mismatched k order)."""
    from ddtree_numba.dtypes import to_bf16_bits
    N, K = w.shape[1], w.shape[2]
    lean_or_swapped = spec[0] in ("L", "S")
    xh = spec[0] == "S" and len(spec) > 7 and spec[7]
    if not lean_or_swapped:
        args = (x.view(np.uint64), w.reshape(N, K).view(np.uint64))
    else:
        xa = cuda.to_device(to_bf16_bits(x.copy_to_host()), stream=stream) if xh else x   # a producer's bf16 copy
        wt = w.reshape(N, K)
        if spec[0] == "S" and len(spec) > 5 and spec[5] == 2:
            if tiles is None:
                tiles = tile_weights(w.copy_to_host().reshape(N, K), spec[1], len(spec) > 3 and spec[3])
            wt = cuda.to_device(tiles, stream=stream)
        args = (xa, wt)
    out = cuda.to_device(np.full((workspace, N), np.nan, np.float32), stream=stream)
    rows_a_block = kern.rows if spec[0] == "S" else spec[1] if spec[0] == "L" else spec[0]
    grid = (N // kern.features, -(-workspace // rows_a_block))
    if not SIM:
        allow_dynamic_shared(kern, (*args, out, n_rows))

    def fn():
        kern[grid, kern.threads, stream, kern.dyn_bytes](*args, out, n_rows)
    return fn, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=65)
    ap.add_argument("--workspace", type=int, default=128)
    ap.add_argument("--shapes", default="2048,3072;512,3072;2048,2048;2048,16384")
    ap.add_argument("--blocks", default="L,16,4;L,16,4,0;L,16,4,2;L,16,4,1,1;S,32,4;S,32,4,1;S,32,4,0,1,0,1;S,64,4;"
                    "S,64,4,0,0;S,32,4,0,0,1;S,64,8,0,0,1,1,1;S,32,8,0,0,1,1,1,2;"
                    "S,32,8,1,0,2,1;S,32,8,1,0,2,1,1;S,32,8,1,0,2,1,1,2;S,64,8,1,0,2,1,1,2;S,16,8,1,0,2,1,1")
    ap.add_argument("--ptx", metavar="PTXAS", help="no GPU: compile for sm_90a and assemble with this ptxas")
    a = ap.parse_args()
    blocks = [tuple(v if v in "LS" else int(v) for v in b.split(",")) for b in a.blocks.split(";")]
    if a.ptx:
        from numba.cuda import dispatcher

        from wgmma_probe import assemble_sm90a

        class H200:
            compute_capability = (9, 0)
        dispatcher.get_current_device = lambda: H200()
        for b in blocks:
            k = make(b)
            xt = "uint16" if b[0] == "S" and len(b) > 7 and b[7] else "float32"
            wt = "uint16[:, :, ::1]" if b[0] == "S" and len(b) > 5 and b[5] == 2 else "uint16[:, ::1]"
            sig = (f"void({xt}[:, ::1], {wt}, float32[:, ::1], int32[::1])" if b[0] in ("L", "S") else
                   "void(uint64[:, ::1], uint64[:, ::1], float32[:, ::1], int32[::1])")
            ptx, _ = cuda.compile_ptx(k.py_func, sig, cc=(9, 0, "a"))
            print(b, "ptxas:", assemble_sm90a(ptx, a.ptx))
        return
    import importlib
    L = importlib.import_module("ddtree_numba.kernels.linear")
    torch = None
    from ddtree_numba.dtypes import to_bf16_bits
    if SIM:                                  # bits only, at the shapes given (keep them small)

        def graph_time(fn, stream):
            return float("nan")
    else:
        cuda.get_current_device().compute_capability = (9, 0, "a")   # before any kernel compiles
        from _common import random_bf16
        from few_row_probe import torch_peer_us
        from gemm import graph_time
        try:
            import torch
        except ImportError:
            pass
    st = cuda.stream()
    n_rows = cuda.to_device(np.array([a.rows], np.int32), stream=st)
    rng = np.random.default_rng(0)
    kernels = {b: make(b) for b in blocks}
    print(f"rows {a.rows} in a {a.workspace}-row workspace; µs a launch (graph); wgmma blocks (BR, NS)")
    print("K,N".ljust(12) + "package".rjust(10) + "".join(str(b).rjust(16) for b in blocks)
          + ("torch".rjust(10) if torch else ""))
    for shape in a.shapes.split(";"):
        K, N = (int(v) for v in shape.split(","))
        if SIM:
            w = cuda.to_device(to_bf16_bits(rng.uniform(-0.05, 0.05, (1, N, K)).astype(np.float32)))
        else:
            w = random_bf16((N, K), 0.05, K * 7 + N, st).reshape(1, N, K)
        x = cuda.to_device(rng.standard_normal((a.workspace, K)).astype(np.float32), stream=st)
        ref_out = cuda.device_array((a.workspace, N), np.float32, stream=st)

        def package():
            L._launch(x, 0, w, None, ref_out, 0, n_rows, None, None, a.workspace, False, "bf16", st, None)
        package()
        ref = ref_out.copy_to_host(stream=st)[:a.rows]
        cols = [f"{graph_time(package, st):10.1f}"]
        for spec, kern in kernels.items():
            fn, out = launcher(spec, kern, x, w, n_rows, a.workspace, st)
            fn()
            got = out.copy_to_host(stream=st)[:a.rows]
            st.synchronize()
            diff = int((got.view(np.uint32) != ref.view(np.uint32)).sum())
            cols.append(f"{graph_time(fn, st):8.1f}" + (f" DIFF{diff}" if diff else "").ljust(8))
        line = f"{K},{N}".ljust(12) + "".join(c.rjust(10 if i == 0 else 16) for i, c in enumerate(cols))
        if torch:
            line += f"{torch_peer_us(a.rows, K, N):10.1f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
