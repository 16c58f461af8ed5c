"""Device helpers shared by the kernel modules: host/device conversion, block sizes, inlining."""

from __future__ import annotations

import numpy as np
from numba import config, cuda


def is_device(a) -> bool:
    """True for a numba device array (or the simulator's stand-in)."""
    return not isinstance(a, np.ndarray) and hasattr(a, "copy_to_host")


def to_device(a, stream=0):
    """A device view of ``a``: device arrays pass through, numpy arrays are copied over."""
    if is_device(a):
        return a
    return cuda.to_device(np.ascontiguousarray(a), stream=stream)


def check_threads(threads: int, lo: int = 1, hi: int = 1024) -> int:
    """Threads per block: a power of two in [lo, hi] (tree reductions halve it)."""
    if not isinstance(threads, (int, np.integer)) or threads < lo or threads > hi or threads & (threads - 1):
        raise ValueError(f"threads must be a power of two in [{lo}, {hi}], got {threads!r}")
    return int(threads)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def device_function(fn):
    """``cuda.jit(device=True)``, force-inlined on a GPU.

    Left as calls, device functions that take shared arrays pass the array descriptors
    through local memory, which cost microseconds a pop in the tree build. The simulator's
    jit takes no ``forceinline``.
    """
    if config.ENABLE_CUDASIM:
        return cuda.jit(device=True)(fn)
    return cuda.jit(device=True, forceinline=True)(fn)
