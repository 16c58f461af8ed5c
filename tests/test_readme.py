"""The README's every command and snippet, run on the CPU as a newcomer would run them.

The two install commands are what ``.ci/run`` runs (the test command is this suite itself; the demo
command's ``ddtree-numba demo`` runs here). Python blocks run in order in one namespace from the
repository root (a block that starts with ``# on a GPU`` runs only on a real GPU); ``ddtree-numba``
commands run through ``cli.main`` in a scratch directory and must exit 0. A ``pip install`` of an
extra checks that the extra exists; ``jupyter lab notebooks/`` opens what test_notebooks executes.
"""

import configparser
import re
import shlex
from pathlib import Path

import pytest

import ddtree_numba.cli as cli

from conftest import REAL_GPU

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", README, re.S | re.M)]


def _commands(block):
    """Shell lines of a block, continuation backslashes joined."""
    return [ln.strip() for ln in block.replace("\\\n", " ").splitlines() if ln.strip()]


def test_the_readme_starts_with_the_two_commands_ci_runs():
    first = README.split("\n\n", 1)[1]
    assert first.startswith("```bash\n"), "the README starts with its two commands"
    lang, block = BLOCKS[0]
    demo, tests = _commands(block)
    assert demo == "pip install . && ddtree-numba demo"
    assert tests == 'pip install ".[test]" && NUMBA_ENABLE_CUDASIM=1 python -m pytest -n 2'
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -q --disable-pip-version-check ".[test]"' in ci
    assert "NUMBA_ENABLE_CUDASIM=1" in ci and "pytest -n 2" in ci


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A working directory where the README's relative paths (tests/data/...) resolve."""
    (tmp_path / "tests").symlink_to(ROOT / "tests")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _shell_lines():
    return [line for lang, block in BLOCKS if lang == "bash" for line in _commands(block)]


@pytest.mark.parametrize("block", [b for lang, b in BLOCKS if lang == "bash" and "ddtree-numba " in b],
                         ids=lambda b: _commands(b)[0][:60])
def test_every_command_runs(scratch, block, capsys):
    """A block's commands in order, in one directory (a sweep, then the plot of its JSON)."""
    for line in _commands(block):
        for part in line.split("&&"):
            words = shlex.split(part.strip())
            if words[0] != "ddtree-numba":                     # installs and the test command: the
                assert words[0] in ("pip", "jupyter") or "pytest" in words, line   # tests above, and .ci/run
                continue
            if words[1] == "demo":
                words += ["--no-progress"]
            rc = cli.main(words[1:])
            assert rc == 0, (line, capsys.readouterr().err)


def test_every_install_names_an_extra_that_exists():
    extras = configparser.ConfigParser()
    extras.read(ROOT / "setup.cfg")
    have = set(extras["options.extras_require"])
    for line in _shell_lines():
        for extra in re.findall(r'pip install "\.\[(\w+)\]"', line):
            assert extra in have, line
    notebooks = [ln for ln in _shell_lines() if "jupyter lab" in ln]
    assert notebooks and all((ROOT / "notebooks").is_dir() for _ in notebooks)
    assert "jupyterlab" in extras["options.extras_require"]["notebooks"]


def test_every_python_snippet_runs(monkeypatch):
    monkeypatch.chdir(ROOT)
    snippets = [block for lang, block in BLOCKS if lang == "python"]
    assert len(snippets) >= 4
    namespace = {}
    for block in snippets:
        if block.startswith("# on a GPU") and not REAL_GPU:
            continue
        exec(compile(block, "README.md", "exec"), namespace)      # noqa: S102 (the README is ours)
    assert "res" in namespace and "tree" in namespace
