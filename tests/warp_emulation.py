"""Warp operations for the CUDA simulator, so that a kernel's GPU branch (the one under ``WARP_OPS``,
which the simulator otherwise never runs) can be tested without a GPU.

``emulate_warps(monkeypatch, module, ...)`` gives the simulator's ``cuda`` the warp calls with
numba's types on a GPU (a ballot is an int32: a mask with lane 31 set is negative, and arithmetic
on it widens with its sign), and replaces each module's ``_warp`` helpers by emulations that do
what the GPU does (the xor butterflies in the same order, so sums have the GPU's bits), then sets
the module's ``WARP_OPS``. A lane exchange is a barrier of the warp's 32 threads, so blocks must
be whole warps, and every lane of a warp must make the same warp calls, as on a GPU.
``gpu_branch`` wraps it for a test: the kernel factories named are cleared before and after (they
read ``WARP_OPS`` when they build), and a real GPU skips (it runs the real warps). Why: the warp build's first GPU run failed on an int32 ballot that no simulator test
could see (docs/PERFORMANCE.md, forty-first session).
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest


def emulate_warps(monkeypatch, *modules):
    from numba.cuda.simulator import kernelapi

    warps, lock = {}, threading.Lock()

    def exchange(value):
        th = threading.current_thread()
        warp, lane = divmod(th.threadIdx.x, 32)
        with lock:
            bar, row = warps.setdefault((th.blockIdx.x, th.blockIdx.y, warp),
                                        (threading.Barrier(32, timeout=120), [None] * 32))
        bar.wait()
        row[lane] = value
        bar.wait()
        out = list(row)
        bar.wait()
        return out, lane

    def ballot_sync(self, mask, pred):
        vals, _ = exchange(bool(pred))
        return np.uint32(sum(1 << i for i, v in enumerate(vals) if v)).view(np.int32)

    def shfl_sync(self, mask, value, src):
        return exchange(value)[0][int(src) & 31]

    def shfl_xor_sync(self, mask, value, off):
        vals, lane = exchange(value)
        return vals[lane ^ int(off)]

    def lowest_lane(m):                        # _warp.lowest_lane's arithmetic, numpy's widening
        low = (m & (~m + np.uint32(1))) - np.uint32(1)
        return bin(int(low) & (2**64 - 1)).count("1")

    def group_max(x, lanes):
        vals, lane = exchange(x)
        g = lane // lanes * lanes
        return max(vals[g:g + lanes])

    def warp_sum(x):                           # the GPU's xor butterfly, step by step
        off = 16
        while off > 0:
            vals, lane = exchange(x)
            x = x + vals[lane ^ off]
            off //= 2
        return x

    def warp_inclusive_scan(x):
        off = 1
        while off < 32:
            vals, lane = exchange(x)
            if lane >= off:
                x = x + vals[lane - off]
            off *= 2
        return x

    helpers = {
        "warp_max_u64": lambda x: np.uint64(max(exchange(int(x))[0])),
        "warp_min_u64": lambda x: np.uint64(min(exchange(int(x))[0])),
        "lowest_lane": lowest_lane, "group_max": group_max, "warp_sum": warp_sum,
        "warp_inclusive_scan": warp_inclusive_scan,
    }
    monkeypatch.setattr(kernelapi.FakeCUDAModule, "ballot_sync", ballot_sync, raising=False)
    monkeypatch.setattr(kernelapi.FakeCUDAModule, "shfl_sync", shfl_sync, raising=False)
    monkeypatch.setattr(kernelapi.FakeCUDAModule, "shfl_xor_sync", shfl_xor_sync, raising=False)
    monkeypatch.setattr(kernelapi.FakeCUDAModule, "syncwarp",
                        lambda self, mask=0xFFFFFFFF: exchange(None) and None, raising=False)
    for module in modules:
        for name, fn in helpers.items():
            if hasattr(module, name):
                monkeypatch.setattr(module, name, fn)
        monkeypatch.setattr(module, "WARP_OPS", True)


@contextlib.contextmanager
def gpu_branch(monkeypatch, module, *factories):
    """``module`` (a kernels module) with its GPU branches on, in emulated warps, for the body of the
    ``with``; ``factories``: the names of its kernel factories the body launches, rebuilt for the
    GPU branch and cleared after (the next test builds the simulator's). Skips on a real GPU."""
    from conftest import REAL_GPU
    if REAL_GPU:
        pytest.skip("the emulation patches the simulator; a GPU runs the real warps")
    emulate_warps(monkeypatch, module)
    for name in factories:
        getattr(module, name).cache_clear()
    try:
        yield module
    finally:
        for name in factories:
            getattr(module, name).cache_clear()
