"""Helpers for the benchmark scripts: timing with CUDA events, the PERFORMANCE.md row."""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

PERF = Path(__file__).resolve().parents[1] / "docs" / "PERFORMANCE.md"
RESULTS = Path(__file__).resolve().parent / "results"
COPY_BW = 4.2e12     # bytes/s, device copy (read + write) measured on the H200 (shared/GPU.md)
MMA_RATE = 385e12    # FLOP/s, bf16 mma.sync from registers on the H200 (shared/GPU.md); each
                     # benchmark measures it again in its own run (``mma_ceiling``)


def commit() -> str:
    """The commit measured: $DDTREE_COMMIT (the GPU machine's copy has no .git), else git."""
    if os.environ.get("DDTREE_COMMIT"):
        return os.environ["DDTREE_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=PERF.parent)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def device_name() -> str:
    """This machine's GPU, as the package names it (``model.loader.device_name``)."""
    from ddtree_numba.model.loader import device_name as package_device_name
    return package_device_name("cuda")


_SLEEPER = []


def _sleeper():
    """A one-thread kernel that sleeps about ``ns`` nanoseconds (``cuda.nanosleep`` in a loop)."""
    if not _SLEEPER:
        from numba import cuda

        @cuda.jit
        def sleep(ns):
            for _ in range(ns // 1000):
                cuda.nanosleep(1000)
        _SLEEPER.append(sleep)
    return _SLEEPER[0]


def time_gpu(fn, stream, reps=50, warmup=5, queued=False) -> float:
    """Median device time of ``fn()`` in microseconds, measured with CUDA events on ``stream``.

    ``queued=False``: the start event is recorded, then the host calls ``fn``; the GPU idles while
    the host submits (the Python call and ``cudaGraphLaunch``: about 10 µs of an empty graph on the
    H200), so the figure is what one call costs when nothing is queued ahead of it.
    ``queued=True``: a kernel sleeping 200 µs is launched first, so the host has submitted ``fn``'s
    work before the GPU reaches the start event: the figure is the device time of ``fn``'s work
    alone, as it costs inside a longer graph (a stage of the captured round)."""
    from numba import cuda
    sleep = _sleeper() if queued else None
    for _ in range(warmup):
        fn()
    stream.synchronize()
    times = []
    for _ in range(reps):
        start, end = cuda.event(), cuda.event()
        if sleep is not None:
            sleep[1, 1, stream](200_000)
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        times.append(cuda.event_elapsed_time(start, end) * 1e3)
    return statistics.median(times)


def mma_ceiling(stream=0, iters=4096) -> float:
    """The bf16 mma.sync ceiling in FLOP/s, measured now: a register-only kernel (4 independent
    accumulator chains a warp, 4 warps a block, 8 blocks an SM) through the package's own
    intrinsic (``kernels._mma.mma_bf16``). The compute floor of every benchmark is FLOPs / this."""
    from numba import cuda, float32, uint32

    from ddtree_numba.kernels._mma import mma_bf16

    @cuda.jit
    def spin(out, n):
        lane = cuda.threadIdx.x % 32
        a = uint32(0x3F803F80 + lane)                 # bf16 pairs near 1.0
        b = uint32(0x3C003C00 + lane)
        c0 = c1 = c2 = c3 = float32(0.0)
        d0 = d1 = d2 = d3 = float32(0.0)
        e0 = e1 = e2 = e3 = float32(0.0)
        f0 = f1 = f2 = f3 = float32(0.0)
        for _ in range(n):
            c0, c1, c2, c3 = mma_bf16(a, a, a, a, b, b, c0, c1, c2, c3)
            d0, d1, d2, d3 = mma_bf16(a, a, a, a, b, b, d0, d1, d2, d3)
            e0, e1, e2, e3 = mma_bf16(a, a, a, a, b, b, e0, e1, e2, e3)
            f0, f1, f2, f3 = mma_bf16(a, a, a, a, b, b, f0, f1, f2, f3)
        out[cuda.grid(1)] = c0 + c1 + c2 + c3 + d0 + d1 + d2 + d3 + e0 + e1 + e2 + e3 + f0 + f1 + f2 + f3

    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    blocks, threads = 8 * sms, 128
    out = cuda.device_array(blocks * threads, np.float32, stream=stream)
    us = time_gpu(lambda: spin[blocks, threads, stream](out, iters), stream, reps=5, warmup=1)
    flops = blocks * (threads // 32) * iters * 4 * (2 * 16 * 8 * 16)
    return flops / (us * 1e-6)


_FILL = []


def _hash64():
    """A device function: the 64-bit counter hash (i * golden ratio + seed, then splitmix64's
    finalizer) the random weights are drawn from."""
    from numba import cuda, uint64

    @cuda.jit(device=True)
    def hash64(i, seed):
        h = uint64(i) * uint64(0x9E3779B97F4A7C15) + uint64(seed)
        h = (h ^ (h >> uint64(30))) * uint64(0xBF58476D1CE4E5B9)
        h = (h ^ (h >> uint64(27))) * uint64(0x94D049BB133111EB)
        return h ^ (h >> uint64(31))

    return hash64


def random_bf16(shape, scale, seed, stream=0):
    """A device uint16 array of bfloat16 bits, uniform(-scale, scale) from a counter hash of the
    index and ``seed``: random weights made on the GPU, no host copy (benchmarks only)."""
    from numba import cuda
    if not _FILL:
        from numba import float32, uint16, uint32, uint64
        from numba.cuda import libdevice
        hash64 = _hash64()

        @cuda.jit
        def fill(out, seed, scale):
            i = cuda.grid(1)
            if i < out.shape[0]:
                h = hash64(i, seed)
                u = float32(uint32(h >> uint64(40))) * float32(1.0 / 16777216.0)
                v = (float32(2.0) * u - float32(1.0)) * scale
                out[i] = uint16(libdevice.float_as_int(v) >> 16)
        _FILL.append(fill)
    n = int(np.prod(shape))
    a = cuda.device_array(n, np.uint16, stream=stream)
    _FILL[0][(n + 255) // 256, 256, stream](a, np.uint64(seed), np.float32(scale))
    return a.reshape(shape)


_FILL8: list = []


def random_fp8(shape, scale, seed, stream=0, block=(128, 128)):
    """A ``dtypes.BlockScaled`` float8 e4m3 matrix (or stack) made on the GPU: random bytes with
    exponent fields 0..8 (|value| < 4, subnormals included) from a counter hash, every block scale
    ``scale / 2`` (so |w| < 2 * scale). Benchmarks only."""
    from numba import cuda
    from ddtree_numba.dtypes import BlockScaled
    if not _FILL8:
        from numba import uint8, uint64
        hash64 = _hash64()

        @cuda.jit
        def fill(out, seed):
            i = cuda.grid(1)
            if i < out.shape[0]:
                h = hash64(i, seed)
                expo = (h >> uint64(8)) % uint64(9)
                out[i] = uint8((h & uint64(0x87)) | (expo << uint64(3)))
        _FILL8.append(fill)
    n = int(np.prod(shape))
    a = cuda.device_array(n, np.uint8, stream=stream)
    _FILL8[0][(n + 255) // 256, 256, stream](a, np.uint64(seed))
    lead, (rows, cols) = tuple(shape[:-2]), shape[-2:]
    sc = np.full(lead + (-(-rows // block[0]), -(-cols // block[1])), scale / 2, np.float32)
    return BlockScaled(a.reshape(shape), cuda.to_device(sc, stream=stream), block)


def random_int4(shape, scale, seed, stream=0, group=32):
    """A ``dtypes.Int4Grouped`` matrix (or stack) made on the GPU: random int32 words (every nibble
    uniform over [-8, 7]) from the counter hash, every group scale ``scale / 8`` in bf16 bits, as the
    released checkpoints store them (so |w| <= scale).
    Benchmarks only."""
    from numba import cuda
    from ddtree_numba.dtypes import Int4Grouped
    lead, (rows, cols) = tuple(shape[:-2]), shape[-2:]
    words = random_bf16(lead + (rows, 2 * -(-cols // 8)), 1.0, seed, stream)     # two uint16 a word
    data = words.view(np.int32) if hasattr(words, "view") else words
    from ddtree_numba.dtypes import to_bf16_bits
    sc = to_bf16_bits(np.full(lead + (rows, -(-cols // group)), scale / 8, np.float32))   # bf16, as released
    return Int4Grouped(data.reshape(lead + (rows, -(-cols // 8))), cuda.to_device(sc, stream=stream), group, cols)


def time_host(fn, reps=20, warmup=2) -> float:
    """Median wall time of ``fn()`` in microseconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def _number(v):
    """A table cell as JSON: numbers as numbers, the rest as it is."""
    if isinstance(v, str):
        for kind in (int, float):
            try:
                return kind(v)
            except ValueError:
                pass
    return v


def append_rows(title: str, header: list[str], rows: list[list], note: str = "", device: str | None = None,
                commit_id: str | None = None, date: str | None = None, append: bool = True,
                results: str | None = None, command: str | None = None, keys: list[str] | None = None,
                values: list[list] | None = None, extra: dict | None = None) -> None:
    """Append a dated table to docs/PERFORMANCE.md and print it (``append=False``: print only,
    undated). ``device``, ``commit_id`` and ``date`` default to this machine's GPU, the
    checkout's commit and today (give them when tabling a measurement made elsewhere).
    ``results``: also write ``benchmarks/results/<results>.json`` = {benchmark, device, commit,
    date, command, pdl (the process's PDL mode, ``_device.prefer_pdl_mode``), rows: [{key:
    value}]} (the latest H200 run is committed), the keys ``keys`` (the names the issues give the
    results) or else the header's; the values ``values`` (unformatted, one list a row) or else the
    table's cells. Under the CUDA
    simulator nothing is appended or written (its timings measure nothing: e.g. a ``--dry-run``).
    ``extra``: more keys of the results file's envelope (e.g. the shape a benchmark ran at)."""
    if append and os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        append = False
        print("(the CUDA simulator: nothing appended to docs/PERFORMANCE.md or written to results/)")
    from ddtree_numba import _device                 # how the kernels were launched (the process's mode)
    pdl = _device.PDL + (" + early reads" if _device.PARAMS_EARLY else "")
    if append:
        device, commit_id = device or device_name(), commit_id or commit()
        date = date or datetime.date.today().isoformat()
        lines = [f"\n### {title} — {date}, {device}, commit {commit_id}, PDL {pdl}\n"]
    else:
        lines = [f"\n### {title} (PDL {pdl})\n"]
    if append and results:
        RESULTS.mkdir(exist_ok=True)
        record = dict(benchmark=results, device=device, commit=commit_id, date=date,
                      command=command or " ".join(sys.argv), pdl=pdl, **(extra or {}),
                      rows=[{h: _number(v) for h, v in zip(keys or header, r)} for r in (values or rows)])
        (RESULTS / f"{results}.json").write_text(json.dumps(record, indent=1) + "\n")
    if note:
        lines.append(note + "\n")
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for r in rows:
        lines.append("| " + " | ".join(str(c) for c in r) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if append:
        with PERF.open("a") as f:
            f.write(text)
