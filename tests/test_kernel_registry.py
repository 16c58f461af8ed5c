"""Every kernel has a numpy twin of the same name, and every kernel compiles for the H200."""

import importlib
import inspect
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ddtree_numba.kernels as kernels_pkg
import ddtree_numba.reference as reference_pkg


def _public_functions(module):
    return {name for name, obj in vars(module).items()
            if inspect.isfunction(obj) and obj.__module__ == module.__name__ and not name.startswith("_")}


TWIN = re.compile(r"``reference\.(\w+)\.(\w+)``")


def test_every_kernel_launcher_has_a_twin_of_the_same_name_in_the_same_stage():
    """A launcher is named as its numpy twin; the device tier (``enqueue_*``) names its twin in its
    docstring, that twin exists, and it has a twin of its own name (and signature) in the same
    stage. Any other public function of a kernel module fails."""
    tier = 0
    for info in pkgutil.iter_modules(kernels_pkg.__path__):
        if info.name.startswith("_"):
            continue
        kmod = importlib.import_module(f"ddtree_numba.kernels.{info.name}")
        rmod = importlib.import_module(f"ddtree_numba.reference.{info.name}")  # same stage module
        launchers = {n for n in _public_functions(kmod) if not n.startswith("enqueue_")}
        missing = launchers - set(dir(rmod))
        assert not missing, f"kernels/{info.name}.py launchers without a twin: {sorted(missing)}"
        for name in launchers:
            assert getattr(kernels_pkg, name) is getattr(kmod, name)
            assert hasattr(reference_pkg, name)
        for name in _public_functions(kmod) - launchers:
            fn = getattr(kmod, name)
            twins = TWIN.findall(fn.__doc__ or "")
            assert twins, f"kernels/{info.name}.py: {name} names no twin (``reference.<stage>.<function>``)"
            for stage, twin in twins:
                assert hasattr(importlib.import_module(f"ddtree_numba.reference.{stage}"), twin), \
                    f"{name} names a twin that does not exist: reference.{stage}.{twin}"
            assert getattr(kernels_pkg, name) is fn, f"the device tier's {name} is not exported by kernels"
            assert hasattr(rmod, name), f"the device tier's {name} has no twin reference.{info.name}.{name}"
            params = lambda f: [(p.name, p.kind) for p in inspect.signature(f).parameters.values()]  # noqa: E731
            assert params(getattr(rmod, name)) == params(fn), f"reference.{info.name}.{name} takes other arguments"
            tier += 1
    assert tier >= 13        # the device tier the models are built from is public


def test_a_launcher_without_a_twin_would_fail(monkeypatch):
    """The check above can fail: a stray public function in a kernel module is caught."""
    kmod = importlib.import_module("ddtree_numba.kernels.linear")   # (kernels.linear is the launcher)

    def stray_launcher():
        """No twin."""

    stray_launcher.__module__ = kmod.__name__
    monkeypatch.setattr(kmod, "stray_launcher", stray_launcher, raising=False)
    with pytest.raises(AssertionError, match="stray_launcher"):
        test_every_kernel_launcher_has_a_twin_of_the_same_name_in_the_same_stage()


def test_every_kernel_waits_for_its_predecessors_before_anything_else():
    """Programmatic dependent launch (``_device.grid_dependency_after``): a kernel launched early may
    not touch global memory before its predecessors end, so its first statement (after the
    docstring) is ``grid_dependency_after((...))`` of all its parameters; ``uses_pdl`` (which
    launches are made early) sees it in every kernel and not in a kernel without it."""
    import ast
    import inspect
    import textwrap

    from types import SimpleNamespace

    from numba import cuda

    from compile_ptx import SIGNATURES, find_kernels
    from ddtree_numba._device import uses_pdl
    found = find_kernels()
    assert len(found) >= 30
    for name, (mod, obj) in sorted(found.items()):
        if hasattr(obj, "cache_info"):            # a factory: one of its variants (all share the source)
            entry = SIGNATURES[name][0]
            obj = obj(*entry[0]) if isinstance(entry, tuple) else obj(getattr(mod, "THREADS"))
        fn = obj.py_func
        body = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0].body
        if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        # grid_dependency_after over every parameter of the kernel, in order (none left out: a
        # parameter word read first after the wait costs a constant-cache miss there)
        params = [a.arg for a in ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0].args.args]
        want = f"grid_dependency_after(({', '.join(params)}{',' if len(params) == 1 else ''}))"
        assert ast.unparse(body[0]) == want, f"{name} begins with {ast.unparse(body[0])!r}"
        assert uses_pdl(SimpleNamespace(py_func=fn)), name

    @cuda.jit
    def plain(a):
        a[0] = 1

    assert not uses_pdl(plain)


PTX_SHARDS = 3   # ~5 minutes of compiling in all: in shards, the two CI workers share it


@pytest.mark.slow
@pytest.mark.parametrize("shard", range(PTX_SHARDS))
def test_every_kernel_compiles_to_ptx_for_compute_capability_9_0(shard):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["DDTREE_PDL"] = "trigger"                  # (compile_ptx.py asks every kernel for griddepcontrol.wait)
    script = Path(__file__).with_name("compile_ptx.py")
    proc = subprocess.run([sys.executable, str(script), "--shard", f"{shard}/{PTX_SHARDS}"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_kernel_has_an_on_disk_cache_key_that_is_the_same_in_every_process():
    """``_device.cached`` (DDTREE_CACHE=1): each kernel variant's cache key, built with the real
    numba-cuda cache classes (no GPU needed to build a key), is the same in two processes with
    different hash seeds (numba's own key for the tensor-core GEMMs is not: an intrinsic pickles
    with a per-process UUID) and differs between variants (a shared key would load the wrong
    kernel); in another PDL mode, or with the parameters read early, every key differs (the mode is
    part of it) and the index files and the source stamp are the same."""
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_ENABLE_CUDASIM", "DDTREE_PARAMS_EARLY")}
    env["DDTREE_PDL"] = "wait"
    script = Path(__file__).with_name("compile_ptx.py")
    outs = []
    for seed in ("1", "2"):
        proc = subprocess.run([sys.executable, str(script), "--fingerprints"], env=dict(env, PYTHONHASHSEED=seed),
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        outs.append(proc.stdout.splitlines())
    assert outs[0] == outs[1] and len(outs[0]) > 100
    keys = [line.split()[2] for line in outs[0]]
    assert len(set(keys)) == len(keys)
    # another PDL mode, or the parameters read early: the same index files and the same source stamp
    # (the entries of both side by side, neither wiping the other's), every key another
    stamp = "from ddtree_numba._device import package_stamp; print(package_stamp())"
    stamps = set()
    for mode, early in (("wait", "0"), ("trigger", "0"), ("wait", "1")):
        menv = dict(env, DDTREE_PDL=mode, DDTREE_PARAMS_EARLY=early)
        stamps.add(subprocess.run([sys.executable, "-c", stamp], env=menv, capture_output=True, text=True,
                                  timeout=300).stdout)
        if (mode, early) == ("wait", "0"):
            continue
        proc = subprocess.run([sys.executable, str(script), "--fingerprints"], env=menv,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        other = [line.split() for line in proc.stdout.splitlines()]
        assert [o[:2] for o in other] == [line.split()[:2] for line in outs[0]]
        assert not set(o[2] for o in other) & set(keys)
    assert len(stamps) == 1 and len(stamps.pop()) == 65


@pytest.mark.parametrize("hidden, env_pdl, env_early, mode", [
    (None, None, None, ("wait", False)),          # no target yet
    (256, None, None, ("trigger", True)),         # the demo's: launch-bound
    (1024, None, None, ("trigger", True)),
    (1025, None, None, ("wait", False)),
    (2048, None, None, ("wait", False)),          # Moonlight's
    (256, "off", None, ("off", False)),           # DDTREE_PDL decides
    (256, "wait", None, ("wait", False)),
    (2048, "trigger", None, ("trigger", True)),
    (256, None, "0", ("trigger", False)),         # DDTREE_PARAMS_EARLY decides the reads
    (2048, "wait", "1", ("wait", True)),
])
def test_the_pdl_mode_follows_the_environment_then_the_target_size(hidden, env_pdl, env_early, mode):
    from ddtree_numba._device import pdl_mode_for
    assert pdl_mode_for(hidden, env_pdl, env_early) == mode


_PDL_PROBE = """
import warnings
from numba import cuda
from ddtree_numba import _device as d

def kernel(a):
    d.grid_dependency_after((a,))
    a[0] = 1

def compile():
    ptx, _ = cuda.compile_ptx(kernel, "void(int32[::1])", cc=(9, 0))
    return "T" if "launch_dependents" in ptx else ("W" if "griddepcontrol.wait" in ptx else "-")

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = [{steps}]
print(*out, len(caught), caught[0].message if caught else "")
"""


@pytest.mark.parametrize("env, steps, expect", [
    # the first target's wish wins; a kernel compiled then has its PTX; a later wish is warned of once
    ({}, "d.prefer_pdl_mode(256), compile(), d.prefer_pdl_mode(2048), d.prefer_pdl_mode(2048)",
     "('trigger', True) T ('trigger', True) ('trigger', True) 1"),
    ({}, "d.prefer_pdl_mode(2048), d.prefer_pdl_mode(256), compile()", "('wait', False) ('wait', False) W 1"),
    # a kernel compiled before any target fixes the mode it was compiled in
    ({}, "compile(), d.prefer_pdl_mode(256)", "W ('wait', False) 1"),
    ({"DDTREE_PDL": "wait"}, "d.prefer_pdl_mode(256), compile()", "('wait', False) W 0"),
    ({"DDTREE_PDL": "off"}, "d.prefer_pdl_mode(256), compile()", "('off', False) - 0"),
])
def test_the_first_target_sets_the_pdl_mode_and_a_compile_fixes_it(env, steps, expect):
    """``prefer_pdl_mode`` (from ``CudaTarget``) sets the process's mode unless it is fixed; the
    first call, or a package kernel's compile (here ``cuda.compile_ptx``, as a launch or a cache
    load would), fixes it, and the compiled PTX is that mode's; another wish later is warned about
    once. A fresh process without the simulator (which keeps PDL off); no GPU is touched."""
    env = dict({k: v for k, v in os.environ.items()
                if k not in ("NUMBA_ENABLE_CUDASIM", "DDTREE_PDL", "DDTREE_PARAMS_EARLY")}, **env)
    proc = subprocess.run([sys.executable, "-c", _PDL_PROBE.format(steps=steps)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(expect), proc.stdout
    if not expect.endswith(" 0"):
        assert "kernels already run with PDL" in proc.stdout


def test_a_bad_pdl_setting_is_named_at_import():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    for name, value in (("DDTREE_PDL", "sometimes"), ("DDTREE_PARAMS_EARLY", "yes")):
        proc = subprocess.run([sys.executable, "-c", "import ddtree_numba._device"], env=dict(env, **{name: value}),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode != 0 and f"{name} must be" in proc.stderr and repr(value) in proc.stderr
