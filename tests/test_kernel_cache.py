"""The on-disk kernel cache's edges that need no GPU: the compile progress bar counts only the
kernels that compile, and an unwritable cache directory warns once and lets kernels compile
(a kernel must never fail because its cache cannot be written). The cache keys themselves:
tests/test_kernel_registry.py (stable across processes, distinct across variants)."""

import os
import subprocess
import sys
import textwrap

from ddtree_numba import _device


def test_the_compile_bar_counts_compiles_and_appears_only_when_one_happens():
    _device._compile_tick("outside")                     # no context: nothing, no error
    with _device.compile_progress("compiling") as _:
        state = _device._compile_bars[0]
        assert state["bar"] is None                      # nothing compiled yet: no bar
        with _device.compile_progress("inner"):          # nested: the outer bar counts
            _device._compile_tick("a")
        _device._compile_tick("b")
        bar = state["bar"]
        assert bar is not None and bar.n == 2 and bar.desc.startswith("compiling")
    assert _device._compile_bars == []


def test_an_unwritable_cache_directory_warns_once_and_does_not_fail(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    script = textwrap.dedent("""
        import warnings
        from ddtree_numba import _device

        def kernel(x):
            x[0] = 1

        class Data:
            codegen = None

        cache = _device._cache_classes()(kernel, {})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cache.save_overload("void(int32[::1])", Data())
            cache.save_overload("void(int32[::1])", Data())
        msgs = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        assert len(msgs) == 1 and "cannot write the kernel cache" in msgs[0], msgs
        print("OK")
    """)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["DDTREE_CACHE_DIR"] = str(blocker / "sub")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-2000:]
