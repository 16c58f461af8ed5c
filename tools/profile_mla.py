"""Launch the MLA attention's kernels once each at one Moonlight-shape case, for Nsight Compute:
the float32 scores, the tensor-core scores (``MMA_SCORES``), the softmax, the float32 p @ c_kv and
the tensor-core p @ c_kv (``MMA_PV``: its prefix-chunk and tail launches from 4 nodes, else one),
then the fused kernel's prefix and tail launches (``MLA_FUSED``), in that order, after a warm-up
that ncu skips:

    ncu -k regex:kernel --launch-skip 8 --launch-count 8 python tools/profile_mla.py [nodes] [sequences]

``sequences`` > 1: that many sequences of ``nodes`` rows each in one launch set (a pool).
"""

import importlib
import sys
from pathlib import Path

import numpy as np
from numba import cuda

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mla_stages import SHAPES, case_inputs  # noqa: E402


def main():
    nodes = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    n_seq = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    mla = importlib.import_module("ddtree_numba.kernels.mla")
    heads, latent, rope = SHAPES["moonlight"]
    a, kw = case_inputs(np.random.default_rng(0), heads, latent, rope, 1024, n_seq, nodes, n_seq > 1)

    def launch(names, mma, fused=False):
        mla.MMA_SCORES = mla.MMA_PV = mma
        mla.MLA_FUSED = fused
        for name, go in mla._mla_launches(**a, **kw):
            if name in names:
                go()
    for _ in range(2):          # the first pass compiles (and ncu skips it)
        for names, mma in ((("scores",), False), (("scores",), True), (("softmax",), False), (("pv",), False),
                           (("pv", "pv prefix", "pv tail"), True)):
            launch(names, mma)
        launch(("fused prefix", "fused tail"), True, True)
        cuda.synchronize()


if __name__ == "__main__":
    main()
