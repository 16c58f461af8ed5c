"""Static SASS of one kernel variant by Python source line, on a machine without a GPU.

    PTXAS=/path/to/ptxas NVDISASM=/path/to/nvdisasm python tools/sass_lines.py NAME [--variant I]
        [--lines A-B] [--sass]

NAME is a kernel as tests/compile_ptx.py lists it (``tree_build._build_tree_kernel``,
``topk._topk_partial_kernel``, ...); ``--variant`` picks one of its listed (factory arguments,
signature) entries (default 0). The variant is compiled to PTX for sm_90 with line info, as
compile_ptx does, assembled by ``ptxas -lineinfo`` and disassembled by ``nvdisasm -g``; then each
source line of the kernel's module gets the number of SASS instructions compiled from it, with
the registers, spills and the instructions in all. ``--lines A-B`` keeps lines A..B (say, a loop
body), ``--sass`` prints the instructions themselves, each under its line. ``--factory '(64, False)'``
compiles the factory's kernel for those arguments instead (with the listed variant's signature).
``--ncu R.sass.csv``: each line's executed instructions and stall samples from an ncu source page by
SASS of the same kernel (``ncu --import R.ncu-rep --page source --csv --print-source sass``).

Why: a kernel run by one warp (the heap build, a merge) is issue-bound: its time is its
instructions on the critical path, one after another. ncu counted ~720 warp instructions a pop of
the heap build (H100); this tool shows where they come from (numba's 64-bit index arithmetic, a
64-bit division's ~90-instruction call) before a GPU is at hand. Counts are static: a loop body
counts once, a branch not taken counts too.

ptxas: the ``nvidia-cuda-nvcc`` wheel (``nvidia/cuda_nvcc/bin/ptxas``) or a CUDA toolkit;
nvdisasm: ``pip download nvidia-cuda-nvdisasm`` and unzip (``nvidia/*/bin/nvdisasm``). The PTX's
version line is set to PTX_VERSION (default 8.8, CUDA 12.8's; lower it for an older ptxas).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def _tool(env: str, name: str) -> str:
    path = os.environ.get(env) or shutil.which(name)
    if not path:
        raise SystemExit(f"{name} not found: set {env} (see this tool's docstring)")
    return path


def compile_sass(fn, sig, bounds, lineinfo=False):
    """(ptxas -v's report, nvdisasm's SASS text) of kernel ``fn`` at signature ``sig`` for sm_90, no
    GPU needed (PTXAS / NVDISASM name the tools; the PTX's version line set to PTX_VERSION);
    ``lineinfo``: with each instruction's source line (``//## File ...`` lines)."""
    from numba import cuda
    ptxas, nvdisasm = _tool("PTXAS", "ptxas"), _tool("NVDISASM", "nvdisasm")
    ptx, _ = cuda.compile_ptx(fn, sig, cc=(9, 0), lineinfo=lineinfo, launch_bounds=bounds)
    version = os.environ.get("PTX_VERSION", "8.8")       # one that the ptxas at hand reads
    ptx = re.sub(r"^\.version \d+\.\d+", f".version {version}", ptx, flags=re.M)
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        flags = ["-lineinfo"] if lineinfo else []
        info = subprocess.run([ptxas, "-arch=sm_90", "-O3", "-v", *flags, src, "-o", cubin],
                              capture_output=True, text=True, check=True).stderr
        sass = subprocess.run([nvdisasm, "-c", cubin] + (["-g"] if lineinfo else []),
                              capture_output=True, text=True, check=True).stdout
    return info, sass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name")
    ap.add_argument("--variant", type=int, default=0)
    ap.add_argument("--lines", default=None, help="A-B: only source lines A..B")
    ap.add_argument("--sass", action="store_true", help="print the instructions under each line")
    ap.add_argument("--factory", default=None,
                    help="the factory's arguments as a Python tuple, e.g. '(64, False)': that kernel, with the "
                         "listed variant's signature")
    ap.add_argument("--ncu", default=None,
                    help="an ncu source page by SASS of the same kernel (tools/ncu_sass.py's CSV): each line's "
                         "executed warp instructions and stall samples, matched by instruction order")
    args = ap.parse_args(argv)
    for env, name in (("PTXAS", "ptxas"), ("NVDISASM", "nvdisasm")):
        _tool(env, name)                                  # (say now if either is missing)

    import compile_ptx as cp
    cp.numba_cuda_dispatcher.get_current_device = lambda: cp._H200()   # no GPU: name the H200's cc
    found = cp.find_kernels()
    if args.name not in found:
        raise SystemExit(f"no kernel {args.name!r}; e.g. {sorted(found)[:5]}")
    variants = list(cp.variants(args.name, *found[args.name]))
    if not 0 <= args.variant < len(variants):
        raise SystemExit(f"{args.name} has {len(variants)} listed variants")
    fn, sig, bounds = variants[args.variant]
    if args.factory:
        import ast
        disp = found[args.name][1](*ast.literal_eval(args.factory))
        fn, bounds = disp.py_func, disp.targetoptions.get("launch_bounds")
    info, sass = compile_sass(fn, sig, bounds, lineinfo=True)
    module = sys.modules[fn.__module__].__file__
    try:
        lo, hi = (int(v) for v in (args.lines.split("-") + [args.lines])[:2]) if args.lines else (1, 10**9)
    except ValueError:
        raise SystemExit(f"--lines {args.lines!r}: give A-B or one line number") from None
    where, counts, text = None, collections.Counter(), collections.defaultdict(list)
    order = []                                            # each instruction's line, in address order
    for ln in sass.splitlines():
        m = re.search(r'//## File "([^"]+)", line (\d+)', ln)
        if m:
            where = int(m.group(2)) if os.path.realpath(m.group(1)) == os.path.realpath(module) else None
            continue
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", ln)
        if m:
            order.append((where, m.group(1)))
            if where is not None:
                counts[where] += 1
                text[where].append(m.group(1))
    if args.ncu:
        return _with_ncu(args.ncu, order, module, info)
    source = open(module).read().splitlines()
    print(f"{args.name} variant {args.variant} ({sig}):")
    print("\n".join(line.strip() for line in info.splitlines() if "Used" in line or "spill" in line))
    shown = 0
    for n in sorted(c for c in counts if lo <= c <= hi):
        shown += counts[n]
        print(f"{n:5d} {counts[n]:5d}  {source[n - 1].strip()[:100]}")
        if args.sass:
            print("\n".join(f"{'':13}{ins}" for ins in text[n]))
    print(f"{shown} instructions on the lines shown, {sum(counts.values())} from {os.path.basename(module)}")
    return 0


def _with_ncu(path, order, module, info):
    """Each source line's executed warp instructions and warp-stall samples, from an ncu source page
    by SASS (``--print-source sass``) of the same kernel: the i-th instruction there is the i-th here
    when the driver's compiler gave the same code; else the two are aligned by opcode (difflib)."""
    import csv
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    head_i = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if head_i is None:
        raise SystemExit(f"{path}: no Address column")
    col = {c: i for i, c in enumerate(rows[head_i])}
    data = [r for r in rows[head_i + 1:] if r and r[0].startswith("0x")]
    lines = [ln for ln, _ in order]
    if len(data) != len(order):     # a slightly different compile: align the two by opcode
        import difflib

        def ops(texts):
            return [t.split()[1 if t.startswith("@") else 0].split(".")[0] if t.strip() else "" for t in texts]
        matcher = difflib.SequenceMatcher(None, ops([r[1].strip() for r in data]), ops([t for _, t in order]),
                                          autojunk=False)
        lines = [None] * len(data)
        for a, b, size_ in matcher.get_matching_blocks():
            lines[a:a + size_] = [ln for ln, _ in order[b:b + size_]]
        print(f"{path}: {len(data)} instructions against {len(order)} here, aligned by opcode "
              f"({sum(ln is not None for ln in lines)} matched)")
    exe, samp = collections.Counter(), collections.Counter()
    size = collections.Counter()
    for line, r in zip(lines, data):
        exe[line] += int(float(r[col["Instructions Executed"]] or 0))
        samp[line] += float(r[col["Warp Stall Sampling (All Samples)"]] or 0)
        size[line] += 1
    source = open(module).read().splitlines()
    total = sum(samp.values()) or 1
    print("\n".join(line.strip() for line in info.splitlines() if "Used" in line))
    print(f"{sum(exe.values())} warp instructions executed, {total:.0f} samples; by line (samples %, executed, "
          f"static instructions):")
    for line in sorted((ln for ln in exe if exe[ln] or samp[ln]), key=lambda ln: (ln is None, ln or 0)):
        text = source[line - 1].strip()[:90] if line else "(no line)"
        print(f"{line or 0:5d} {100 * samp[line] / total:5.1f}% {exe[line]:7d} {size[line]:5d}  {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
