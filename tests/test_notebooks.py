"""Every notebook runs top to bottom on the CPU, and each .ipynb is its jupytext .py pair.

The .py (``# %%`` percent format) is the file to edit; ``jupytext --to ipynb`` regenerates
the .ipynb, which is committed without outputs.
"""

from __future__ import annotations

import os
from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
IPYNBS = sorted(NOTEBOOKS.glob("*.ipynb"))
CELL_TIMEOUT_S = 120

by_name = pytest.mark.parametrize("path", IPYNBS, ids=lambda p: p.name)


def test_every_notebook_has_its_py_pair():
    assert IPYNBS, "no notebooks found"
    scripts = sorted(NOTEBOOKS.glob("*.py"))
    assert {p.stem for p in IPYNBS} == {p.stem for p in scripts}


@by_name
def test_ipynb_matches_its_py(path):
    """Same cells, same types, same sources as ``jupytext --to ipynb`` of the .py."""
    want = jupytext.read(path.with_suffix(".py"))
    got = nbformat.read(path, as_version=4)
    want_cells = [(c.cell_type, c.source) for c in want.cells]
    got_cells = [(c.cell_type, c.source) for c in got.cells]
    for i, (w, g) in enumerate(zip(want_cells, got_cells)):
        assert g == w, f"cell {i} differs; rerun `jupytext --to ipynb {path.with_suffix('.py').name}`"
    assert len(got_cells) == len(want_cells), "cell count differs from the .py pair"
    assert got.metadata.get("kernelspec", {}).get("name") == "python3"


@by_name
def test_ipynb_is_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"cell {i} has outputs"


@by_name
def test_notebook_runs(path, monkeypatch):
    """Execute every cell in a fresh python3 kernel; any cell error fails the test."""
    # the kernel imports this working tree's package, installed or not
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    monkeypatch.delenv("MPLBACKEND", raising=False)   # the kernel's inline backend, as for a user
    # one BLAS thread in the kernel: beside CI's two busy xdist workers on two cores, OpenBLAS's
    # spinning threads made notebook 04's live sweep take 67 s instead of 13 (9 s on an idle
    # machine, either way), past the cell timeout in some runs; the demo's matrices are too small
    # for BLAS threads to help (ddtree_numba.demo limits them likewise)
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(name, "1")
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()                                  # raises CellExecutionError on any error
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            assert out.output_type != "error", f"cell {i} raised"
            if out.output_type == "stream" and out.name == "stderr":
                pytest.fail(f"cell {i} wrote to stderr:\n{out.text}")
    images = sum("image/png" in out.get("data", {})
                 for cell in nb.cells for out in cell.get("outputs", []))
    assert images > 0, "the notebook displayed no figures"
