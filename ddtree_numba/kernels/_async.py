"""Asynchronous copies global -> shared memory from numba (``cp.async``, sm_80 and later).

A thread issues ``cp_async16(dst, di, src, si, nbytes)``: the 16 bytes at ``src[si]`` (two
uint64 words: ``si`` and the next) go to ``dst[di]`` (and the next word) in shared memory without
passing through registers, so a block can keep several chunks of weights in flight while it
multiplies another. ``nbytes`` (0 or 16) is how many bytes are read; the rest are zero-filled
(0: a slot past the matrix's edge reads nothing). The copies a thread issued since its last
``cp_async_commit()`` form a group; ``CP_ASYNC_WAIT[n]()`` waits until at most the ``n`` newest
groups of this thread are still in flight. Another thread's copies become visible only after the
wait *and* a ``cuda.syncthreads()``.

Same route as ``_mma.py``: an ``intrinsic`` emitting PTX as LLVM inline assembly. The shared
destination is converted from numba's generic pointer with ``cvta.to.shared``; the source, a
generic pointer into global memory, is already a global address. Both must be 16-byte aligned.

In the simulator each copy happens at once (a plain store), and commit and wait do nothing: the
results are the same as long as the kernel waits and synchronizes before it reads a slot, which
only a GPU run (racecheck) can check.
"""

from __future__ import annotations

from numba import config, types

_SIM = bool(config.ENABLE_CUDASIM)

if _SIM:
    import numpy as np

    def cp_async16(dst, di, src, si, nbytes):
        """dst[di], dst[di + 1 word] = src[si], src[si + 1 word] (uint64 arrays), or zeros when
        ``nbytes`` is 0; immediately."""
        nxt_d = tuple(di[:-1]) + (di[-1] + 1,)
        if nbytes:
            nxt_s = tuple(si[:-1]) + (si[-1] + 1,)
            dst[tuple(di)] = src[tuple(si)]
            dst[nxt_d] = src[nxt_s]
        else:
            dst[tuple(di)] = np.uint64(0)
            dst[nxt_d] = np.uint64(0)

    def cp_async_commit():
        """Close this thread's group of copies (nothing to do in the simulator)."""

    def _wait():
        """Wait for this thread's older groups (nothing to do in the simulator)."""

    CP_ASYNC_WAIT = (_wait, _wait, _wait, _wait)
else:
    from llvmlite import ir
    from numba.core import cgutils
    from numba.cuda.extending import intrinsic

    def _item_pointer(context, builder, arrty, arr, idxty, idx):
        """The address of arr[idx] (idx an integer tuple), as an i64."""
        ary = context.make_array(arrty)(context, builder, arr)
        ind = [context.cast(builder, v, t, types.intp)
               for v, t in zip(cgutils.unpack_tuple(builder, idx, len(idxty)), idxty.types)]
        ptr = cgutils.get_item_pointer(context, builder, arrty, ary, ind, wraparound=False)
        return builder.ptrtoint(ptr, ir.IntType(64))

    @intrinsic
    def cp_async16(typingctx, dst, di, src, si, nbytes):
        """16 bytes src[si] -> dst[di] (shared), ``nbytes`` of them read, the rest zeros."""
        sig = types.void(dst, di, src, si, nbytes)

        def codegen(context, builder, signature, args):
            d = _item_pointer(context, builder, signature.args[0], args[0], signature.args[1], args[1])
            s = _item_pointer(context, builder, signature.args[2], args[2], signature.args[3], args[3])
            n = context.cast(builder, args[4], signature.args[4], types.uint32)
            fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(64), ir.IntType(64), ir.IntType(32)])
            asm = ir.InlineAsm(fnty, "{ .reg .u64 sa; cvta.to.shared.u64 sa, $0; "
                                     "cp.async.cg.shared.global [sa], [$1], 16, $2; }",
                               "l,l,r,~{memory}", side_effect=True)
            builder.call(asm, [d, s, n])
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def cp_async_commit(typingctx):
        """Close this thread's group of copies."""
        def codegen(context, builder, signature, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), "cp.async.commit_group;", "~{memory}",
                               side_effect=True)
            builder.call(asm, [])
            return context.get_dummy_value()

        return types.void(), codegen

    @intrinsic
    def _wait0(typingctx):
        def codegen(context, builder, signature, args):
            return _emit_wait(builder, 0, context)
        return types.void(), codegen

    @intrinsic
    def _wait1(typingctx):
        def codegen(context, builder, signature, args):
            return _emit_wait(builder, 1, context)
        return types.void(), codegen

    @intrinsic
    def _wait2(typingctx):
        def codegen(context, builder, signature, args):
            return _emit_wait(builder, 2, context)
        return types.void(), codegen

    @intrinsic
    def _wait3(typingctx):
        def codegen(context, builder, signature, args):
            return _emit_wait(builder, 3, context)
        return types.void(), codegen

    def _emit_wait(builder, n, context):
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), f"cp.async.wait_group {n};", "~{memory}",
                           side_effect=True)
        builder.call(asm, [])
        return context.get_dummy_value()

    # one intrinsic a count (the PTX takes it as an immediate), each with its own qualified name for
    # the kernel cache's closure fingerprints (_device.cached)
    CP_ASYNC_WAIT = (_wait0, _wait1, _wait2, _wait3)
