"""Asynchronous copies global -> shared memory from numba (``cp.async``, sm_80 and later).

A thread issues ``cp_async16(dst, di, src, si, nbytes)``: the 16 bytes at ``src[si]`` (two
uint64 words: ``si`` and the next) go to ``dst[di]`` (and the next word) in shared memory without
passing through registers, so a block can keep several chunks of weights in flight while it
multiplies another. ``nbytes`` (0 or 16) is how many bytes are read; the rest are zero-filled
(0: a slot past the matrix's edge reads nothing). The copies a thread issued since its last
``cp_async_commit()`` form a group; ``CP_ASYNC_WAIT[n]()`` waits until at most the ``n`` newest
groups of this thread are still in flight. Another thread's copies become visible only after the
wait *and* a ``cuda.syncthreads()``.

``cp_async16_at(dst, src, nbytes)`` is the same copy between addresses: ``dst`` a 32-bit shared
address from ``shared_address(arr, idx)``, ``src`` a 64-bit global address from
``global_address(arr, idx)``, both of 16-byte pieces, which a kernel works out once and then moves
by byte offsets (``load_u64(address)`` reads a global word the same way) (a kernel that issues many copies a chunk spends far fewer instructions on adding
an offset than on indexing an array).

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

    # Addresses in the simulator: an array's handle (its place in a small table) above a byte
    # offset into it, so that a kernel's address arithmetic works unchanged; 40 offset bits for
    # global arrays, 24 for shared ones (whose addresses are 32-bit).
    import collections

    _keys = collections.OrderedDict()         # (buffer, shape, strides, dtype) -> handle, the newest last
    _by_handle = {}                           # handle -> the array (kept alive: buffers stay unique)
    _lock = threading.Lock()

    def _address(arr, idx, bits):
        # keyed by the memory and its layout, not the object: every simulated thread makes its own
        # views of one launch's arrays, and they must share a handle
        key = (arr.__array_interface__["data"][0], arr.shape, arr.strides, arr.dtype.str)
        with _lock:
            h = _keys.get(key)
            if h is None:
                if len(_keys) >= 250:         # the oldest array is long out of use by then
                    _, old = _keys.popitem(last=False)
                    del _by_handle[old]
                h = next(h for h in range(1, 256) if h not in _by_handle)
                _keys[key] = h
                _by_handle[h] = arr
        # by strides, unchecked, as on the GPU: a kernel may form an address past a row's end
        # that it never reads from (a chunk past K)
        return (h << bits) + sum(int(i) * st for i, st in zip(idx, arr.strides))

    def _decode(address, bits):
        """(the array as a flat uint64 view, the word index) of an address."""
        h, off = int(address) >> bits, int(address) & ((1 << bits) - 1)
        assert off % 8 == 0, "a copy's pieces are whole uint64 words"
        return _by_handle[h].reshape(-1).view(np.uint64), off // 8

    def global_address(arr, idx):
        """The address of arr[idx] (a C-contiguous global array), as a uint64."""
        return np.uint64(_address(arr, idx, 40))

    def shared_address(arr, idx):
        """The address of arr[idx] (a shared array), as a uint32."""
        return np.uint32(_address(arr, idx, 24))

    def load_u64(address):
        """The uint64 word at a ``global_address``."""
        arr, w = _decode(address, 40)
        return arr[w]

    def cp_async16_at(dst, src, nbytes):
        """``cp_async16`` between addresses (``shared_address``, ``global_address``)."""
        darr, d0 = _decode(dst, 24)
        if nbytes:
            sarr, s0 = _decode(src, 40)
            v0, v1 = sarr[s0], sarr[s0 + 1]
        else:
            v0 = v1 = np.uint64(0)
        darr[d0] = darr[d0 + 1] = _POISON
        _groups().open.append((darr, (d0,), (d0 + 1,), v0, v1))
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

    @intrinsic
    def global_address(typingctx, arr, idx):
        """The address of arr[idx], as a uint64."""
        sig = types.uint64(arr, idx)

        def codegen(context, builder, signature, args):
            return _item_pointer(context, builder, signature.args[0], args[0], signature.args[1], args[1])

        return sig, codegen

    @intrinsic
    def shared_address(typingctx, arr, idx):
        """The shared-window address of arr[idx] (a shared array), as a uint32."""
        sig = types.uint32(arr, idx)

        def codegen(context, builder, signature, args):
            p = _item_pointer(context, builder, signature.args[0], args[0], signature.args[1], args[1])
            fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(64)])
            asm = ir.InlineAsm(fnty, "{ .reg .u64 sa; cvta.to.shared.u64 sa, $1; cvt.u32.u64 $0, sa; }", "=r,l")
            return builder.call(asm, [p])

        return sig, codegen

    @intrinsic
    def load_u64(typingctx, address):
        """The uint64 word at global address ``address`` (8-byte aligned)."""
        sig = types.uint64(address)

        def codegen(context, builder, signature, args):
            a = context.cast(builder, args[0], signature.args[0], types.uint64)
            # no side effect: the kernels read activations no launch writes while they run, so the
            # compiler may schedule the load freely
            asm = ir.InlineAsm(ir.FunctionType(ir.IntType(64), [ir.IntType(64)]), "ld.global.u64 $0, [$1];",
                               "=l,l")
            return builder.call(asm, [a])

        return sig, codegen

    @intrinsic
    def cp_async16_at(typingctx, dst, src, nbytes):
        """16 bytes from global address ``src`` to shared address ``dst``, ``nbytes`` of them read."""
        sig = types.void(dst, src, nbytes)

        def codegen(context, builder, signature, args):
            d = context.cast(builder, args[0], signature.args[0], types.uint32)
            s = context.cast(builder, args[1], signature.args[1], types.uint64)
            n = context.cast(builder, args[2], signature.args[2], types.uint32)
            fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(32), ir.IntType(64), ir.IntType(32)])
            asm = ir.InlineAsm(fnty, "cp.async.cg.shared.global [$0], [$1], 16, $2;", "r,l,r,~{memory}",
                               side_effect=True)
            builder.call(asm, [d, s, n])
            return context.get_dummy_value()

        return sig, codegen

    cp_async_commit = ptx_intrinsic("cp_async_commit", "cp.async.commit_group;")
    # one intrinsic a count: the PTX takes it as an immediate
    CP_ASYNC_WAIT = tuple(ptx_intrinsic(f"cp_async_wait{n}", f"cp.async.wait_group {n};") for n in range(4))
