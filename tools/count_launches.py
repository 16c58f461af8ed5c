"""Count the kernel launches of one device round of the demo pair, by stage and by kernel.

    python tools/count_launches.py [--method ddtree|dflash|ar] [--budget 16] [--gpu-tiles] [--batch S]

Runs on the CPU under the CUDA simulator, and runs nothing: after the models are loaded, every
launch is recorded instead of executed (``FakeCUDAKernel.__getitem__`` patched), while one
``DeviceRound.enqueue_round`` enqueues a round. A round's launches do not depend on the values on
the device, so the count is the GPU's (the kernel names are the simulator's picks: for the same
launch the GPU may pick the other GEMM kernel, ``_mma_kernel`` or ``_staged_kernel``). ``--gpu-tiles`` makes
``kernels.linear`` choose its tiles by the GPU's rules (nothing runs, so the simulator's own
limits do not matter): then the names and counts are the GPU's. On the H200 a launch in a captured graph costs about
2.3 µs (docs/PERFORMANCE.md), which is what sets the demo pair's round: this is the table to keep
when fusing kernels. ``--batch S``: a round of ``generate_batch``'s GPU round for S sequences
(``decode.device_batch.BatchDeviceRound``), counted as one stage.
"""

import argparse
import collections
import os
import sys

os.environ["NUMBA_ENABLE_CUDASIM"] = "1"      # before numba is imported

from numba.cuda.simulator import kernel as sim_kernel  # noqa: E402

from ddtree_numba.decode import device  # noqa: E402
from ddtree_numba.demo import demo_pair  # noqa: E402
from ddtree_numba.model import loader  # noqa: E402

NEXT = {"draft": "topk", "topk": "build", "build": "verify", "verify": "accept", "accept": "compact",
        "compact": "after"}


def gpu_tiles():
    """``kernels.linear``'s tile rules as on a GPU: its simulator switch off while a launch is
    planned, and its GPU tables (``_GPU_RULES``)."""
    import importlib
    lin = importlib.import_module("ddtree_numba.kernels.linear")
    plan = lin._plan

    def gpu_plan(*args, **kwargs):                # the rules read the switch; the kernels keep it
        lin._SIM = False
        try:
            return plan(*args, **kwargs)
        finally:
            lin._SIM = True
    lin._plan = gpu_plan
    lin.TILES, lin._WARPS_WANTED, lin._NW_MAX, lin._STAGED_ROWS, lin._STAGED_BLOCKS, lin._STAGED = lin._GPU_RULES
    lin._choose.cache_clear()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="ddtree", choices=("ddtree", "dflash", "ar"))
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--gpu-tiles", action="store_true", help="the GEMM tiles a GPU chooses")
    ap.add_argument("--batch", type=int, default=0, metavar="S", help="a batched round of S sequences")
    args = ap.parse_args(argv)
    if args.gpu_tiles:
        gpu_tiles()

    pair = loader.load_pair(*demo_pair(), backend="cuda")
    drafter = None if args.method == "ar" else pair.drafter
    L = 0 if drafter is None else drafter.block_size - 1
    K, cap = {"ar": (1, 0), "dflash": (1, L), "ddtree": (args.budget, args.budget)}[args.method]
    if args.batch:
        from ddtree_numba.decode import device_batch
        rnd = device_batch.BatchDeviceRound(pair.target, drafter, args.method, K, cap, args.batch, 64, 32, 0.0)
    else:
        rnd = device.DeviceRound(pair.target, drafter, args.method, K, cap, 64, 16)

    stage = ["round" if args.batch else "draft" if drafter is not None else "verify"]
    counts = collections.defaultdict(collections.Counter)
    launch = sim_kernel.FakeCUDAKernel.__getitem__

    def record(self, config):
        launch(self, config)                      # the launch configuration is still checked
        name = getattr(self.fn, "__qualname__", "?").replace(".<locals>.kernel", "")
        return lambda *a, **k: counts[stage[0]].update([name])

    sim_kernel.FakeCUDAKernel.__getitem__ = record
    if args.batch:
        rnd.enqueue_round(0)
    else:
        rnd.enqueue_round(0.0, 0, lambda done: stage.__setitem__(0, NEXT[done]))
    total = 0
    print(f"{args.method}" + (f", budget {args.budget}" if args.method == "ddtree" else "")
          + (f", batch {args.batch}" if args.batch else "") + ": launches a round")
    for name, per_kernel in counts.items():
        n = sum(per_kernel.values())
        total += n
        print(f"  {name:8s} {n:4d}   " + ", ".join(f"{k} x{v}" for k, v in per_kernel.most_common()))
    print(f"  {'total':8s} {total:4d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
