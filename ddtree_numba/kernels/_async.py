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

In the simulator a copy lands only when this thread's wait retires its group; until then its
destination holds a NaN pattern. So a kernel that reads a slot before waiting for it, or issues a
copy into a slot another warp still reads, computes NaNs there and fails its bit tests (the
ordering racecheck checks on the GPU). Another thread's copies show once that thread has waited,
which a kernel always follows with a barrier.
"""

from __future__ import annotations

from numba import config, types

_SIM = bool(config.ENABLE_CUDASIM)

if _SIM:
    import threading

    import numpy as np

    _POISON = np.uint64(0x7FC17FC17FC17FC1)   # four bf16 NaNs: what a slot holds before its wait
    _pending = threading.local()              # this simulated thread's copies: (open, closed groups)

    def _groups():
        if not hasattr(_pending, "open"):
            _pending.open, _pending.closed = [], []
        return _pending

    def cp_async16(dst, di, src, si, nbytes):
        """Read src[si], src[si + 1 word] (uint64 arrays; zeros when ``nbytes`` is 0) now, poison
        dst[di], dst[di + 1 word], and write them there when a wait retires this copy's group."""
        nxt_d = tuple(di[:-1]) + (di[-1] + 1,)
        if nbytes:
            v0, v1 = src[tuple(si)], src[tuple(si[:-1]) + (si[-1] + 1,)]
        else:
            v0 = v1 = np.uint64(0)
        dst[tuple(di)] = dst[nxt_d] = _POISON
        _groups().open.append((dst, tuple(di), nxt_d, v0, v1))

    def cp_async_commit():
        """Close this thread's group of copies."""
        g = _groups()
        g.closed.append(g.open)
        g.open = []

    def _waiter(n):
        def wait():
            """Land this thread's groups but the ``n`` newest."""
            g = _groups()
            while len(g.closed) > n:
                for dst, d0, d1, v0, v1 in g.closed.pop(0):
                    dst[d0], dst[d1] = v0, v1
        return wait

    CP_ASYNC_WAIT = tuple(_waiter(n) for n in range(4))
else:
    from llvmlite import ir
    from numba.core import cgutils
    from numba.cuda.extending import intrinsic

    from .._device import ptx_intrinsic

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

    cp_async_commit = ptx_intrinsic("cp_async_commit", "cp.async.commit_group;")
    # one intrinsic a count: the PTX takes it as an immediate
    CP_ASYNC_WAIT = tuple(ptx_intrinsic(f"cp_async_wait{n}", f"cp.async.wait_group {n};") for n in range(4))
