"""The simulator's block scheduler as ``ddtree_numba._device`` replaces it (it waits to be told of
each barrier instead of polling): barriers still order a block's threads, threads that end early
do not hold a barrier, and a thread's exception is the one raised, with the others aborted."""

import numpy as np
import pytest
from numba import config, cuda

import ddtree_numba._device  # noqa: F401  (applies the patches)

pytestmark = pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="the simulator's scheduler only")


@cuda.jit
def _reverse_twice(a, out):
    """Each round every thread reads a value another thread wrote before the barrier."""
    buf = cuda.shared.array(64, np.float32)
    i = cuda.threadIdx.x
    n = cuda.blockDim.x
    buf[i] = a[cuda.blockIdx.x, i]
    for _ in range(3):
        cuda.syncthreads()
        v = buf[n - 1 - i]
        cuda.syncthreads()
        buf[i] = v + 1
    cuda.syncthreads()
    out[cuda.blockIdx.x, i] = buf[i]


@cuda.jit
def _early_exit(out):
    """Threads of odd index end before the barrier; the even ones meet at it and read each other."""
    buf = cuda.shared.array(32, np.int32)
    i = cuda.threadIdx.x
    if i % 2:
        return
    buf[i] = i
    cuda.syncthreads()
    out[i] = buf[(i + 2) % 32] + cuda.syncthreads_count(1)


@cuda.jit
def _one_thread_raises(a):
    i = cuda.threadIdx.x
    cuda.syncthreads()
    if i == 5:
        a[i + 100] = 1              # out of bounds: IndexError in the simulator
    cuda.syncthreads()
    a[i] = 1


def test_barriers_order_the_threads_of_each_block():
    a = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    out = cuda.device_array((3, 64), np.float32)
    _reverse_twice[3, 64](cuda.to_device(a), out)
    want = a.copy()
    for _ in range(3):
        want = want[:, ::-1] + np.float32(1)
    np.testing.assert_array_equal(out.copy_to_host(), want)


def test_threads_that_end_early_do_not_hold_a_barrier():
    out = cuda.to_device(np.full(32, -1, np.int32))
    _early_exit[1, 32](out)
    got = out.copy_to_host()
    even = np.arange(0, 32, 2)
    np.testing.assert_array_equal(got[even], (even + 2) % 32 + 16)   # 16 threads counted at the barrier
    np.testing.assert_array_equal(got[1::2], -1)


def test_the_failing_threads_exception_is_raised_not_the_others_abort():
    a = cuda.to_device(np.zeros(32, np.int32))
    with pytest.raises(IndexError, match="tid=\\[5, 0, 0\\]"):
        _one_thread_raises[1, 32](a)
    b = cuda.to_device(np.zeros(32, np.int32))   # the scheduler serves the next launch as usual
    _reverse_twice[1, 32](cuda.to_device(np.ones((1, 32), np.float32)), cuda.device_array((1, 32), np.float32))
    _one_thread_raises[1, 4](b)
    np.testing.assert_array_equal(b.copy_to_host()[:4], 1)
