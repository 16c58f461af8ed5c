"""Every script in tools/ answers ``--help`` with its usage and does nothing else (no launch, no
file written): a newcomer reads a tool's usage before running it. (make_drafter_goldens.py used to
take ``--help`` as a run and rewrite the drafter goldens.)"""

import contextlib
import io
import os
import runpy
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"
MODULES = {"wgmma_sim.py"}          # imported by the wgmma probes, not run
NEEDS_TORCH = {"make_goldens.py", "make_drafter_goldens.py", "train_demo.py"}
SCRIPTS = sorted(p.name for p in TOOLS.glob("*.py") if not p.name.startswith("_") and p.name not in MODULES)


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_tool_answers_help_with_its_usage(name, monkeypatch, tmp_path):
    if name in NEEDS_TORCH:
        pytest.importorskip("torch")
        pytest.importorskip("transformers")
    if name == "wgmma_probe.py" and os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        pytest.skip("builds its GPU intrinsics at import, which the simulator lacks")
    monkeypatch.setattr(sys, "argv", [str(TOOLS / name), "--help"])
    monkeypatch.setattr(sys, "path", [str(TOOLS)] + sys.path)
    monkeypatch.chdir(tmp_path)                 # anything a tool wrote would land here
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(str(TOOLS / name), run_name="__main__")
        except SystemExit as stop:
            assert stop.code in (0, None), (name, stop.code)
    text = out.getvalue()
    assert "usage" in text.lower() or "python tools/" in text, (name, text[:300])
    assert not list(tmp_path.iterdir()), (name, list(tmp_path.iterdir()))
