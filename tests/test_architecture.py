"""The package's layers point one way (docs/DESIGN.md §2): no import cycle, no import from a
higher layer, and no private (underscore) name taken from outside the package that owns it.

Every ``import`` statement of every module is read with ``ast`` (function-level imports included:
a lazy import is still a dependency), so the rules hold for code paths a test run may not reach.
Each rule is also shown to fail on a small package made to break it.
"""

import ast
import os
from pathlib import Path

import pytest

import ddtree_numba

ROOT = Path(ddtree_numba.__file__).parent

# Lower layers first; a module may import from its own component or from a strictly lower layer.
# A component is a top-level module (``cli``) or subpackage (``kernels``) of ddtree_numba.
LAYERS = [
    ("tree", "dtypes"),          # numpy only: the Tree, the weight dtypes and their bit helpers
    ("_checks",),                # input checks shared by twins and launchers
    ("_device",),                # numba.cuda helpers shared by every kernel module; CUDA graphs
    ("reference",),              # the numpy twins
    ("kernels",),                # the numba.cuda kernels: launchers and the device tier
    ("model",),                  # config, checkpoints, numpy + cuda models, the loader
    ("decode",),                 # the host and device decode loops
    ("stats", "demo"),           # acceptance statistics; the demo pair and its runs
    ("plots",),                  # drawing
    ("cli",),                    # parsing and formatting
    ("__init__",),               # the package's face
]
RANK = {component: rank for rank, names in enumerate(LAYERS) for component in names}


def package_sources(root: Path, name: str) -> dict:
    """{dotted module name: source} for every module of the package at ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        parts = [name, *rel.parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path.read_text()
    return out


def is_package(modules: dict, dotted: str) -> bool:
    return any(m.startswith(dotted + ".") for m in modules)


def imports(modules: dict, module: str):
    """(line, target module, imported name or None) for each package-internal import of ``module``;
    ``from a import b`` names module ``a.b`` when that is a module, else module ``a`` and name b."""
    top = next(iter(modules)).split(".")[0]
    here = module if is_package(modules, module) else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(modules[module])):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == top:
                    yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                source = f"{base}.{node.module}" if node.module else base
            elif (node.module or "").split(".")[0] == top:
                source = node.module
            else:
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                yield (node.lineno, sub, None) if sub in modules else (node.lineno, source, alias.name)


def component(dotted: str) -> str:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_violations(modules: dict) -> list:
    bad = []
    for module in modules:
        mine = component(module)
        for line, target, _ in imports(modules, module):
            theirs = component(target)
            if theirs != mine and not (theirs in RANK and mine in RANK and RANK[theirs] < RANK[mine]):
                bad.append(f"{module}:{line} imports {target} (layer {theirs!r} is not below {mine!r})")
    return bad


def private_violations(modules: dict) -> list:
    """A private name (a ``_x`` module or attribute) may be used inside the package that owns it."""
    bad = []
    for module in modules:
        for line, target, name in imports(modules, module):
            parts = target.split(".") + ([name] if name else [])
            for i, part in enumerate(parts):
                if part.startswith("_") and not part.startswith("__"):
                    owner = ".".join(parts[:i])                        # the module or package holding it
                    if not is_package(modules, owner):
                        owner = owner.rsplit(".", 1)[0]                # a module's privates: its package's
                    if not (module == owner or module.startswith(owner + ".")):
                        bad.append(f"{module}:{line} takes the private {'.'.join(parts[:i + 1])} from {owner}")
                    break
    return bad


def import_cycles(modules: dict) -> list:
    """Every cycle of the module import graph (as lists of modules), found by depth-first search."""
    graph = {m: sorted({t for _, t, _ in imports(modules, m) if t in modules and t != m}) for m in modules}
    cycles, state, stack = [], {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in graph[m]:
            if state.get(t) == "open":
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = "done"

    for m in graph:
        if m not in state:
            visit(m)
    return cycles


MODULES = package_sources(ROOT, "ddtree_numba")


def test_every_component_has_a_layer():
    assert {component(m) for m in MODULES} <= set(RANK), sorted({component(m) for m in MODULES} - set(RANK))


def test_no_import_cycle():
    assert not import_cycles(MODULES), "\n".join(" -> ".join(c) for c in import_cycles(MODULES))


def test_imports_point_down_the_layers():
    assert not layer_violations(MODULES), "\n".join(layer_violations(MODULES))


def test_no_private_name_from_another_package():
    assert not private_violations(MODULES), "\n".join(private_violations(MODULES))


def test_importing_the_package_does_not_import_numba_cuda():
    """The numpy path (the README's first steps, the notebooks on a laptop) needs no CUDA stack."""
    import subprocess
    import sys
    code = ("import sys, ddtree_numba as dd; dd.load_target; import ddtree_numba.cli, ddtree_numba.plots; "
            "print([m for m in sys.modules if m.startswith('numba.cuda')])")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


# -- the checks can fail ------------------------------------------------------------------------

def _fake(tmp_path, files: dict) -> dict:
    for rel, text in files.items():
        path = tmp_path / "ddtree_numba" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package_sources(tmp_path / "ddtree_numba", "ddtree_numba")


def test_the_checks_catch_a_cycle_an_upward_import_and_a_private_name(tmp_path):
    fake = _fake(tmp_path, {
        "__init__.py": "",
        "decode/__init__.py": "from .host import run\n",
        "decode/host.py": "def run():\n    from ..cli import main\n    from . import rounds\n",
        "decode/rounds.py": "from .host import run\nfrom ..kernels.linear import _launch\n",
        "kernels/__init__.py": "",
        "kernels/linear.py": "from . import _widen\n_launch = 1\n",
        "kernels/_widen.py": "from .._checks import check_int\n",
        "_checks.py": "check_int = 1\n",
        "cli.py": "main = 1\n",
    })
    assert import_cycles(fake) == [["ddtree_numba.decode.host", "ddtree_numba.decode.rounds",
                                    "ddtree_numba.decode.host"]]
    assert layer_violations(fake) == [
        "ddtree_numba.decode.host:2 imports ddtree_numba.cli (layer 'cli' is not below 'decode')"]
    assert private_violations(fake) == [
        "ddtree_numba.decode.rounds:2 takes the private ddtree_numba.kernels.linear._launch "
        "from ddtree_numba.kernels"]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_module_says_what_it_is(module):
    """A module docstring: the first thing a reader of the layout sees (docs/DESIGN.md's map)."""
    assert ast.get_docstring(ast.parse(MODULES[module])), f"{module} has no docstring"
