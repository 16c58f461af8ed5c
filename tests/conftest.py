"""Shared test setup: kernels run in numba's CUDA simulator unless a real GPU is present."""

import os

import numpy as np
import pytest

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def _real_gpu() -> bool:
    if SIMULATOR:
        return False
    try:
        from numba import cuda
        return cuda.is_available()
    except Exception:
        return False


REAL_GPU = _real_gpu()
# Under the simulator every thread is a Python thread: tiny blocks keep it fast and still
# exercise the strided and multi-level reduction paths. On a GPU, use the real sizes.
THREADS = 8 if not REAL_GPU else 128
# Relative error of a GEMM in the tensor cores' 'fp32' mode against float32 arithmetic: each
# operand is split into two bf16, which leaves up to 2^-16 of it (reference.linear.bf16_split);
# three such residuals a product, ~4.6e-5 at worst, far less on average.
FP32_MODE_REL = 5e-5


def load_cuda_target(path, **kw):
    """``dd.load_target(path, backend="cuda")`` with faithful float32 GEMMs (``precision='fp32'``,
    the HF goldens' tolerance) unless ``precision`` is given; in the simulator every GEMM of its
    forwards takes the one-warp tile (the same bits by the reduction contract,
    tests/test_linear_kernel.py holds every tile to it)."""
    import ddtree_numba as dd
    from ddtree_numba.kernels import TILES
    kw.setdefault("precision", "fp32")
    return dd.load_target(path, backend="cuda", gemm_tile=None if REAL_GPU else TILES["small"], **kw)


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a real CUDA GPU (not the simulator)")
    skip_kernels = pytest.mark.skip(reason="no CUDA GPU and NUMBA_ENABLE_CUDASIM is not set")
    for item in items:
        if "gpu" in item.keywords and not REAL_GPU:
            item.add_marker(skip_gpu)
        if "kernels" in item.keywords and not (REAL_GPU or SIMULATOR):
            item.add_marker(skip_kernels)
    # The longest tests first, in both halves: --dist worksteal (setup.cfg) gives each of the two CI
    # workers half of the list and moves only queued tests, from the tail; a slow test started
    # late can leave the other worker idle for minutes at the end.
    slow = [item for item in items if "slow" in item.keywords]
    rest = [item for item in items if "slow" not in item.keywords]
    first = len(items) // 2 - len(slow[0::2])
    items[:] = slow[0::2] + rest[:first] + slow[1::2] + rest[first:]


@pytest.fixture
def rng(request):
    """A generator seeded from the test's name: fresh per test, reproducible per run."""
    seed = abs(hash(request.node.nodeid)) % 2**32 if os.environ.get("DDTREE_FRESH") else \
        sum(map(ord, request.node.nodeid))
    return np.random.default_rng(seed)
