"""Device helpers shared by the kernel modules: host/device conversion, block sizes, inlining."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import sys
import warnings

import numpy as np
from numba import config, cuda

from ._checks import check_array
from .dtypes import QUANTIZED

# Several stages launch few blocks on purpose (one block builds the tree, one walks it, decode
# attention at one node); numba would warn about "low occupancy" at each of their launches. The
# user's own NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS setting wins.
if "NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS" not in os.environ:
    config.CUDA_LOW_OCCUPANCY_WARNINGS = 0
    try:                                   # numba-cuda >= 0.2x reads its own copy of the setting
        from numba.cuda.core import config as _cuda_config
        _cuda_config.CUDA_LOW_OCCUPANCY_WARNINGS = 0
    except ImportError:
        pass

# The simulator runs a block's threads as Python threads and its barriers hand the GIL from
# thread to thread (the tensor-core emulation meets at one per mma). With numba's polling block
# scheduler a 50 µs switch interval made them ~10x cheaper than Python's default 5 ms; with the
# scheduler below, which waits instead of polling, 1 ms is the quickest measured (a forward of a
# test golden: 5.8 s at 50 µs, 4.2-4.6 s at 1-5 ms, 15.3 s with the polling scheduler at 50 µs).
if config.ENABLE_CUDASIM and sys.getswitchinterval() == 0.005:
    sys.setswitchinterval(1e-3)


def _patch_simulator_shared_arrays() -> None:
    """numba-cuda's simulator (0.30) makes a block's shared array when the first of its threads
    asks for it, keyed by the calling line, with no lock between the lookup and the store: two
    threads of a block could each make one and then never see each other's writes (seen as rare,
    wrong simulator results once the GIL switches threads often, above). The same lookup under a
    lock, with the caller found from its frame (not a whole formatted stack: faster too)."""
    import threading

    from numba.cuda.simulator.kernelapi import FakeCUDAShared
    from numba.np import numpy_support
    from numba.core import types

    original = FakeCUDAShared.array
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if alignment is not None or shape == 0:          # an error, or dynamic shared memory
            return original(self, shape, dtype, alignment)
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        frame = sys._getframe(1)
        caller = (frame.f_code.co_filename, frame.f_lineno)
        with lock:
            res = self._allocations.get(caller)
            if res is None:
                res = self._allocations[caller] = np.empty(shape, dtype)
        return res

    FakeCUDAShared.array = array


def _patch_simulator_block_scheduler() -> None:
    """numba-cuda's simulator (0.30) runs a block as one Python thread a CUDA thread, and its
    ``BlockManager.run`` finds the barriers by polling: the launching thread loops over every
    thread of the block (``is_alive``, ``syncthreads_blocked``) without ever waiting, so it takes
    the GIL from the threads it waits for at every switch interval. Measured on a forward of the
    test goldens: most of the launching thread's time, ~1.5 M ``is_alive`` calls a forward.

    The same schedule, told instead of polled: a thread that reaches ``syncthreads`` or ends
    says so under one condition, and the launching thread sleeps on it until every live thread
    of the block is at the barrier (it then releases them all) or has ended. As before, the
    first exception of a thread aborts the others (their next barrier raises) and is raised."""
    import inspect
    import threading

    from numba.cuda.simulator import kernel as sim_kernel

    # The replacement uses the simulator's internals as numba-cuda 0.30 has them; a version whose
    # block classes differ keeps its own scheduler (slower, never wrong).
    if (list(inspect.signature(sim_kernel.BlockThread.__init__).parameters)
            != ["self", "f", "manager", "blockIdx", "threadIdx", "debug"]
            or list(inspect.signature(sim_kernel.BlockManager.__init__).parameters)
            != ["self", "f", "grid_dim", "block_dim", "debug"]):
        return

    def syncthreads(self):
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads call")
        manager = self._manager
        with manager._told:
            manager._at_barrier.append(self)
            manager._told.notify()
        self.syncthreads_event.wait()
        self.syncthreads_event.clear()
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads clear")

    def run(self, grid_point, *args):
        told = self._told = threading.Condition()
        at_barrier = self._at_barrier = []
        failed = []
        live = [0]

        def target():
            try:
                self._f(*args)
            except BaseException:
                failed.append(threading.current_thread())
                raise                         # (BlockThread.run records it as the thread's exception)
            finally:
                with told:
                    live[0] -= 1
                    told.notify()

        threads = []
        for block_point in np.ndindex(*self._block_dim):
            threads.append(sim_kernel.BlockThread(target, self, grid_point, block_point, self._debug))
        live[0] = len(threads)
        for t in threads:
            t.start()
        with told:
            while live[0] and not failed:
                if len(at_barrier) == live[0]:
                    for t in at_barrier:
                        t.syncthreads_event.set()
                    at_barrier.clear()
                else:
                    told.wait()
        if failed:
            for t in threads:                 # every other thread raises at its next barrier
                t.abort = True
                t.syncthreads_event.set()
        for t in threads:
            t.join()
        for t in failed[:1] + threads:        # the first to fail (the others may only have aborted)
            if t.exception:
                raise t.exception[0].with_traceback(t.exception[1])

    sim_kernel.BlockThread.syncthreads = syncthreads
    sim_kernel.BlockManager.run = run


if config.ENABLE_CUDASIM:
    _patch_simulator_shared_arrays()
    _patch_simulator_block_scheduler()


# Line tables in the compiled kernels that opt in, for Nsight Compute's source view
# (DDTREE_LINEINFO=1; tools/profile_tree.py). Off by default: nothing else changes.
LINEINFO = os.environ.get("DDTREE_LINEINFO") == "1"


def is_device(a) -> bool:
    """True for a numba device array (or the simulator's stand-in)."""
    return not isinstance(a, np.ndarray) and hasattr(a, "copy_to_host")


def to_device(a, stream=0):
    """A device view of ``a``: device arrays pass through, numpy arrays are copied over, a
    quantized weight (``dtypes.QUANTIZED``) gets its arrays so."""
    if isinstance(a, QUANTIZED):
        return a.with_arrays(to_device(a.data, stream), to_device(a.scale, stream))
    if is_device(a):
        return a
    return cuda.to_device(np.ascontiguousarray(a), stream=stream)


def float32_out(out, shape, stream=0):
    """A launcher's output array: ``out`` (checked to be float32 of ``shape``), or a new device
    array of that shape when ``out`` is None."""
    if out is None:
        return cuda.device_array(shape, np.float32, stream=stream)
    check_array("out", out, len(shape), np.float32, shape=shape)
    return out


def launcher_result(y, out, first_input, stream=0):
    """What a launcher returns: numpy in, numpy out (a host copy of ``y`` when no ``out`` was
    given and ``first_input`` is a host array); otherwise the device array ``y``."""
    if out is None and not is_device(first_input):
        return y.copy_to_host(stream=stream)
    return y


def rows_device(n: int, stream=0):
    """int32[1] on the device holding a row count (kernels read the sizes that change between
    calls from the device, so graph replays can follow them)."""
    return to_device(np.array([n], np.int32), stream)


def check_threads(threads: int, lo: int = 1, hi: int = 1024) -> int:
    """Threads per block: a power of two in [lo, hi] (tree reductions halve it)."""
    if (not isinstance(threads, (int, np.integer)) or isinstance(threads, (bool, np.bool_)) or threads < lo
            or threads > hi or threads & (threads - 1)):
        raise ValueError(f"threads must be a power of two in [{lo}, {hi}], got {threads!r}")
    return int(threads)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def by_bound(table, value: int):
    """The choice of ``table`` ((bound, choice) pairs, ascending, the last bound None) for
    ``value``: the first whose bound is at least ``value`` (the kernels' tile tables by rows)."""
    return next(choice for bound, choice in table if bound is None or value <= bound)


def device_function(fn):
    """``cuda.jit(device=True)``, force-inlined on a GPU.

    Left as calls, device functions that take shared arrays pass the array descriptors
    through local memory, which cost microseconds a pop in the tree build. In the simulator it
    is the function itself (below).
    """
    if config.ENABLE_CUDASIM:
        # The simulator would wrap every call in a swap of the module's ``cuda`` global, under a
        # lock all the block's threads contend for (milliseconds a call): a plain Python function
        # means the same there, as long as any ``cuda`` it uses (a barrier) is that of the module
        # of the kernels calling it, which the simulator swaps (kernels/rms_norm.py's _inv_rms).
        return fn
    return cuda.jit(device=True, forceinline=True)(fn)


# -- kernels cached on disk (on by default; DDTREE_CACHE=0 turns it off) -----------------------------
# numba's own cache=True keys a kernel on its bytecode and a pickle of its closure cells, under the
# mtime of its own source file. Here most kernels come from factories (closures over tile sizes and
# device functions), and a cell that reaches an @intrinsic (the tensor-core mma, kernels/_mma.py)
# pickles with a per-process UUID: those kernels would compile again in every process. So the
# package's cache keys a kernel on a fingerprint of its closure (constants by value, functions and
# dispatchers by qualified name and, recursively, their own closures) and on one hash of every
# source file of the package (a change to a device function in another module must not load a
# stale kernel). One index file per kernel variant. Measured on the H200 (docs/PERFORMANCE.md): a
# second process reaches the demo's first token in 2.2 s instead of 35.6 s.
CACHE = os.environ.get("DDTREE_CACHE", "1") != "0" and not config.ENABLE_CUDASIM
CACHE_DIR = os.environ.get("DDTREE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "ddtree_numba")
_compile_bars: list = []        # the open ``compile_progress`` contexts' state, innermost last
_unwritable_warned: list = []


@contextlib.contextmanager
def compile_progress(desc: str = "compiling GPU kernels"):
    """While open, each kernel that is compiled (not loaded from the on-disk cache) ticks a tqdm
    bar, made at the first one, so a warm-up that compiles shows it and one that loads shows
    nothing. Nested contexts share the outer bar."""
    if _compile_bars:
        yield
        return
    state = {"desc": desc, "bar": None}
    _compile_bars.append(state)
    try:
        yield
    finally:
        _compile_bars.pop()
        if state["bar"] is not None:
            state["bar"].close()


def _compile_tick(name: str) -> None:
    if not _compile_bars:
        return
    state = _compile_bars[0]
    if state["bar"] is None:
        from tqdm.auto import tqdm
        state["bar"] = tqdm(desc=state["desc"], unit="kernel", leave=False)
    state["bar"].set_postfix_str(name, refresh=False)
    state["bar"].update(1)


def closure_fingerprint(fn, _depth: int = 0) -> str:
    """A string that names what ``fn``'s closure holds, the same in every process: numbers,
    strings, None and numba / numpy types by value, tuples element by element, functions and
    dispatchers by module and qualified name plus their own closures. Anything else falls back to
    its repr (an address in it makes the key miss, never match wrongly)."""
    import numpy as _np

    def one(v, depth):
        if v is None or isinstance(v, (bool, int, float, str, bytes, _np.generic, _np.dtype)):
            return repr(v)
        if isinstance(v, (tuple, list)):
            return "(" + ",".join(one(x, depth) for x in v) + ")"
        inner = getattr(v, "py_func", None) or getattr(v, "_defn", None) or v   # dispatcher, intrinsic
        if callable(inner) and hasattr(inner, "__qualname__"):
            name = f"{getattr(inner, '__module__', '?')}.{inner.__qualname__}"
            if depth < 8 and getattr(inner, "__closure__", None):
                name += "[" + closure_fingerprint(inner, depth + 1) + "]"
            return name
        return repr(v)                     # numba types (float32, ...) print their name

    cells = getattr(fn, "__closure__", None) or ()
    return ",".join(one(c.cell_contents, _depth) for c in cells)


@functools.lru_cache(maxsize=None)
def package_stamp() -> str:
    """sha256 over every source file of the package, in path order: the cache's freshness."""
    root = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                h.update(os.path.relpath(path, root).encode())
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _cache_classes():
    """The numba-cuda cache subclasses (made on first use: numba-cuda internals, GPU only)."""
    import numba_cuda
    from numba.cuda.core.caching import _CacheLocator
    from numba.cuda.dispatcher import CUDACache, CUDACacheImpl

    class Locator(_CacheLocator):
        def __init__(self, py_func, py_file):
            self._variant = hashlib.sha256(closure_fingerprint(py_func).encode()).hexdigest()[:16]
            self._lineno = py_func.__code__.co_firstlineno

        def get_cache_path(self):
            return CACHE_DIR

        def get_source_stamp(self):
            return package_stamp()

        def get_disambiguator(self):       # one index file per variant of a factory's kernel
            return f"{self._lineno}-{self._variant}"

        @classmethod
        def from_function(cls, py_func, py_file):
            return cls(py_func, py_file)

    class Impl(CUDACacheImpl):
        _locator_classes = [Locator]

    class PackageCache(CUDACache):
        _impl_class = Impl

        def __init__(self, py_func, options):
            self._options = repr(sorted(options.items()))
            super().__init__(py_func)

        def _index_key(self, sig, codegen):
            code = hashlib.sha256(self._py_func.__code__.co_code).hexdigest()
            closure = hashlib.sha256(closure_fingerprint(self._py_func).encode()).hexdigest()
            # the PDL mode changes what grid_dependency_after emits: one entry a mode, side by side in
            # a kernel's index (a demo process and a large target's then keep each other's cache)
            key = (sig, codegen.magic_tuple(), numba_cuda.__version__, (code, closure, self._options),
                   ("pdl", *_fix_pdl_mode()))
            if self._launch_config_key is not None:
                key += (("launch_config", self._launch_config_key),)
            return key

        def load_overload(self, sig, target_context):
            data = super().load_overload(sig, target_context)
            if data is None:                   # the dispatcher compiles it now
                _compile_tick(self._py_func.__qualname__.split(".<locals>")[0])
            return data

        def save_overload(self, sig, data):
            try:
                super().save_overload(sig, data)
            except OSError as exc:             # an unwritable cache: compile every time, say so once
                if not _unwritable_warned:
                    _unwritable_warned.append(True)
                    warnings.warn(f"ddtree_numba: cannot write the kernel cache {CACHE_DIR} ({exc}); "
                                  "kernels will compile in every process (set DDTREE_CACHE_DIR, or "
                                  "DDTREE_CACHE=0 to silence this)", RuntimeWarning, stacklevel=2)

    return PackageCache


def cached(dispatcher):
    """Decorate a ``cuda.jit`` kernel (written above ``@cuda.jit``): on a GPU its compiled code is
    saved under ``DDTREE_CACHE_DIR`` (default ``~/.cache/ddtree_numba``) and loaded by later
    processes; with ``DDTREE_CACHE=0``, or in the simulator, the dispatcher as it is."""
    if CACHE:
        dispatcher._cache = _cache_classes()(dispatcher.py_func, dict(dispatcher.targetoptions))
    return dispatcher


# -- the fused multiply-add every reduction contract is written in --------------------------------
# The simulator runs kernels as Python, where cuda.fma is a stub: a numpy stand-in with the same
# meaning. (Widening stored weights: kernels/_widen.py.)
if config.ENABLE_CUDASIM:
    def fma(a, b, c):
        """a * b + c rounded once (float64 holds the float32 product exactly)."""
        return np.float32(np.float64(a) * np.float64(b) + np.float64(c))
else:
    @device_function
    def fma(a, b, c):
        """a * b + c rounded once (an explicit fma: the compiler may not choose)."""
        return cuda.fma(a, b, c)


if config.ENABLE_CUDASIM:
    def nonneg(i):
        return i
else:
    from numba import int64, uint32

    @device_function
    def nonneg(i):
        """i (an int32 known >= 0: a thread or block index) as int64 through a zero extension, so
        the compiler drops the sign fix-ups of floor division and of negative-index wraparound
        (about five integer instructions a shared-memory load in an inner loop)."""
        return int64(uint32(i))


# -- programmatic dependent launch (PDL, sm_90): a kernel launched before its predecessor ends --------
# Every kernel of the package begins with ``grid_dependency_after((its parameters))``, below, which
# is ``grid_dependency()`` with its parameters possibly read first (tests/test_kernel_registry.py
# holds them to it): ``griddepcontrol.wait`` holds the kernel until the kernels it depends on
# have finished and their writes are visible, so no read or write of global memory can come before
# their end, and a kernel launched with programmatic stream serialization may be *launched* (its
# blocks placed, its arguments read) while its predecessor still runs. Such launches are what
# ``install_pdl_launches`` makes of every launch of a kernel that calls either; a
# stream capture records them as programmatic edges of the graph. The modes: 'off' (ordinary
# launches; grid_dependency() emits nothing), 'wait' (the next kernel launched when this one's
# blocks have all exited, its launch overlapping this one's end),
# 'trigger' (``griddepcontrol.wait`` and then ``griddepcontrol.launch_dependents``: the next kernel
# is launched once all of this one's blocks have passed their wait, and waits on the GPU; one
# kernel ahead, never more). The A/B on the H200 (9ba789d, one run, docs/PERFORMANCE.md "PDL"),
# off / wait / trigger: Moonlight verify 5.50 / 5.20 / 5.37 ms at one node, 9.23 / 8.93 / 9.17 at
# 16, 14.02 / 13.74 / 14.21 at 64; the demo's ar round 0.45 / 0.42 / 0.41 ms, ddtree 5,021 / 5,246 /
# 5,303 tokens/s at budget 16. With launch_dependents
# *before* the wait (bf81ea9) the graphs were slower than with PDL off (ar round 0.45 -> 0.51 ms,
# verify 5.48 -> 6.03 ms at one node): each kernel let the next launch at once, so a chain of
# kernels could be placed ahead, each holding SM resources while it waited. The process's mode is
# DDTREE_PDL's if set, else the first cuda target's (``prefer_pdl_mode``): 'wait' by default and
# for large targets, 'trigger' for launch-bound ones (below).
PDL_MODES = ("off", "wait", "trigger")
_ENV_PDL = os.environ.get("DDTREE_PDL")
_ENV_EARLY = os.environ.get("DDTREE_PARAMS_EARLY")
if _ENV_PDL is not None and _ENV_PDL not in PDL_MODES:
    raise ValueError(f"DDTREE_PDL must be one of {PDL_MODES}, got {_ENV_PDL!r}")
if _ENV_EARLY is not None and _ENV_EARLY not in ("0", "1"):
    raise ValueError(f"DDTREE_PARAMS_EARLY must be 0 or 1, got {_ENV_EARLY!r}")

# Whether grid_dependency_after reads the kernel's parameters before the wait: with PDL 'trigger'
# (DDTREE_PARAMS_EARLY=1 / 0 forces it). Measured on an H100 (forty-third and forty-fourth
# sessions, docs/PERFORMANCE.md), demo pair at budget 16, tokens/s, ar / ddtree: 'wait' without the
# reads 2,458 / 6,118, with them 2,336 / 5,722; 'trigger' without 2,543 / 6,067, with **2,735 /
# 6,338** (the next kernel's blocks are placed while this one runs and take their misses then).
# The Moonlight verify (4 layers, 16 / 64 nodes, ms): off 1.82 / 2.57, wait 1.78 / **2.51**, wait
# with the reads 1.81 / 2.86, trigger 1.85 / 2.59, trigger with the reads 1.83 / 2.89. Hence the
# mode per workload below. Reading them in the first wave's blocks only (block index below the SM
# count; forty-sixth session, H100) took the verify's cost at 64 nodes away (2.85 -> 2.51 ms) but won
# neither workload: the verify ~1 % behind no reads, the demo 1-2 % behind every block's (removed;
# c280793 has it).
LAUNCH_BOUND_HIDDEN = 1024


def pdl_mode_for(hidden_size: int | None, env_pdl: str | None = None, env_early: str | None = None):
    """The (PDL mode, parameters read early) a process running a target of ``hidden_size`` takes:
    what DDTREE_PDL / DDTREE_PARAMS_EARLY say (``env_pdl`` / ``env_early``), else 'trigger' with
    the early reads for a target of hidden size <= ``LAUNCH_BOUND_HIDDEN`` (every kernel of a round
    one short wave: the launches are the cost, and the next kernel placed early hides its
    parameters' misses) and 'wait' without them otherwise, or for ``hidden_size`` None (no target
    yet). Pure: no state read or changed."""
    if env_pdl is not None:
        mode = env_pdl
    else:
        mode = "trigger" if hidden_size is not None and hidden_size <= LAUNCH_BOUND_HIDDEN else "wait"
    early = env_early == "1" if env_early is not None else mode == "trigger"
    return mode, early


# The process's mode: every kernel compiles (and the disk cache keys) with it, and launches follow
# it. The first CudaTarget sets it (prefer_pdl_mode) unless a kernel has been compiled, loaded from
# the cache or launched before; either fixes it (_pdl_fixed).
PDL, PARAMS_EARLY = pdl_mode_for(None, _ENV_PDL, _ENV_EARLY)
if config.ENABLE_CUDASIM:
    PDL, PARAMS_EARLY = "off", False
_pdl_fixed = False                 # PDL and PARAMS_EARLY can no longer change
_pdl_warned = set()                 # the modes a later target wished for and was told it cannot have


def _fix_pdl_mode():
    """The mode as it stands, fixed from now on (a kernel is compiled, loaded or launched with it)."""
    global _pdl_fixed
    _pdl_fixed = True
    return PDL, PARAMS_EARLY


def prefer_pdl_mode(hidden_size: int) -> tuple[str, bool]:
    """Set the process's PDL mode for a target of ``hidden_size`` (``pdl_mode_for``, the
    environment's DDTREE_PDL / DDTREE_PARAMS_EARLY first), fix it, and return the mode in force:
    the first target's wish wins. Once the mode is fixed (by an earlier target, or a kernel compiled,
    loaded or launched) it stays as it is, with a RuntimeWarning (once a wish) when this target
    would have taken another: e.g. the demo pair and then a Moonlight-size target in one process;
    tokens are the same either way, only the speed differs. Nothing in the simulator."""
    global PDL, PARAMS_EARLY
    if config.ENABLE_CUDASIM:
        return PDL, PARAMS_EARLY
    wanted = pdl_mode_for(hidden_size, _ENV_PDL, _ENV_EARLY)
    if not _pdl_fixed:
        PDL, PARAMS_EARLY = wanted
    fixed = _fix_pdl_mode()
    if wanted != fixed and wanted not in _pdl_warned:
        _pdl_warned.add(wanted)
        warnings.warn(f"ddtree_numba: kernels already run with PDL {fixed}; a target of hidden size {hidden_size} "
                      f"would take {wanted} (set DDTREE_PDL to choose one for the whole process)", RuntimeWarning,
                      stacklevel=2)
    return fixed


def ptx_intrinsic(name: str, text):
    """A numba intrinsic (GPU only) emitting the PTX ``text``, instructions without operands, as
    inline assembly with a memory clobber (nothing for an empty ``text``), named ``name``: the
    kernel cache fingerprints a closure's intrinsics by qualified name. ``text`` may be a function
    of no arguments, called when a kernel calling the intrinsic is compiled."""
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    def emit(typingctx):
        def codegen(context, builder, signature, args):
            ptx = text() if callable(text) else text
            if ptx:
                asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), ptx, "~{memory}", side_effect=True)
                builder.call(asm, [])
            return context.get_dummy_value()

        return types.void(), codegen

    emit.__name__ = emit.__qualname__ = name
    return intrinsic(emit)


# wait for the kernels this one depends on (with 'trigger', then let the next kernel launch);
# 'off': nothing, ordinary launches order the kernels
_WAIT_PTX = {"off": "", "wait": "griddepcontrol.wait;",
             "trigger": "griddepcontrol.wait; griddepcontrol.launch_dependents;"}


def _wait_ptx() -> str:
    """The wait's PTX in the process's mode (fixing it: a kernel is being compiled)."""
    return _WAIT_PTX[_fix_pdl_mode()[0]]


if config.ENABLE_CUDASIM:
    def grid_dependency():
        """(The simulator runs launches one after another.)"""
else:
    grid_dependency = ptx_intrinsic("grid_dependency", _wait_ptx)


if config.ENABLE_CUDASIM:
    def grid_dependency_after(params):
        """(The simulator runs launches one after another.)"""
else:
    from llvmlite import ir as _ir
    from numba import types as _types
    from numba.cuda.extending import intrinsic as _intrinsic

    @_intrinsic
    def grid_dependency_after(typingctx, params):
        """``grid_dependency()`` once the parameter words of ``params`` (a tuple of the kernel's
        arrays and integers) are read: each array's data address, shape and strides (not global
        memory). A kernel reads a parameter word from the constant bank at its first use, and each
        first use of a 64-byte line misses (~0.35 µs on an H100, one miss after another:
        tools/param_cost.py); read before the wait, the misses can overlap the predecessor instead of
        following it (with PARAMS_EARLY: PDL 'trigger', the launch-bound targets' mode; otherwise the
        wait alone, as ``grid_dependency()``). (The words are folded into one value that a predicated
        nanosleep takes, so that ptxas cannot sink the reads past the wait.)"""
        if not isinstance(params, _types.BaseTuple):
            return None

        def codegen(context, builder, signature, args):
            mode, early = _fix_pdl_mode()
            wait = _WAIT_PTX[mode]
            _emit_wait(builder, wait, _parameter_word(context, builder, signature, args) if early else None)
            return context.get_dummy_value()

        return _types.void(params), codegen

    def _emit_wait(builder, wait, word=None):
        """``wait`` (PTX, maybe empty) as inline assembly; with ``word``, after a nanosleep predicated
        on it, so that the reads folded into ``word`` come first."""
        if word is None:
            if wait:
                builder.call(_ir.InlineAsm(_ir.FunctionType(_ir.VoidType(), []), wait, "~{memory}",
                                           side_effect=True), [])
            return
        text = "{ .reg .pred p; setp.eq.u64 p, $0, 1; @p nanosleep.u32 1; " + wait + " }"
        asm = _ir.InlineAsm(_ir.FunctionType(_ir.VoidType(), [_ir.IntType(64)]), text, "l,~{memory}", side_effect=True)
        builder.call(asm, [word])

    def _parameter_word(context, builder, signature, args):
        """The xor of every parameter word of the tuple ``args[0]``: each array's data address, shape
        and strides, each integer (floats and records are read where they are used)."""
        i64 = _ir.IntType(64)
        words = []
        for j, ty in enumerate(signature.args[0].types):
            item = builder.extract_value(args[0], j)
            if isinstance(ty, _types.Array):
                ary = context.make_array(ty)(context, builder, item)
                words.append(builder.ptrtoint(ary.data, i64))
                for name in ("shape", "strides"):
                    vals = getattr(ary, name)
                    words += [builder.extract_value(vals, d) for d in range(ty.ndim)]
            elif isinstance(ty, _types.Integer):
                words.append(context.cast(builder, item, ty, _types.int64))
        while len(words) > 1:               # a tree of xors: the reads need not wait on each other
            words = [builder.xor(words[i], words[i + 1]) if i + 1 < len(words) else words[i]
                     for i in range(0, len(words), 2)]
        return words[0] if words else _ir.Constant(i64, 0)


def uses_pdl(dispatcher) -> bool:
    """Whether a ``cuda.jit`` kernel calls ``grid_dependency`` or ``grid_dependency_after`` (so may
    be launched early)."""
    flag = getattr(dispatcher, "_ddtree_pdl", None)
    if flag is None:
        names = dispatcher.py_func.__code__.co_names
        flag = dispatcher._ddtree_pdl = "grid_dependency" in names or "grid_dependency_after" in names
    return flag


@functools.lru_cache(maxsize=None)
def install_pdl_launches() -> bool:
    """Make every launch of a kernel that calls ``grid_dependency`` a PDL launch unless the
    process's mode is 'off' (numba-cuda builds each launch's ``cuda.core`` LaunchConfig in
    ``CUDADispatcher.call``; both are wrapped here, once a process; a launch of such a kernel fixes
    the mode). False in the simulator (nothing wrapped)."""
    if config.ENABLE_CUDASIM:
        return False
    import numba.cuda.dispatcher as nd

    real_call, real_config = nd.CUDADispatcher.call, nd.LaunchConfig
    launching = [False]                     # the kernel being launched calls grid_dependency

    def launch_config(**kw):
        if launching[0]:
            kw["programmatic_stream_serialization"] = True
        return real_config(**kw)

    def call(self, args, launch_config_):
        outer = launching[0]
        launching[0] = uses_pdl(self) and _fix_pdl_mode()[0] != "off"   # (other kernels: as they were)
        try:
            return real_call(self, args, launch_config_)
        finally:
            launching[0] = outer

    nd.LaunchConfig = launch_config
    nd.CUDADispatcher.call = call
    return True


install_pdl_launches()


# -- CUDA graphs: numba launches on a stream under capture are recorded, not run ------------------

def _check_cuda(result):
    """The value of a ``cuda.bindings.runtime`` call, or a RuntimeError naming its error code."""
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise RuntimeError(f"CUDA runtime error {err}")
    return result[1] if isinstance(result, tuple) and len(result) == 2 else result


def _stream_handle(stream) -> int:
    if stream == 0:
        return 0
    return stream.handle.value if hasattr(stream.handle, "value") else int(stream.handle)


def capture_graph(enqueue, warm_up: bool = True):
    """Capture ``enqueue(stream)`` into an instantiated CUDA graph and return it. With
    ``warm_up``, ``enqueue`` runs once uncaptured first (compiling and loading every kernel
    outside the capture); then once under capture on a fresh stream, which records the launches
    without running them. ``warm_up=False`` is for a caller that has just run the same launches
    itself (the decode loop's first round). A real GPU only."""
    from cuda.bindings import runtime as rt
    stream = cuda.stream()
    handle = _stream_handle(stream)
    if warm_up:
        # the fresh stream is not ordered after the caller's: its inputs (uploaded there, from
        # pageable memory, so possibly still in flight) must land before the warm-up reads them
        cuda.synchronize()
        enqueue(stream)             # compile and load every kernel outside the capture
        stream.synchronize()
    _check_cuda(rt.cudaStreamBeginCapture(handle, rt.cudaStreamCaptureMode.cudaStreamCaptureModeRelaxed))
    enqueue(stream)
    graph = _check_cuda(rt.cudaStreamEndCapture(handle))
    exe = _check_cuda(rt.cudaGraphInstantiate(graph, 0))
    _check_cuda(rt.cudaGraphDestroy(graph))         # the instantiated graph is independent of it
    return exe


def capture_graphs(enqueue) -> list:
    """Capture ``enqueue(stream, cut)`` as a sequence of instantiated CUDA graphs: each call of
    ``cut()`` closes the graph captured so far and begins the next (so replaying them in order,
    with events between, times each part): one entry per ``cut()``, None for a part that
    launched nothing, then the part after the last ``cut()`` unless it is empty. No warm-up run
    (as ``capture_graph(warm_up=False)``). A real GPU only."""
    from cuda.bindings import runtime as rt
    stream = cuda.stream()
    handle = _stream_handle(stream)
    mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeRelaxed
    graphs = []

    def close():
        graph = _check_cuda(rt.cudaStreamEndCapture(handle))
        res = rt.cudaGraphGetNodes(graph, 0)             # (error, nodes, count): count only
        _check_cuda(res[0])
        exe = _check_cuda(rt.cudaGraphInstantiate(graph, 0)) if int(res[-1]) else None
        _check_cuda(rt.cudaGraphDestroy(graph))
        return exe

    def cut():
        graphs.append(close())
        _check_cuda(rt.cudaStreamBeginCapture(handle, mode))

    _check_cuda(rt.cudaStreamBeginCapture(handle, mode))
    enqueue(stream, cut)
    last = close()
    if last is not None:
        graphs.append(last)
    return graphs


class SideStream:
    """A second stream for launches that may run beside the main stream's: captured into a graph,
    they become a parallel branch. ``fork(stream)`` returns the side stream, ordered after
    everything enqueued on ``stream`` so far; ``join(stream)`` orders what is enqueued on
    ``stream`` next after everything enqueued on the side stream since. The stream and its two
    events are made on first use (outside any capture when the work ran once eagerly first, as
    ``capture_graph`` does). The launches are the same as in line, so the bits are too. One
    fork at a time: each ``fork`` is followed by its ``join`` before the next ``fork`` (a wait
    binds to its event's latest record, so the pair may be reused any number of times)."""

    def __init__(self):
        self.stream = None

    def fork(self, stream):
        if self.stream is None:
            self._fork, self._join = (cuda.event() if config.ENABLE_CUDASIM else cuda.event(timing=False)
                                      for _ in range(2))
            self.stream = cuda.stream()
        self._fork.record(stream)
        self._fork.wait(self.stream)
        return self.stream

    def join(self, stream) -> None:
        self._join.record(self.stream)
        self._join.wait(stream)


def destroy_graph(exe) -> None:
    """Free an instantiated graph (``capture_graph``) that will not be replayed again."""
    from cuda.bindings import runtime as rt
    _check_cuda(rt.cudaGraphExecDestroy(exe))


def replay_graph(exe, stream=0) -> None:
    """Launch an instantiated graph (``capture_graph``) on ``stream``."""
    from cuda.bindings import runtime as rt
    _check_cuda(rt.cudaGraphLaunch(exe, _stream_handle(stream)))
