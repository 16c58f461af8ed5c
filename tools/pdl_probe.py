"""Programmatic dependent launch (PDL, sm_90) from numba, measured: a chain of N small kernels,
each reading the row its predecessor wrote, captured into one CUDA graph, replayed, timed.

Usage (a GPU machine): python tools/pdl_probe.py [--kernels 200] [--blocks 1 8 132]

Variants: ``plain`` (ordinary launches), ``pdl`` (launched with programmatic stream serialization,
each kernel ``griddepcontrol.wait`` before its first read), ``trigger-first``
(``griddepcontrol.launch_dependents`` first thing, so the next kernel is launched at once and waits
on the GPU: a chain may run many kernels ahead), ``wait+trigger`` (the wait, then
``launch_dependents``: one kernel ahead, the package's DDTREE_PDL=trigger). Prints µs a kernel
for each and checks every chain's result (a missing wait reads a row before it is written and
fails the check).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=200)
    ap.add_argument("--blocks", type=int, nargs="+", default=[1, 8, 132])
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()

    from numba import cuda
    import numba.cuda.dispatcher as nd

    from ddtree_numba._device import capture_graph, ptx_intrinsic, replay_graph

    def chain(name, text):
        """A chain link: ``text`` (PTX, as the package's grid_dependency emits it) first, then
        row dst = row src + 1."""
        first = ptx_intrinsic(f"probe_{name}", text)   # named apart from the package's grid_dependency

        @cuda.jit
        def kernel(a, src, dst):
            first()
            i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
            a[dst, i] = a[src, i] + 1.0

        return kernel

    wait, trigger = "griddepcontrol.wait;", "griddepcontrol.launch_dependents;"
    variants = (("plain", chain("plain", ""), False), ("pdl", chain("wait", wait), True),
                ("trigger-first", chain("trigger_first", trigger + " " + wait), True),
                ("wait+trigger", chain("wait_trigger", wait + " " + trigger), True))

    real_config = nd.LaunchConfig

    def pdl_config(**kw):
        return real_config(programmatic_stream_serialization=True, **kw)

    n = args.kernels
    print(f"{'blocks':>6} {'variant':>13} {'graph µs/kernel':>16} {'eager µs/kernel':>16} {'ok':>4}")
    for blocks in args.blocks:
        width = blocks * 256
        for name, kernel, pdl in variants:
            a = cuda.to_device(np.zeros((n + 1, width), np.float32))

            def enqueue(stream):
                nd.LaunchConfig = pdl_config if pdl else real_config
                try:
                    for k in range(n):
                        kernel[blocks, 256, stream](a, k, k + 1)
                finally:
                    nd.LaunchConfig = real_config

            stream = cuda.stream()
            enqueue(stream)
            stream.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.reps):
                enqueue(stream)
            stream.synchronize()
            eager = (time.perf_counter() - t0) / args.reps / n * 1e6
            exe = capture_graph(enqueue, warm_up=False)
            ok = True
            start, stop = cuda.event(), cuda.event()
            times = []
            for r in range(args.reps + 2):
                a.copy_to_device(np.full((n + 1, width), r, np.float32), stream=stream)
                start.record(stream)
                replay_graph(exe, stream)
                stop.record(stream)
                stop.synchronize()
                times.append(cuda.event_elapsed_time(start, stop) * 1e3 / n)
                got = a.copy_to_host(stream=stream)
                stream.synchronize()
                ok &= bool((got[n] == r + n).all())
            print(f"{blocks:>6} {name:>13} {np.median(times[2:]):>16.2f} {eager:>16.2f} {'yes' if ok else 'NO':>4}")


if __name__ == "__main__":
    main()
