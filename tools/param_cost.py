"""What a kernel's array parameters cost a launch, on a GPU: the same tiny work (one block of 128
threads, each adding one entry of each array) taking its inputs as k separate 2-D arrays or as one
3-D array holding the same k slices, each variant launched ``--copies`` times inside one captured
CUDA graph, replayed behind a sleeping kernel (queued: the graph's device time): µs a launch.

Why (forty-second session, ncu over a demo round's 162 kernels, PERFORMANCE.md "Instruction fetch in
steady state"): 11 % of the kernels' time stalled on constant-cache misses, the parameters. numba
passes an array as a struct of 5 + 2 x ndim 64-bit words (meminfo, parent, sizes, data, shape,
strides), and a kernel loads the words it uses from the parameter bank at first use. If k separate
arrays cost much more than one packed array, fewer array parameters (packed views, scalars for the
shapes) would cut a per-launch cost that every kernel of the round pays.

Measured (H100, forty-third session, µs a launch at k 1 / 2 / 4 / 8 / 16): separate 1.33 / 1.50 /
2.21 / 3.64 / 6.41, packed 1.43 / 1.64 / 1.67 / 2.08 / 2.93: ~0.35 µs an array past the second,
about one constant-cache miss each, one after another. The parameters read before the PDL wait
(``grid_dependency_after``, 4b4fd9b) at k 1 / 4 / 16: with 'wait' 1.05 / 2.01 / 6.24 against
grid_dependency()'s 1.06 / 1.92 / 6.00 (nothing hidden); with 'trigger' 0.81 / 1.71 / 5.54 against
0.89 / 1.78 / 5.97. Here the misses still mostly follow the wait; in whole demo rounds 'trigger'
with the early reads was the fastest (docs/PERFORMANCE.md, forty-third session).

Usage (a GPU machine): [DDTREE_PDL=trigger] python tools/param_cost.py [--ks 1 2 4 8 16] [--copies 50] [--passes 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from numba import cuda, float32

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

_N = 128


def _separate_kernel(k, pdl=""):
    """A kernel taking k arrays [4, N] and out [N]: out[t] = sum_i a_i[t % 4, t]. ``pdl``: "" (an
    ordinary launch), "wait" (``grid_dependency()`` first: a PDL launch, the wait alone)
    or "after" (``grid_dependency_after`` of the arrays: their parameter words read before the
    wait)."""
    from ddtree_numba._device import grid_dependency, grid_dependency_after
    names = ", ".join(f"a{i}" for i in range(k))
    body = " + ".join(f"a{i}[t % a{i}.shape[0], t]" for i in range(k))
    first = {"": "", "wait": "    grid_dependency()\n",
             "after": f"    grid_dependency_after(({names}, out))\n"}[pdl]
    src = (f"def kernel({names}, out):\n"
           + first +
           f"    t = cuda.threadIdx.x\n"
           f"    if t < out.shape[0]:\n"
           f"        out[t] = {body}\n")
    scope = {"cuda": cuda, "grid_dependency": grid_dependency, "grid_dependency_after": grid_dependency_after}
    exec(src, scope)                                 # (k is a literal count of parameters)
    return cuda.jit(scope["kernel"])


def _packed_kernel():
    """The same sum over one array [k, 4, N]."""
    @cuda.jit
    def kernel(a, out):
        t = cuda.threadIdx.x
        if t < out.shape[0]:
            s = float32(0)
            for i in range(a.shape[0]):
                s += a[i, t % a.shape[1], t]
            out[t] = s
    return kernel


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--copies", type=int, default=50)
    ap.add_argument("--passes", type=int, default=2)
    args = ap.parse_args()
    from tree_build import _graph_us

    rng = np.random.default_rng(0)
    stream = cuda.stream()
    packed = _packed_kernel()
    print(f"µs a launch, {args.copies} launches in one graph, queued; one block of {_N} threads")
    from ddtree_numba._device import PDL
    print(f"columns: k separate arrays (ordinary launches; PDL ({PDL}) launches, grid_dependency() first; "
          "PDL, the parameters read before the wait), one packed array")
    print("| arrays | separate | separate, PDL | separate, PDL, read before the wait | one [k, 4, N] array |")
    print("|---|---|---|---|---|")
    for k in args.ks:
        host = rng.standard_normal((k, 4, _N)).astype(np.float32)
        want = sum(host[i, np.arange(_N) % 4, np.arange(_N)] for i in range(k))
        parts = [cuda.to_device(np.ascontiguousarray(host[i])) for i in range(k)]
        whole = cuda.to_device(host)
        out = cuda.device_array(_N, np.float32)
        seps = [_separate_kernel(k, pdl) for pdl in ("", "wait", "after")]
        cells = []
        for launch in [lambda s, sep=sep: sep[1, _N, s](*parts, out) for sep in seps] + [
                lambda s: packed[1, _N, s](whole, out)]:
            launch(0)
            got = out.copy_to_host()
            if not np.allclose(got, want, rtol=1e-5, atol=1e-5):
                raise SystemExit(f"k {k}: the kernel's sums differ from numpy's")
            us = [_graph_us(stream, launch, n=args.copies) for _ in range(args.passes)]
            cells.append(" / ".join(f"{u:.2f}" for u in us))
        print(f"| {k} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
