"""The benchmark scripts stay in step with the kernels: their cases at tiny shapes in the
simulator, checked as the scripts check them on the H200. (``benchmarks/gemm.py``'s expert cases
had passed the experts' offsets where the grouped GEMMs take work items since the seventh
session; nothing ran them until an H200 run failed its check and faulted.)"""

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"

pytestmark = pytest.mark.kernels


@pytest.fixture
def gemm(monkeypatch):
    """benchmarks/gemm.py at tiny shapes, its random bf16 weights made on the host."""
    from numba import cuda
    from ddtree_numba.dtypes import to_bf16_bits
    monkeypatch.syspath_prepend(str(BENCH))
    mod = importlib.import_module("gemm")
    for name, value in dict(H=64, E=8, TOPK=2, DENSE_I=96, MOE_I=48, SHARED_I=80, VOCAB=100, HEADS=2, NOPE=16,
                            KV=32).items():
        monkeypatch.setattr(mod, name, value)
    host = np.random.default_rng(1)
    monkeypatch.setattr(mod, "random_bf16", lambda shape, scale, seed, stream=0: cuda.to_device(
        to_bf16_bits((host.standard_normal(shape) * scale).astype(np.float32))))
    return mod


def test_gemm_cases_match_the_twin_at_their_tiles_and_the_gpus_ring_tiles(gemm):
    """Every case of ``gemm.py`` at 5 rows, at the tile its launch picks here, and the expert cases
    at the tiles an H200 picks (the cp.async rings of 8- and 16-row work items): each output
    within the twin's bound (``gemm.check_case``)."""
    L = importlib.import_module("ddtree_numba.kernels.linear")
    rng = np.random.default_rng(0)
    gpu = gemm.Gpu("bf16")
    W, X, dX = gemm.build(gpu, L, rng, 5)
    checked = 0
    for c in gemm.cases(gpu, L, W, X, dX, 5, rng):
        tiles = [None] + ([L._FEW_EXPERT_RING, L._EXPERT_RING] if c["grouped"] else [])
        for tile in tiles:
            gemm.fresh_out(c)                   # NaN (zeros where it accumulates): every output written
            c["fn"](tile, "bf16")
            ok, worst = gemm.check_case(c, rng, "bf16")
            assert ok, (c["name"], tile, worst)
            checked += 1
    assert checked >= 15


def test_verify_trees_are_ddtree_builds():
    """``verify_forward.ddtree_tree``: n nodes, the root first, parents before children, depths
    that follow the parents, at most 15 deep."""
    sys.path.insert(0, str(BENCH))
    try:
        vf = importlib.import_module("verify_forward")
    finally:
        sys.path.remove(str(BENCH))
    for n in (1, 17, 65, 300):
        parents, depth = vf.ddtree_tree(np.random.default_rng(n), n)
        assert parents.shape == depth.shape == (n,)
        assert parents[0] == -1 and depth[0] == 0
        assert all(0 <= parents[i] < i and depth[i] == depth[parents[i]] + 1 for i in range(1, n))
        assert depth.max() <= 15


def test_verify_forward_dry_run(monkeypatch, capsys):
    """``verify_forward.py --dry-run``: a tiny config of the Moonlight architecture through the
    whole script (trees, workspace, forward, cost model, table), nothing appended."""
    monkeypatch.syspath_prepend(str(BENCH))
    vf = importlib.import_module("verify_forward")
    monkeypatch.setattr(sys, "argv", ["verify_forward.py", "--dry-run", "--nodes", "1", "3", "--layers", "1",
                                      "--prefix", "40", "--reps", "1", "--no-append", "--no-breakdown"])
    vf.main()
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if line.startswith(("| 1 |", "| 3 |"))]
    assert len(rows) == 2
