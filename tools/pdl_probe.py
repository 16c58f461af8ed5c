"""Programmatic dependent launch (PDL, sm_90) from numba, measured: a chain of N small kernels,
each reading the row its predecessor wrote, captured into one CUDA graph, replayed, timed.

Usage (a GPU machine): python tools/pdl_probe.py [--kernels 200] [--blocks 1 8 132]

Variants: ``plain`` (ordinary launches), ``pdl`` (launched with programmatic stream serialization,
each kernel ``griddepcontrol.wait`` before its first read), ``trigger-first``
(``griddepcontrol.launch_dependents`` first thing, so the next kernel is launched at once and waits
on the GPU: a chain may run many kernels ahead), ``wait+trigger`` (the wait, then
``launch_dependents``: one kernel ahead, the package's DDTREE_PDL=trigger). Prints µs a kernel
for each and checks every chain's result (a missing wait reads a row before it is written and
fails the check). ``barrier``: the same N steps in *one* launch, the blocks meeting at a software
grid barrier between steps (an atomic counter; each step reads the next block's slice of the row
before, so a barrier that let a block through early fails the check): what a step costs when a
persistent kernel replaces the launches (PLANS §6, the drafter in one launch). Its blocks must all
be resident at once (at most one an SM here, 256 threads). ``barrier-acq``: the same with the
arrival a ``red.release.gpu`` and the spin on ``ld.acquire.gpu`` loads (no fence by every thread,
no atomic read a poll). ``cluster``: up to 8 blocks launched as one thread-block cluster (sm_90),
the steps separated by the hardware cluster barrier (``barrier.cluster.arrive.release`` /
``wait.acquire``); ``cluster-dsmem``: the same with the rows in shared memory, each step reading
the next block's through distributed shared memory; both for 8 blocks only, with the grid the
kernel saw.
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
    from numba import float32

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

    @cuda.jit
    def barrier_steps(a, counter, steps):
        """Step k: a[k + 1, this block's slice] = a[k, the next block's slice] + 1, then a grid
        barrier (thread 0 of each block adds to the counter and spins until every block has)."""
        b, t, W, B = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x, cuda.gridDim.x
        for k in range(steps):
            a[k + 1, b * W + t] = a[k, ((b + 1) % B) * W + t] + 1.0
            cuda.threadfence()              # this block's writes visible before it arrives
            cuda.syncthreads()
            if t == 0:
                cuda.atomic.add(counter, 0, 1)
                while cuda.atomic.add(counter, 0, 0) < (k + 1) * B:   # an atomic read, in L2
                    pass
                cuda.threadfence()
            cuda.syncthreads()

    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    def _address(context, builder, ty, value):
        return builder.ptrtoint(context.make_array(ty)(context, builder, value).data, ir.IntType(64))

    @intrinsic
    def red_release_add(typingctx, counter, value):
        """``red.release.gpu.global.add.s32 [counter.data], value``"""
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [ir.IntType(64), ir.IntType(32)]),
                               "red.release.gpu.global.add.s32 [$0], $1;", "l,r,~{memory}", side_effect=True)
            builder.call(asm, [_address(context, builder, sig.args[0], args[0]),
                               context.cast(builder, args[1], sig.args[1], types.int32)])
            return context.get_dummy_value()
        return types.void(counter, value), codegen

    @intrinsic
    def ld_acquire(typingctx, counter):
        """``ld.acquire.gpu.global.s32`` of counter[0]"""
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.IntType(32), [ir.IntType(64)]),
                               "ld.acquire.gpu.global.s32 $0, [$1];", "=r,l,~{memory}", side_effect=True)
            return builder.call(asm, [_address(context, builder, sig.args[0], args[0])])
        return types.int32(counter), codegen

    @cuda.jit
    def barrier_acq_steps(a, counter, steps):
        """``barrier_steps`` with a release add and acquire loads (thread 0 of each block)."""
        b, t, W, B = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x, cuda.gridDim.x
        for k in range(steps):
            a[k + 1, b * W + t] = a[k, ((b + 1) % B) * W + t] + 1.0
            cuda.syncthreads()
            if t == 0:
                red_release_add(counter, 1)
                while ld_acquire(counter) < (k + 1) * B:
                    pass
            cuda.syncthreads()

    cluster_sync = ptx_intrinsic("probe_cluster_sync",
                                 "barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;")

    @cuda.jit
    def cluster_steps(a, seen, steps):
        """The steps in one launch of one cluster, the hardware cluster barrier between them;
        seen[0] = the grid's blocks as the kernel sees them."""
        b, t, W, B = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x, cuda.gridDim.x
        if b == 0 and t == 0:
            seen[0] = B
        for k in range(steps):
            a[k + 1, b * W + t] = a[k, ((b + 1) % B) * W + t] + 1.0
            cluster_sync()

    @intrinsic
    def ld_cluster(typingctx, buf, i, rank):
        """buf[i] (a float32 shared array) of block ``rank`` of this cluster, through distributed
        shared memory (``mapa`` + ``ld.shared::cluster``)."""
        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            idx = context.cast(builder, args[1], sig.args[1], types.intp)
            ptr = builder.ptrtoint(builder.gep(ary.data, [idx]), ir.IntType(64))
            asm = ir.InlineAsm(ir.FunctionType(ir.FloatType(), [ir.IntType(64), ir.IntType(32)]),
                               "{ .reg .u64 sa; .reg .u32 s32, r32; cvta.to.shared.u64 sa, $1; cvt.u32.u64 s32, sa; "
                               "mapa.shared::cluster.u32 r32, s32, $2; ld.shared::cluster.f32 $0, [r32]; }",
                               "=f,l,r,~{memory}", side_effect=True)
            return builder.call(asm, [ptr, context.cast(builder, args[2], sig.args[2], types.int32)])
        return types.float32(buf, i, rank), codegen

    @cuda.jit
    def cluster_dsmem_steps(a, steps):
        """``cluster_steps`` with the rows kept in shared memory: step k reads the next block's
        slice from its shared memory (distributed shared memory), writes its own, then the cluster
        barrier; the last row goes to a[steps] (a[0] read once)."""
        b, t, W, B = cuda.blockIdx.x, cuda.threadIdx.x, cuda.blockDim.x, cuda.gridDim.x
        buf = cuda.shared.array(512, float32)           # [2, W]: steps alternate halves
        buf[t] = a[0, b * W + t]
        cluster_sync()
        for k in range(steps):
            src, dst = (k % 2) * W, ((k + 1) % 2) * W
            buf[dst + t] = ld_cluster(buf, src + t, (b + 1) % B) + 1.0
            cluster_sync()
        a[steps, b * W + t] = buf[(steps % 2) * W + t]

    wait, trigger = "griddepcontrol.wait;", "griddepcontrol.launch_dependents;"
    variants = (("plain", chain("plain", ""), False), ("pdl", chain("wait", wait), True),
                ("trigger-first", chain("trigger_first", trigger + " " + wait), True),
                ("wait+trigger", chain("wait_trigger", wait + " " + trigger), True))

    real_config = nd.LaunchConfig

    def pdl_config(**kw):
        return real_config(programmatic_stream_serialization=True, **kw)

    n = args.kernels
    zero = np.zeros(1, np.int32)

    def measure(name, blocks, a, enqueue, counter=None):
        """Time ``enqueue(stream)`` (the n steps over ``a``) eagerly, then captured and replayed,
        ``counter`` (the barrier's) zeroed before each run; print µs a step and the check."""
        stream = cuda.stream()

        def run():
            if counter is not None:
                counter.copy_to_device(zero, stream=stream)
            enqueue(stream)

        run()
        stream.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.reps):
            run()
        stream.synchronize()
        eager = (time.perf_counter() - t0) / args.reps / n * 1e6
        exe = capture_graph(enqueue, warm_up=False)
        ok, times = True, []
        start, stop = cuda.event(), cuda.event()
        for r in range(args.reps + 2):
            a.copy_to_device(np.full(a.shape, r, np.float32), stream=stream)
            if counter is not None:
                counter.copy_to_device(zero, stream=stream)
            start.record(stream)
            replay_graph(exe, stream)
            stop.record(stream)
            stop.synchronize()
            times.append(cuda.event_elapsed_time(start, stop) * 1e3 / n)
            got = a.copy_to_host(stream=stream)
            stream.synchronize()
            ok &= bool((got[n] == r + n).all())
        print(f"{blocks:>6} {name:>13} {np.median(times[2:]):>16.2f} {eager:>16.2f} {'yes' if ok else 'NO':>4}")

    print(f"{'blocks':>6} {'variant':>13} {'graph µs/step':>16} {'eager µs/step':>16} {'ok':>4}")
    for blocks in args.blocks:
        width = blocks * 256
        for name, kernel, pdl in variants:
            a = cuda.to_device(np.zeros((n + 1, width), np.float32))

            def enqueue(stream, a=a, kernel=kernel, pdl=pdl):
                nd.LaunchConfig = pdl_config if pdl else real_config
                try:
                    for k in range(n):
                        kernel[blocks, 256, stream](a, k, k + 1)
                finally:
                    nd.LaunchConfig = real_config

            measure(name, blocks, a, enqueue)
        # the same steps in one launch, a grid barrier between them
        a = cuda.to_device(np.zeros((n + 1, width), np.float32))
        counter = cuda.to_device(zero)
        measure("barrier", blocks, a, lambda stream, a=a: barrier_steps[blocks, 256, stream](a, counter, n), counter)
        a = cuda.to_device(np.zeros((n + 1, width), np.float32))
        measure("barrier-acq", blocks, a, lambda stream, a=a: barrier_acq_steps[blocks, 256, stream](a, counter, n),
                counter)
        if blocks == 8:     # one cluster of 8 (cuda.core's LaunchConfig counts the grid in clusters)
            seen = cuda.to_device(zero)

            def in_one_cluster(kernel, *args):
                """An enqueue(stream) of ``kernel[blocks, 256](*args)`` launched as one cluster."""
                def enqueue(stream):
                    nd.LaunchConfig = lambda grid, **kw: real_config(grid=1, cluster=blocks, **kw)
                    try:
                        kernel[blocks, 256, stream](*args)
                    finally:
                        nd.LaunchConfig = real_config
                return enqueue

            for name, kernel, extra in (("cluster", cluster_steps, (seen,)), ("cluster-dsmem", cluster_dsmem_steps, ())):
                a = cuda.to_device(np.zeros((n + 1, width), np.float32))
                try:
                    measure(name, blocks, a, in_one_cluster(kernel, a, *extra, n))
                except Exception as exc:    # a driver or cuda.core without clusters: say so, go on
                    print(f"       {name} launch failed: {type(exc).__name__}: {exc}")
            print(f"       (the cluster kernel saw a grid of {int(seen.copy_to_host()[0])} blocks)")

if __name__ == "__main__":
    main()
