"""Simulator stand-ins (``NUMBA_ENABLE_CUDASIM=1``) for the wgmma probes' inline PTX, so their kernels
can be checked bit for bit on a CPU before they take device time.

Same names and meanings as the GPU intrinsics of ``tools/wgmma_probe.py`` and
``tools/wgmma_gemm_probe.py``'s ``_raw_intrinsics``:

- **Addresses.** A shared array gets a fake 32-bit address in its block's own shared window
  (``smem_base``, ``shared_address``: 1 KiB aligned, under 256 KiB, so a wgmma descriptor's 18-bit
  address field holds it); a global array a fake 64-bit one (``gmem_base``: a key in the high bits).
  ``lds64`` / ``lds128`` / ``sts32`` / ``ldg64`` / ``cp16`` / ``cp4`` resolve them back to the
  array and a byte offset.
- **cp.async** (``cp16``, ``cp4``) joins ``kernels/_async.py``'s simulated groups: the bytes are read
  at the copy, the destination holds NaNs until this thread's wait retires the group
  (``asm_void("cp.async.wait_group N")``), as the package's ``cp_async16`` stand-in does.
- **wgmma** (``wgmma_rs(n)``): the 128 threads of a warpgroup meet behind a barrier of their own;
  the last to arrive computes D = A @ B + C exactly (float64) and rounds once, as ``_mma.mma_bf16``'s
  stand-in does per m16n8k16, so a chain of k steps gives the package's simulated bits. A comes
  from the threads' registers (mma.sync's A fragments, warp w holding rows 16w..16w + 15), B from
  shared memory at the descriptor's address, K-major core matrices of 8 rows x 16 bytes, LBO along
  k and SBO along n (the layout ``tools/wgmma_bits.py`` found on the H200). The result reaches the
  accumulators only at ``wgmma.wait_group``: until then they hold NaNs, so a kernel that reads them
  early fails its bit test (a chained wgmma reads the pending values, as the hardware does).
- ``asm_void(text)``: the fences and commits are no-ops; the waits retire what they retire.
- Bulk copies (``bulk16``, ``bulk_n``) land at once and the mbarriers (``mbar_*``) pass: they check
  where the bytes go, not the waits (a kernel that skipped its mbarrier wait would pass here).
"""

from __future__ import annotations

import threading

import numpy as np

from ddtree_numba.kernels import _async

_lock = threading.Lock()
_POISON32 = np.uint32(0x7FC17FC1)
_globals: dict[int, np.ndarray] = {}          # key -> byte view of a global array
_global_keys: dict[int, int] = {}             # id(array) -> key


def _me():
    return threading.current_thread()


def _block_state():
    """This simulated block's shared registry and warpgroup barriers (the block's manager holds it)."""
    mgr = _me()._manager
    with _lock:
        st = mgr.__dict__.get("_wgmma_sim")
        if st is None:
            st = mgr.__dict__["_wgmma_sim"] = {"arrays": [], "next": 1024, "groups": {}}
    return st


def _bytes(arr):
    a = getattr(arr, "_ary", arr)
    return a.reshape(-1).view(np.uint8)


def _shared_base(arr) -> int:
    st = _block_state()
    buf = _bytes(arr)
    with _lock:
        for base, b in st["arrays"]:
            if b.ctypes.data == buf.ctypes.data and b.nbytes == buf.nbytes:
                return base
        base = st["next"]
        st["next"] = base + (buf.nbytes + 1023) // 1024 * 1024
        assert st["next"] <= 1 << 18, "the simulated shared window is 256 KiB"
        st["arrays"].append((base, buf))
    return base


def _shared(addr: int):
    """(byte view, offset) of a fake shared address."""
    for base, b in _block_state()["arrays"]:
        if base <= addr < base + b.nbytes:
            return b, addr - base
    raise IndexError(f"simulated shared address {addr:#x} is in no shared array")


def smem_base(arr):
    return np.uint32(_shared_base(arr))


def shared_address(arr):
    return np.uint64(_shared_base(arr))


def gmem_base(arr):
    a = getattr(arr, "_ary", arr)
    with _lock:
        key = _global_keys.get(id(a))
        if key is None or _globals[key].ctypes.data != _bytes(a).ctypes.data:
            key = _global_keys[id(a)] = len(_globals) + 1
            _globals[key] = _bytes(a)
    return np.uint64(key << 40)


def _global(addr: int):
    addr = int(addr)
    return _globals[addr >> 40], addr & ((1 << 40) - 1)


def lds64(saddr):
    b, o = _shared(int(saddr))
    return b[o:o + 8].view(np.uint64)[0]


def lds128(saddr):
    b, o = _shared(int(saddr))
    v = b[o:o + 16].view(np.float32)
    return v[0], v[1], v[2], v[3]


def sts32(saddr, v):
    b, o = _shared(int(saddr))
    b[o:o + 4].view(np.uint32)[0] = np.uint32(v)


def ldg64(gaddr):
    b, o = _global(gaddr)
    v = b[o:o + 8].view(np.float32)
    return v[0], v[1]


def _copy(saddr, gaddr, n, nbytes):
    """n bytes global -> shared, landing at this thread's wait (the package's cp.async groups)."""
    b, o = _shared(int(saddr))
    words = b[o:o + n].view(np.uint32)
    if nbytes:
        src, so = _global(gaddr)
        vals = src[so:so + n].view(np.uint32).copy()
    else:
        vals = np.zeros(n // 4, np.uint32)
    dst = b.view(np.uint32)
    for i in range(n // 4):
        words[i] = _POISON32
        idx = (o // 4 + i,)
        _async._groups().open.append((dst, idx, idx, vals[i], vals[i]))


def cp16(saddr, gaddr, nbytes):
    _copy(saddr, gaddr, 16, nbytes)


def cp4(saddr, gaddr):
    _copy(saddr, gaddr, 4, 4)


# -- wgmma --------------------------------------------------------------------------------------

def _pending():
    t = _me()
    if not hasattr(t, "_wgmma_pending"):
        t._wgmma_pending = {}
    return t._wgmma_pending


class _Group:
    def __init__(self, n):
        self.cv = threading.Condition()
        self.arrived = 0
        self.generation = 0
        self.n = n
        self.A, self.C = np.zeros((64, 16)), np.zeros((64, n))
        self.desc = None
        self.D = None


def _bf16(words: np.ndarray) -> np.ndarray:
    """uint16 bf16 bits -> float64."""
    return (words.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _read_b(desc: int, n: int) -> np.ndarray:
    """B [16, n] from shared memory at a no-swizzle K-major descriptor."""
    start, lbo, sbo = (desc & 0x3FFF) << 4, ((desc >> 16) & 0x3FFF) << 4, ((desc >> 32) & 0x3FFF) << 4
    b, o = _shared(start)
    B = np.empty((16, n))
    for kp in range(16):
        for j in range(n):
            at = o + (j // 8) * sbo + (kp // 8) * lbo + (j % 8) * 16 + (kp % 8) * 2
            B[kp, j] = _bf16(b[at:at + 2].view(np.uint16))[0]
    return B


def _unpack(word) -> tuple[float, float]:
    w = np.array([int(word) & 0xFFFF, int(word) >> 16], np.uint16)
    return tuple(_bf16(w))


def wgmma_rs(n, first=False):
    """acc (n/2 float32 a thread) += A (registers) @ B (shared, descriptor), m64nNk16 (``first``:
    acc = A @ B, its old values unread); the result reaches ``acc`` at ``wgmma.wait_group`` (module
    docstring)."""
    m = n // 2

    def wg(acc, a0, a1, a2, a3, desc):
        me = _me()
        tid = me.thread_id
        w, lane = (tid // 32) % 4, tid % 32
        g, t = lane // 4, lane % 4
        pend = _pending()
        c = np.zeros(m) if first else pend.get(id(acc), (acc, np.asarray(acc, np.float64).copy()))[1]
        st = _block_state()
        with _lock:
            grp = st["groups"].get(tid // 128)
            if grp is None or grp.n != n:
                grp = st["groups"][tid // 128] = _Group(n)
        r0 = 16 * w + g
        with grp.cv:
            grp.A[r0, 2 * t:2 * t + 2] = _unpack(a0)
            grp.A[r0 + 8, 2 * t:2 * t + 2] = _unpack(a1)
            grp.A[r0, 2 * t + 8:2 * t + 10] = _unpack(a2)
            grp.A[r0 + 8, 2 * t + 8:2 * t + 10] = _unpack(a3)
            for i in range(m):
                grp.C[r0 + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * t + i % 2] = c[i]
            if grp.desc is None:
                grp.desc = int(desc)
            elif grp.desc != int(desc):
                raise RuntimeError("the threads of a warpgroup passed different wgmma descriptors")
            generation = grp.generation
            grp.arrived += 1
            if grp.arrived == 128:
                grp.D = (grp.A @ _read_b(grp.desc, n) + grp.C).astype(np.float32)
                grp.arrived, grp.desc = 0, None
                grp.generation += 1
                grp.cv.notify_all()
            else:
                while grp.generation == generation:
                    grp.cv.wait(0.05)
                    if me.abort:
                        raise RuntimeError("simulated block aborted")
            D = grp.D
            res = np.array([D[r0 + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * t + i % 2] for i in range(m)], np.float32)
        pend[id(acc)] = (acc, res.astype(np.float64))
        acc[:m] = np.nan                                  # poisoned until the wait
    return wg


def _wgmma_wait():
    pend = _pending()
    for acc, vals in pend.values():
        acc[:vals.shape[0]] = vals.astype(np.float32)
    pend.clear()


def asm_void(text):
    """A statement of no operands: cp.async / wgmma waits act; fences and commits are no-ops."""
    if text.startswith("cp.async.wait_group"):
        n = int(text.split()[1].rstrip(";"))
        return _async._waiter(n)
    if text.startswith("wgmma.wait_group"):
        return _wgmma_wait        # (a wait for all: no probe keeps two groups in flight in the simulator)
    return lambda: None


# -- mbarriers and bulk copies (the probe's BULK variant): copies land at once; waits pass ---------

def mbar_init(bar, count):
    pass


def mbar_arrive_tx(bar, nbytes):
    pass


def bulk16(dst, src, bar):
    b, o = _shared(int(dst))
    g, go = _global(src)
    b[o:o + 16] = g[go:go + 16]


def mbar_try(bar, parity):
    return np.uint32(1)


def ldg32(gaddr):
    b, o = _global(gaddr)
    return b[o:o + 4].view(np.uint32)[0]


def bulk_n(dst, src, nbytes, bar):
    b, o = _shared(int(dst))
    g, go = _global(src)
    n = int(nbytes)
    b[o:o + n] = g[go:go + n]
