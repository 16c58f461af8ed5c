"""Does a chain of wgmma k-steps give the bits of chained mma.sync? (H200)

Usage (on the GPU machine): python tools/wgmma_bits.py [--seeds 20]

The GEMMs' batch-invariance contract (docs/DESIGN.md §4) fixes each 64-k chunk's partial as a
chain of four m16n8k16 mma.sync steps from zero. A wgmma kernel keeps the bits only if its chain
of m64n8k16 steps rounds like mma.sync does. This script checks that on random bf16 operands.

One warpgroup (128 threads) multiplies A [64 x 64] by B [64 x 8] twice:
- **mma.sync**: warp w takes rows 16w .. 16w + 15 and chains its four k-steps, using the
  package's ``mma_bf16`` with the PTX ISA's m16n8k16 fragment layout.
- **wgmma**: four m64n8k16 steps with A in registers (the same per-warp fragments) and B in shared
  memory, named by a matrix descriptor. B is K-major with no swizzle. Each k-step is two 8 x 8
  core matrices of 128 bytes, one after the other along k.

The descriptor's leading and stride byte offsets are tried both ways round. The order that matches
float64 A @ B is the layout, and that result is then compared bit for bit with mma.sync's.

wgmma needs the sm_90a target. numba compiles for the current device's compute capability, a
2-tuple attribute, so the script sets it to (9, 0, "a") before its first compile
(``tools/wgmma_probe.py``, whose wgmma intrinsics and ptxas check this script uses).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))     # tools/wgmma_probe.py


def build(on_device=True):
    """The probe kernel (``on_device``: compiled for sm_90a on this GPU when first launched)."""
    from numba import cuda, float32, uint32, uint64

    from wgmma_probe import commit, fence, proxy_fence, shared_address, wait_all, wgmma_rs

    if on_device:
        cuda.get_current_device().compute_capability = (9, 0, "a")   # sm_90a for every kernel from here on
    from ddtree_numba.kernels._mma import mma_bf16
    wgmma_n8 = wgmma_rs(8)

    @cuda.jit
    def kernel(a32, bt32, lbo, sbo, out_w, out_m):
        """a32 [64, 32]: A's bf16 pairs (k, k + 1) a word; bt32 [8, 32]: B transposed, pairs along k."""
        t = cuda.threadIdx.x
        w = t // 32
        lane = t % 32
        g = lane // 4
        q = lane % 4
        sm = cuda.shared.array(256, uint32, alignment=16)   # 4 k-steps x 2 core matrices x 8 n x 4 words
        for i in range(t, 256, 128):
            ks = i // 64
            cm = (i // 32) % 2
            n = (i // 4) % 8
            j = i % 4                          # word j of the core-matrix row: k pair 8cm + 2j
            sm[i] = bt32[n, (16 * ks + 8 * cm) // 2 + j]
        proxy_fence()
        cuda.syncthreads()
        r0 = 16 * w + g
        # mma.sync: the warp's m16 tile, four k-steps chained from zero
        c0 = c1 = c2 = c3 = float32(0.0)
        for ks in range(4):
            kw = 8 * ks + q                    # word of k = 16 ks + 2q
            d = mma_bf16(a32[r0, kw], a32[r0 + 8, kw], a32[r0, kw + 4], a32[r0 + 8, kw + 4],
                         bt32[g, kw], bt32[g, kw + 4], c0, c1, c2, c3)
            c0, c1, c2, c3 = d[0], d[1], d[2], d[3]
        out_m[r0, 2 * q] = c0
        out_m[r0, 2 * q + 1] = c1
        out_m[r0 + 8, 2 * q] = c2
        out_m[r0 + 8, 2 * q + 1] = c3
        # wgmma: the same A fragments, B from shared memory
        base = shared_address(sm)
        e = cuda.local.array(4, float32)
        for i in range(4):
            e[i] = float32(0.0)
        fence()
        for ks in range(4):
            kw = 8 * ks + q
            desc = (((base + uint64(256 * ks)) & uint64(0x3FFFF)) >> uint64(4)) | \
                   ((uint64(lbo) >> uint64(4)) << uint64(16)) | ((uint64(sbo) >> uint64(4)) << uint64(32))
            wgmma_n8(e, a32[r0, kw], a32[r0 + 8, kw], a32[r0, kw + 4], a32[r0 + 8, kw + 4], desc)
        commit()
        wait_all()
        out_w[r0, 2 * q] = e[0]
        out_w[r0, 2 * q + 1] = e[1]
        out_w[r0 + 8, 2 * q] = e[2]
        out_w[r0 + 8, 2 * q + 1] = e[3]

    return cuda, kernel


def assemble(ptxas):
    """Compile the kernel for sm_90a without a GPU and assemble it (a check of the inline PTX)."""
    from numba.cuda import dispatcher
    from wgmma_probe import assemble_sm90a

    class H200:
        compute_capability = (9, 0)
    dispatcher.get_current_device = lambda: H200()    # compile without a GPU (tools/kernel_registers.py)
    cuda, kernel = build(on_device=False)
    sig = "void(uint32[:, ::1], uint32[:, ::1], int64, int64, float32[:, ::1], float32[:, ::1])"
    ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0, "a"))
    print("ptxas:", assemble_sm90a(ptx, ptxas))


def main():
    from ddtree_numba.dtypes import bf16_to_float32, to_bf16_bits
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--ptx", metavar="PTXAS", help="no GPU: compile for sm_90a and assemble with this ptxas")
    args = ap.parse_args()
    if args.ptx:
        return assemble(args.ptx)
    cuda, kernel = build()
    layout = None
    same = 0
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        a = to_bf16_bits(rng.standard_normal((64, 64)).astype(np.float32))
        bt = to_bf16_bits(rng.standard_normal((8, 64)).astype(np.float32))
        want = bf16_to_float32(a).astype(np.float64) @ bf16_to_float32(bt).astype(np.float64).T
        d_a, d_bt = cuda.to_device(a.view(np.uint32)), cuda.to_device(bt.view(np.uint32))
        for lbo, sbo in ([layout] if layout else [(128, 256), (256, 128)]):
            out_w = cuda.to_device(np.full((64, 8), np.nan, np.float32))
            out_m = cuda.to_device(np.full((64, 8), np.nan, np.float32))
            kernel[1, 128](d_a, d_bt, lbo, sbo, out_w, out_m)
            got_w, got_m = out_w.copy_to_host(), out_m.copy_to_host()
            err_m = float(np.abs(got_m - want).max() / np.abs(want).max())
            err_w = float(np.nanmax(np.abs(got_w - want)) / np.abs(want).max()) if np.isfinite(got_w).all() else np.inf
            if layout is None:
                print(f"seed {seed} LBO {lbo} SBO {sbo}: mma.sync rel err {err_m:.2e}, wgmma {err_w:.2e}")
            if err_w < 1e-3:
                layout = (lbo, sbo)
                eq = np.array_equal(got_w.view(np.uint32), got_m.view(np.uint32))
                same += eq
                if not eq:
                    print(f"seed {seed}: {int((got_w.view(np.uint32) != got_m.view(np.uint32)).sum())} of 512 "
                          f"outputs differ in bits")
                break       # the other order reads past the 1 KiB of B: an illegal address
        if layout is None:
            print("no descriptor layout matched A @ B: the descriptor or the fragment layout is wrong")
            return
    print(f"layout LBO {layout[0]} SBO {layout[1]}: wgmma == mma.sync bit for bit on {same} of {args.seeds} seeds")


if __name__ == "__main__":
    main()
