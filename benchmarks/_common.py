"""Helpers for the benchmark scripts: timing with CUDA events, the PERFORMANCE.md row."""

from __future__ import annotations

import datetime
import os
import statistics
import subprocess
import time
from pathlib import Path

PERF = Path(__file__).resolve().parents[1] / "docs" / "PERFORMANCE.md"
COPY_BW = 4.2e12     # bytes/s, device copy (read + write) measured on the H200 (shared/GPU.md)
FP32_RATE = 51e12    # FLOP/s, cuBLAS fp32 without TF32 on the H200


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
    from numba import cuda
    return cuda.get_current_device().name.decode() if isinstance(cuda.get_current_device().name, bytes) \
        else str(cuda.get_current_device().name)


def time_gpu(fn, stream, reps=50, warmup=5) -> float:
    """Median device time of ``fn()`` in microseconds, measured with CUDA events on ``stream``."""
    from numba import cuda
    for _ in range(warmup):
        fn()
    stream.synchronize()
    times = []
    for _ in range(reps):
        start, end = cuda.event(), cuda.event()
        start.record(stream)
        fn()
        end.record(stream)
        end.synchronize()
        times.append(cuda.event_elapsed_time(start, end) * 1e3)
    return statistics.median(times)


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


def append_rows(title: str, header: list[str], rows: list[list], note: str = "") -> None:
    """Append a dated table to docs/PERFORMANCE.md and print it."""
    stamp = datetime.date.today().isoformat()
    lines = [f"\n### {title} — {stamp}, {device_name()}, commit {commit()}\n"]
    if note:
        lines.append(note + "\n")
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for r in rows:
        lines.append("| " + " | ".join(str(c) for c in r) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    with PERF.open("a") as f:
        f.write(text)
