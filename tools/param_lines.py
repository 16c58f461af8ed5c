"""Which kernel parameters each kernel reads, by constant-bank line, on a machine without a GPU.

    PTXAS=/path/to/ptxas NVDISASM=/path/to/nvdisasm python tools/param_lines.py [NAME ...] [--line 64]

Each kernel (variant 0 of tests/compile_ptx.py's list, or the NAMEs given) is compiled to PTX for
sm_90 and assembled as ``tools/sass_lines.py`` does; every operand ``c[0x0][0xNNN]`` at or past the
parameter base (0x210 on sm_90) is a kernel-parameter word. Printed: the parameters' bytes (the
highest word read, from the base), the distinct ``--line``-byte lines read, and how many of them the
kernel reads first after its PDL wait (``ACQBULK``): the constant-cache misses that come one after
another at first use when the kernel starts (forty-third session: ~0.35 µs a launch each on an H100,
``tools/param_cost.py``), sorted by that. numba passes an array as 5 + 2 x ndim words (meminfo,
parent, nitems, itemsize, data, shape, strides), so a 2-D array spans 72 bytes of which a kernel
reads 24-40. Static counts: a line read only on a path not taken counts too.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PARAM_BASE = 0x210


def param_reads(sass: str):
    """(parameter offsets read before the PDL wait, those read after it), from nvdisasm's text."""
    before, after, waited = [], [], False
    for ln in sass.splitlines():
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", ln)
        if not m:
            continue
        ins = m.group(1)
        if "ACQBULK" in ins:
            waited = True
        for off in re.findall(r"c\[0x0\]\[0x([0-9a-f]+)\]", ins):
            o = int(off, 16)
            if o >= PARAM_BASE:
                (after if waited else before).append(o - PARAM_BASE)
    return before, after


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--line", type=int, default=64, help="bytes a constant-cache line (assumed)")
    args = ap.parse_args(argv)
    from sass_lines import compile_sass
    import compile_ptx as cp
    cp.numba_cuda_dispatcher.get_current_device = lambda: cp._H200()
    found = cp.find_kernels()
    names = args.names or sorted(found)
    rows = []
    for name in names:
        if name not in found:
            raise SystemExit(f"no kernel {name!r}; e.g. {sorted(found)[:5]}")
        fn, sig, bounds = next(iter(cp.variants(name, *found[name])))
        _, sass = compile_sass(fn, sig, bounds)
        before, after = param_reads(sass)
        lines_before = {o // args.line for o in before}
        lines_after = {o // args.line for o in after}
        span = max(before + after, default=-8) + 8
        rows.append((len(lines_after - lines_before), len(lines_before | lines_after), span, name))
        print(f"  {name}: {span} B, {len(lines_before | lines_after)} lines, "
              f"{len(lines_after - lines_before)} first read after the wait", file=sys.stderr, flush=True)
    rows.sort(reverse=True)
    print(f"| kernel (variant 0) | parameter bytes | {args.line}-B lines read | first read after the wait |")
    print("|---|---|---|---|")
    for after_only, total, span, name in rows:
        print(f"| {name} | {span} | {total} | {after_only} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
