"""A dense bf16 GEMM on wgmma, against the package's GEMM and torch (H200; a probe, not the package).

Usage: python tools/wgmma_gemm_probe.py [--rows 65] [--workspace 128] [--shapes "K,N;..."]
[--blocks "BR,NS[,XA,OV];..."]      (offline: --ptx PTXAS compiles for sm_90a and assembles)

out[r, n] = x[r] . w[n] for x [R, K] float32 and w [N, K] bf16 bits, rows r < n_rows[0], under the
package's reduction contract (``kernels/linear.py``): 64-k chunks, each a chain of four k steps
from zero, the chunk partials added in ascending order in float32. So the output must equal the
package's ``_launch`` bit for bit; "DIFF" marks a block shape that does not.

A block is one warpgroup (128 threads): 64 output features x BR rows.
- The weights ride a ``cp.async`` ring of NS slots in shared memory. Each warp reads its 16
  features' A fragments from the slot as the staged kernel does (lane (g, t): the four
  consecutive k 4t..4t+3 of a k step, as one uint64, for rows g and g + 8).
- The activations, a chunk ahead in registers, are rounded to bf16 and stored once a chunk as
  wgmma's B operand: K-major core matrices of 8 rows x 16 bytes, with the lanes' k order (a step's
  core matrix 0 holds k 4t, 4t + 1 in word t, core matrix 1 holds k 4t + 2, 4t + 3). That is the
  order the package's mma.sync kernels feed, so the products meet in the same tensor-core slots.
- Four m64nBRk16 wgmma a chunk, from zero (``tools/wgmma_bits.py``: on the H200 a chain of them
  gives mma.sync's bits), then added into the running sums.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

BF = 64          # output features a block (one warpgroup)
NT = 128
QP = 18          # uint64 words a weight row of a slot: 16 (64 bf16) + 2 of padding (rows stay 16-byte aligned)


def build(BR, NS, XA=0, OV=0):
    """The kernel for blocks of BF features x BR rows and a ring of NS weight slots. ``XA``: the
    activations ride the ring too (float32 slots, each thread converting its own copies); else
    they are loaded a chunk ahead into registers. ``OV``: a chunk's wgmma run while the next chunk
    is staged (two accumulator sets, ``wgmma.wait_group 1``); else each chunk waits for its own."""
    from numba import cuda, float32, uint32, uint64

    from ddtree_numba._device import device_function, nonneg
    from ddtree_numba.kernels._async import CP_ASYNC_WAIT, cp_async16, cp_async_commit
    from ddtree_numba.kernels._mma import pack_bf16x2
    from ddtree_numba.kernels._widen import hi_f32, lo_f32
    from wgmma_probe import asm_void, commit, fence, proxy_fence, shared_address, wait_all, wgmma_rs

    assert BR % 8 == 0 and 8 <= BR <= 256 and 2 <= NS <= 5
    M = BR // 2                     # accumulators a thread
    XQ = BR * 16 // NT if BR * 16 >= NT else 1   # activation quads (4 k) a thread stages per chunk
    XR = 2 * XQ                     # their uint64 words (float32 pairs)
    XW = BR * 32                    # uint32 words of one chunk's B (4 steps x BR rows x 16 bf16)
    XB = 3 if OV else 2             # B buffers: OV keeps a chunk's in use until the next one's wait
    XS = (NS, BR, 32) if XA else (1, 1, 2)
    wg = wgmma_rs(BR)
    wait_one = asm_void("wgmma.wait_group.sync.aligned 1;")
    wait_ring = CP_ASYNC_WAIT[NS - 2]
    LBO, SBO = 128, 256             # bytes between core matrices along k, along the rows (wgmma_bits.py)
    DESC_HI = ((LBO >> 4) << 16) | ((SBO >> 4) << 32)

    @device_function
    def copy_chunk(c, slot, tid, col0, row0, n, N, wsm, wv, xfs, xv):
        for i in range(4):                # 64 rows x 8 pieces of 16 bytes: 4 a thread
            m = tid + i * NT
            r = m // 8
            piece = m % 8
            ok = col0 + r < N
            cp_async16(wsm, (uint64(slot), uint64(r), uint64(2 * piece)), wv,
                       (uint64(col0 + r) if ok else uint64(0), uint64(c * 16 + 2 * piece)),
                       uint32(16) if ok else uint32(0))
        if XA:
            for i in range(XQ):
                m = tid + i * NT
                if m < BR * 16:
                    r = m // 16
                    u = m % 16
                    ok = row0 + r < n
                    cp_async16(xfs, (uint64(slot), uint64(r), uint64(2 * u)), xv,
                               (uint64(row0 + r) if ok else uint64(0), uint64(c * 32 + 2 * u)),
                               uint32(16) if ok else uint32(0))

    @device_function
    def load_x(c, tid, row0, n, xr, xv):
        for i in range(XQ):
            m = tid + i * NT
            r = m // 16
            u = m % 16
            if m < BR * 16 and row0 + r < n:
                xr[2 * i] = xv[row0 + r, c * 32 + 2 * u]
                xr[2 * i + 1] = xv[row0 + r, c * 32 + 2 * u + 1]
            else:
                xr[2 * i] = uint64(0)
                xr[2 * i + 1] = uint64(0)

    @device_function
    def store_x(b, slot, tid, xsm, xfs, xr):
        for i in range(XQ):
            m = tid + i * NT
            if m < BR * 16:
                r = m // 16
                u = m % 16                # step u // 4, lane word u % 4
                if XA:
                    p0 = xfs[slot, r, 2 * u]
                    p1 = xfs[slot, r, 2 * u + 1]
                else:
                    p0 = xr[2 * i]
                    p1 = xr[2 * i + 1]
                base = (u // 4) * (BR * 8) + (r // 8) * 64 + (r % 8) * 4 + u % 4
                xsm[b, base] = pack_bf16x2(lo_f32(p0), hi_f32(p0))
                xsm[b, base + 32] = pack_bf16x2(lo_f32(p1), hi_f32(p1))

    @device_function
    def chunk(c, acc, prev, C, tid, col0, row0, n, N, wsm, wv, xfs, xv, xsm, xr, wa, ys, xbase, r0, t):
        """Stage chunk c, start its wgmma into acc; with OV, then finish chunk c - 1's (prev)."""
        slot = c % NS
        b = c % XB
        wait_ring()
        store_x(b, slot, tid, xsm, xfs, xr)
        proxy_fence()
        cuda.syncthreads()
        if c + NS - 1 < C:
            copy_chunk(c + NS - 1, (c + NS - 1) % NS, tid, col0, row0, n, N, wsm, wv, xfs, xv)
        cp_async_commit()
        if not XA and c + 1 < C:
            load_x(c + 1, tid, row0, n, xr, xv)
        for st in range(4):               # A fragments first: one fence covers every wgmma's registers
            wa[st] = wsm[slot, r0, 4 * st + t]
            wa[4 + st] = wsm[slot, r0 + 8, 4 * st + t]
        for i in range(M):
            acc[i] = float32(0.0)
        fence()
        for st in range(4):
            u = wa[st]
            u8 = wa[4 + st]
            addr = xbase + uint64(4 * (b * XW + st * BR * 8))
            desc = ((addr & uint64(0x3FFFF)) >> uint64(4)) | uint64(DESC_HI)
            wg(acc, uint32(u & uint64(0xFFFFFFFF)), uint32(u8 & uint64(0xFFFFFFFF)),
               uint32(u >> uint64(32)), uint32(u8 >> uint64(32)), desc)
        commit()
        if OV:
            if c > 0:
                wait_one()
                for i in range(M):
                    ys[i] = ys[i] + prev[i]
        else:
            wait_all()
            for i in range(M):
                ys[i] = ys[i] + acc[i]


    @cuda.jit(launch_bounds=(NT,))
    def kernel(xv, wv, out, n_rows):
        """xv [R, K/2] uint64 (float32 pairs), wv [N, K/4] uint64 (bf16 quads), out [R, N] float32."""
        tid = nonneg(cuda.threadIdx.x)
        warp = tid // 32
        lane = tid % 32
        g = lane // 4
        t = lane % 4
        col0 = nonneg(cuda.blockIdx.x) * BF
        row0 = nonneg(cuda.blockIdx.y) * BR
        n = n_rows[0]
        if row0 >= n:
            return
        N = wv.shape[0]
        C = xv.shape[1] // 32                 # chunks (K % 64 == 0 here)
        wsm = cuda.shared.array((NS, BF, QP), uint64, alignment=16)
        xsm = cuda.shared.array((XB, XW), uint32, alignment=16)
        xfs = cuda.shared.array(XS, uint64, alignment=16)
        ys = cuda.local.array(M, float32)
        acc0 = cuda.local.array(M, float32)
        acc1 = cuda.local.array(M, float32)
        xr = cuda.local.array(XR, uint64)
        wa = cuda.local.array(8, uint64)
        for i in range(M):
            ys[i] = float32(0.0)

        for c in range(NS - 1):
            if c < C:
                copy_chunk(c, c, tid, col0, row0, n, N, wsm, wv, xfs, xv)
            cp_async_commit()
        if not XA:
            load_x(0, tid, row0, n, xr, xv)
        xbase = shared_address(xsm)
        r0 = 16 * warp + g
        for c2 in range(0, C, 2):
            chunk(c2, acc0, acc1, C, tid, col0, row0, n, N, wsm, wv, xfs, xv, xsm, xr, wa, ys, xbase, r0, t)
            if c2 + 1 < C:
                chunk(c2 + 1, acc1, acc0, C, tid, col0, row0, n, N, wsm, wv, xfs, xv, xsm, xr, wa, ys, xbase, r0, t)
        if OV:
            wait_all()
            if C % 2 == 1:
                for i in range(M):
                    ys[i] = ys[i] + acc0[i]
            else:
                for i in range(M):
                    ys[i] = ys[i] + acc1[i]
        for i in range(M):                    # d[4j + 2h + e]: feature g + 8h, row 8j + 2t + e
            j = i // 4
            h = (i // 2) % 2
            e = i % 2
            r = row0 + 8 * j + 2 * t + e
            f = col0 + r0 + 8 * h
            if r < n and f < N:
                out[r, f] = ys[i]

    return kernel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=65)
    ap.add_argument("--workspace", type=int, default=128)
    ap.add_argument("--shapes", default="2048,3072;512,3072;2048,2048;2048,16384")
    ap.add_argument("--blocks", default="16,4;16,3,1;16,4,0,1;16,3,1,1;8,3,1,1;32,4,0,1")
    ap.add_argument("--ptx", metavar="PTXAS", help="no GPU: compile for sm_90a and assemble with this ptxas")
    a = ap.parse_args()
    blocks = [tuple(int(v) for v in b.split(",")) for b in a.blocks.split(";")]
    from numba import cuda
    if a.ptx:
        from numba.cuda import dispatcher

        from wgmma_probe import assemble_sm90a

        class H200:
            compute_capability = (9, 0)
        dispatcher.get_current_device = lambda: H200()
        for b in blocks:
            k = build(*b)
            sig = "void(uint64[:, ::1], uint64[:, ::1], float32[:, ::1], int32[::1])"
            ptx, _ = cuda.compile_ptx(k.py_func, sig, cc=(9, 0, "a"))
            print(b, "ptxas:", assemble_sm90a(ptx, a.ptx))
        return
    cuda.get_current_device().compute_capability = (9, 0, "a")   # before any kernel compiles
    import importlib

    from _common import random_bf16
    from gemm import graph_time, torch_time
    L = importlib.import_module("ddtree_numba.kernels.linear")
    try:
        import torch
    except ImportError:
        torch = None
    st = cuda.stream()
    n_rows = cuda.to_device(np.array([a.rows], np.int32), stream=st)
    rng = np.random.default_rng(0)
    kernels = {b: build(*b) for b in blocks}
    print(f"rows {a.rows} in a {a.workspace}-row workspace; µs a launch (graph); wgmma blocks (BR, NS)")
    print("K,N".ljust(12) + "package".rjust(10) + "".join(str(b).rjust(16) for b in blocks)
          + ("torch".rjust(10) if torch else ""))
    for shape in a.shapes.split(";"):
        K, N = (int(v) for v in shape.split(","))
        w = random_bf16((N, K), 0.05, K * 7 + N, st).reshape(1, N, K)
        x = cuda.to_device(rng.standard_normal((a.workspace, K)).astype(np.float32), stream=st)
        ref_out = cuda.device_array((a.workspace, N), np.float32, stream=st)

        def package():
            L._launch(x, 0, w, None, ref_out, 0, n_rows, None, None, a.workspace, False, "bf16", st, None)
        package()
        ref = ref_out.copy_to_host(stream=st)[:a.rows]
        cols = [f"{graph_time(package, st):10.1f}"]
        xv, wv = x.view(np.uint64), w.reshape(N, K).view(np.uint64)
        for (BR, *_), kern in kernels.items():
            out = cuda.to_device(np.full((a.workspace, N), np.nan, np.float32), stream=st)
            grid = (N // BF, -(-a.workspace // BR))

            def fn(kern=kern, out=out, grid=grid):
                kern[grid, NT, st](xv, wv, out, n_rows)
            fn()
            got = out.copy_to_host(stream=st)[:a.rows]
            st.synchronize()
            diff = int((got.view(np.uint32) != ref.view(np.uint32)).sum())
            cols.append(f"{graph_time(fn, st):8.1f}" + (f" DIFF{diff}" if diff else "").ljust(8))
        line = f"{K},{N}".ljust(12) + "".join(c.rjust(10 if i == 0 else 16) for i, c in enumerate(cols))
        if torch:
            tx = torch.randn(a.rows, K, device="cuda", dtype=torch.bfloat16)
            tw = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
            line += f"{torch_time(lambda: torch.nn.functional.linear(tx, tw)):10.1f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
