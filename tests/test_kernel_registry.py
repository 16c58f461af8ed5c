"""Every kernel has a numpy twin of the same name, and every kernel compiles for the H200."""

import importlib
import inspect
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import ddtree_numba.kernels as kernels_pkg
import ddtree_numba.reference as reference_pkg


def _public_functions(module):
    return {name for name, obj in vars(module).items()
            if inspect.isfunction(obj) and obj.__module__ == module.__name__ and not name.startswith("_")}


def test_every_kernel_launcher_has_a_twin_of_the_same_name_in_the_same_stage():
    for info in pkgutil.iter_modules(kernels_pkg.__path__):
        if info.name.startswith("_"):
            continue
        kmod = importlib.import_module(f"ddtree_numba.kernels.{info.name}")
        rmod = importlib.import_module(f"ddtree_numba.reference.{info.name}")  # same stage module
        missing = _public_functions(kmod) - set(dir(rmod))
        assert not missing, f"kernels/{info.name}.py launchers without a twin: {sorted(missing)}"
        for name in _public_functions(kmod):
            assert getattr(kernels_pkg, name) is getattr(kmod, name)
            assert hasattr(reference_pkg, name)


def test_every_kernel_compiles_to_ptx_for_compute_capability_9_0():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    script = Path(__file__).with_name("compile_ptx.py")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
