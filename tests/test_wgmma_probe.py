"""The wgmma GEMM probe (tools/wgmma_gemm_probe.py) in the CUDA simulator: each of its designs gives
the package's GEMM bits (``kernels.linear._launch``), with the probes' inline PTX replaced by the
stand-ins of tools/wgmma_sim.py (wgmma computed exactly and rounded once per k step, as the
package's simulated mma.sync; its result and every cp.async slot poisoned until their waits).

On the H200 the probe checks the same bits itself (``tools/h200_wgmma.sh``). Here it guards the
probe against the package's drift and its own edits, before they cost device time. Tiny shapes:
two chunks of k (three for the odd-count case), 64 features, 9 live rows of a 16-row workspace.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from numba import config, cuda

pytestmark = pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="the simulator's check (the H200 runs the probe)")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

SPECS = [
    ("L", 8, 2),                   # weights in the A registers from a cp.async ring, B converted once a chunk
    ("L", 8, 4, 1, 1),             # ... the next chunk's B converted under the wgmma
    ("S", 16, 4, 1, 0, 0, 0, 0),   # operands swapped, 4-byte pieces in the package's lane order
    ("S", 16, 4, 0, 1, 1, 1),      # natural order, bulk copies on mbarriers, overlapped chunks
    ("S", 16, 4, 1, 0, 2, 1, 1),   # pre-tiled weights, one bulk copy a chunk; bf16 activations
]


def _inputs(K, workspace=16, N=64):
    """x [workspace, K] float32 and w [1, N, K] bf16 bits (host arrays), the same for every call."""
    from ddtree_numba.dtypes import to_bf16_bits
    rng = np.random.default_rng(7)
    w = to_bf16_bits(rng.uniform(-0.5, 0.5, (1, N, K)).astype(np.float32))
    return rng.standard_normal((workspace, K)).astype(np.float32), w


def _run(spec, K, tiles=None, rows=9, workspace=16):
    """(the spec's output, the package's) for the live rows."""
    import importlib

    import wgmma_gemm_probe as P
    L = importlib.import_module("ddtree_numba.kernels.linear")    # (the package exports a function of that name)
    x_host, w_host = _inputs(K, workspace)
    x, w = cuda.to_device(x_host), cuda.to_device(w_host)
    n_rows = cuda.to_device(np.array([rows], np.int32))
    ref = cuda.to_device(np.full((workspace, w_host.shape[1]), np.nan, np.float32))
    L._launch(x, 0, w, None, ref, 0, n_rows, None, None, workspace, False, "bf16", 0, None)
    fn, out = P.launcher(spec, P.make(spec), x, w, n_rows, workspace, 0, tiles=tiles)
    fn()
    return out.copy_to_host()[:rows], ref.copy_to_host()[:rows]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: ",".join(map(str, s)))
def test_each_probe_design_gives_the_package_bits(spec):
    got, want = _run(spec, K=128 if spec[0] == "L" else 192)
    assert np.isfinite(want).all()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_tiles_in_the_wrong_k_order_are_caught():
    """The check can fail: tiles laid out in natural k order under A words in the lanes' order pair
    different k in the products."""
    import wgmma_gemm_probe as P
    w = _inputs(128)[1][0]
    got, want = _run(("S", 16, 4, 1, 0, 2, 1, 1), K=128, tiles=P.tile_weights(w, 16, perm=False))
    assert not np.array_equal(got.view(np.uint32), want.view(np.uint32))
