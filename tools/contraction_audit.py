"""Multiply-adds left for ptxas to fuse, by source line: a static check of kernels' PTX, no GPU needed.

Usage: python tools/contraction_audit.py NAME [NAME ...] | --all   (kernel names as tests/compile_ptx.py lists them)

NVVM fuses some ``x * y + z`` itself (``fma.rn``) and leaves others as a ``mul`` then an ``add`` /
``sub`` without ``.rn``, which ptxas may fuse into an FFMA at assembly time, choosing which product
to fuse per kernel and per copy of a loop. Where two kernels (or two copies of a loop) must give the
same bits, such a pair can make them differ by an ulp: the forty-eighth session found a rope kernel
1 ulp off the table kernel that way on a GPU, while the local ptxas fused both alike. Writing the
fma (``_device.fma``) settles it (docs/DESIGN.md §4).

For each listed kernel variant (every variant of tests/compile_ptx.py's SIGNATURES), compiled to
PTX for sm_90 with line info: each float ``add`` / ``sub`` without ``.rn`` one of whose operands
is a ``mul`` without ``.rn`` (directly or through ``mov`` / ``neg``), reported at the add's source
line with the variants that hold it and how many times. A line reported is not a bug by itself:
a formula computed in one place, whose output is compared with a twin within a tolerance, may be
fused either way. The forty-eighth session's audit of all variants, and why each remaining line is
harmless, is in docs/NOTES.md ("Left alone").
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

_INSTRUCTION = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z][a-z0-9_.]*)\s+([^;]*);")
_MULS = ("mul.f32", "mul.f64")
_ADDS = ("add.f32", "sub.f32", "add.f64", "sub.f64")
_PASS = ("mov.f32", "mov.f64", "neg.f32", "neg.f64")


def contractable(ptx: str) -> list[tuple[str, int, str]]:
    """(source file, line, op) of every ``add`` / ``sub`` (f32 / f64, no ``.rn``) in ``ptx`` fed by a
    ``mul`` without ``.rn``, directly or through ``mov`` / ``neg``; the line from the PTX's ``.loc``
    (an inlined device function's instructions carry the call's line). Registers are per function;
    a register defined more than once (a loop's phi) counts if any of its own definitions is such a
    mul."""
    files: dict[int, str] = {}
    hits = []
    defs: dict[str, list[tuple[str, list[str]]]] = collections.defaultdict(list)
    body: list[tuple[tuple[int, int] | None, str, list[str]]] = []

    def flush():
        for loc, op, operands in body:
            if op in _ADDS and any(_fed_by_mul(r, defs) for r in operands[1:]):
                hits.append((loc[0] if loc else -1, loc[1] if loc else 0, op))
        defs.clear()
        body.clear()

    loc = None
    for line in ptx.splitlines():
        text = line.strip()
        m = re.match(r'\.file\s+(\d+)\s+"([^"]+)"', text)
        if m:
            files[int(m.group(1))] = m.group(2)
            continue
        if re.match(r"(?:\.visible\s+|\.weak\s+)?\.(entry|func)\b", text):
            flush()
            loc = None
            continue
        m = re.match(r"\.loc\s+(\d+)\s+(\d+)", text)
        if m:
            loc = (int(m.group(1)), int(m.group(2)))
            continue
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        op, operands = m.group(1), [o.strip() for o in m.group(2).split(",")]
        if operands and operands[0].startswith("%"):
            defs[operands[0]].append((op, operands[1:]))
        body.append((loc, op, operands))
    flush()
    return [(files.get(f, "?"), line, op) for f, line, op in hits]   # (.file may come after a function)


def _fed_by_mul(reg: str, defs, depth: int = 0) -> bool:
    """Whether a definition of ``reg`` is a mul without .rn, or a mov / neg of a register defined
    once that is (NVVM reuses a register for a loop's values: a mov from a register of several
    definitions copies one of them, which this cannot tell, so it is not followed)."""
    for op, sources in defs.get(reg, ()):
        if op in _MULS:
            return True
        src = sources[0] if sources else ""
        if op in _PASS and depth < 8 and src.startswith("%") and len(defs.get(src, ())) == 1:
            if _fed_by_mul(src, defs, depth + 1):
                return True
    return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="kernels as tests/compile_ptx.py names them")
    ap.add_argument("--all", action="store_true", help="every listed kernel (several minutes)")
    args = ap.parse_args(argv)
    os.environ.pop("NUMBA_ENABLE_CUDASIM", None)
    import compile_ptx as cp
    from numba import cuda
    cp.numba_cuda_dispatcher.get_current_device = lambda: cp._H200()   # no GPU: name the H200's cc
    found = cp.find_kernels()
    names = sorted(found) if args.all else args.names
    if not names:
        raise SystemExit("name a kernel (e.g. rope._rope_kernel) or give --all")
    unknown = [n for n in names if n not in found]
    if unknown:
        raise SystemExit(f"no kernel {unknown[0]!r}; e.g. {sorted(found)[:5]}")
    by_line = collections.defaultdict(collections.Counter)      # (file, line, op) -> {(name, variant): n}
    for name in names:
        for i, (fn, sig, bounds) in enumerate(cp.variants(name, *found[name])):
            ptx, _ = cuda.compile_ptx(fn, sig, cc=(9, 0), lineinfo=True, launch_bounds=bounds)
            for hit in contractable(ptx):
                by_line[hit][(name, i)] += 1
    sources: dict[str, list[str]] = {}
    for (path, line, op), where in sorted(by_line.items()):
        if path not in sources:
            sources[path] = open(path).read().splitlines() if os.path.exists(path) else []
        text = sources[path][line - 1].strip() if 0 < line <= len(sources[path]) else "?"
        kernels = ", ".join(f"{n} v{v} x{c}" for (n, v), c in sorted(where.items()))
        print(f"{os.path.relpath(path)}:{line} {op}  {text[:90]}\n    {kernels}")
    print(f"{len(by_line)} source lines with a multiply-add left to ptxas in {len(names)} kernel(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
