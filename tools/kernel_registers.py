"""Registers and spills of the GEMM kernels' variants, on a machine without a GPU.

Usage: PTXAS=/path/to/ptxas python tools/kernel_registers.py SPEC [SPEC ...]

SPEC = swiglu,grouped,gather:TILE[:precision[:xraw]], bf16 weights read as words, e.g.
``1,1,1:1,1,4`` (the experts' gate|up at tile MT 1, RT 1, NW 4), ``0,0,0:2,4,2,2:fp32`` (a plain
projection on the staged kernel, four numbers WM,WN,MT,RT), ``1,1,1:2,1,1:bf16:xraw``.

Each variant is compiled to PTX for sm_90 as tests/compile_ptx.py does (no GPU needed), then
assembled by ``ptxas -v``, which reports the registers a thread uses, the bytes it spills and its
stack frame. ptxas comes with the ``nvidia-cuda-nvcc-cu12`` wheel (``pip download`` it and unzip:
``nvidia/cuda_nvcc/bin/ptxas``); the PTX's version line is lowered to one that ptxas reads. An SM
holds 65536 registers: 255 a thread allows 8 warps, 160 allows 12.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

from numba import cuda
from numba.cuda import dispatcher as numba_cuda_dispatcher


class _H200:
    compute_capability = (9, 0)


F32_2, I32_1 = "float32[:, ::1]", "int32[::1]"
SIGNATURE = (f"void({F32_2}, int64, uint16[:, :, ::1], uint16[:, :, ::1], {F32_2}, {F32_2}, {F32_2}, int64, "
             f"{I32_1}, {I32_1}, {I32_1})")          # both kernels'


def kernel_for(spec: str):
    """The dispatcher a SPEC names (module docstring)."""
    import importlib
    linear = importlib.import_module("ddtree_numba.kernels.linear")
    parts = spec.split(":")
    swiglu, grouped, gather = (bool(int(v)) for v in parts[0].split(","))
    tile = tuple(int(v) for v in parts[1].split(","))
    precision = parts[2] if len(parts) > 2 else "bf16"
    xraw = len(parts) > 3 and parts[3] == "xraw"
    if len(tile) == 3:
        return linear._mma_kernel("bf16", swiglu, False, grouped, gather, True, True, precision, *tile,
                                  block=(0, 0), scales="f32", xraw=xraw)
    return linear._staged_kernel("bf16", swiglu, False, grouped, gather, precision, *tile, block=(0, 0), scales="f32")


def registers(spec: str, ptxas: str) -> str:
    """'N registers, S bytes spilled (stores / loads), F bytes of stack' for one SPEC."""
    disp = kernel_for(spec)
    ptx, _ = cuda.compile_ptx(disp.py_func, SIGNATURE, cc=(9, 0))
    ptx = re.sub(r"^\.version \d+\.\d+", ".version 8.8", ptx, flags=re.M)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        res = subprocess.run([ptxas, "-arch=sm_90", "-v", src, "-o", os.path.join(tmp, "k.cubin")],
                             capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"ptxas failed on {spec}: {res.stderr.strip()[:400]}")
    regs = re.findall(r"Used (\d+) registers", res.stderr)
    spill = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", res.stderr)
    stack = re.findall(r"(\d+) bytes stack frame", res.stderr)
    return (f"{regs[-1]} registers, {spill[-1][0]} / {spill[-1][1]} bytes spilled (stores / loads), "
            f"{stack[-1]} bytes of stack")


def main():
    specs = sys.argv[1:]
    ptxas = os.environ.get("PTXAS", "ptxas")
    if not specs or specs[0] in ("-h", "--help"):
        print(__doc__)
        return
    numba_cuda_dispatcher.get_current_device = lambda: _H200()   # compile for the H200 without one
    for spec in specs:
        print(f"{spec:28s} {registers(spec, ptxas)}", flush=True)


if __name__ == "__main__":
    main()
