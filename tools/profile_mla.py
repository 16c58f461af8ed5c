"""Launch the MLA attention's kernels once each at one Moonlight-shape case, for Nsight Compute:
the float32 scores, the tensor-core scores (``MMA_SCORES``), the softmax, the float32 p @ c_kv and
the tensor-core p @ c_kv (``MMA_PV``: its prefix-chunk and tail launches from 4 nodes, else one),
in that order, after a warm-up that ncu skips:

    ncu -k regex:kernel --launch-skip 6 --launch-count 6 python tools/profile_mla.py [nodes]
"""

import argparse
import importlib
import sys
from pathlib import Path

import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mla_stages import SHAPES, case_inputs  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("nodes", type=int, nargs="?", default=256, help="tree nodes (default 256)")
    nodes = ap.parse_args().nodes
    mla = importlib.import_module("ddtree_numba.kernels.mla")
    heads, latent, rope = SHAPES["moonlight"]
    a, kw = case_inputs(np.random.default_rng(0), heads, latent, rope, 1024, 1, nodes, False)

    def launch(names, mma):
        mla.MMA_SCORES = mla.MMA_PV = mma
        for name, go in mla._mla_launches(**a, **kw):
            if name in names:
                go()
    for _ in range(2):          # the first pass compiles (and ncu skips it)
        for names, mma in ((("scores",), False), (("scores",), True), (("softmax",), False), (("pv",), False),
                           (("pv", "pv prefix", "pv tail"), True)):
            launch(names, mma)
        cuda.synchronize()


if __name__ == "__main__":
    main()
