"""Can numba drive Hopper's wgmma? An offline check (no GPU): compile one warpgroup MMA to PTX and
assemble it.

Usage: python tools/wgmma_probe.py [PTXAS]   (PTXAS: a CUDA 12.3+ ptxas, e.g.
/usr/local/cuda-13.0/bin/ptxas; without it only the PTX is printed)

wgmma needs the architecture-specific target sm_90a. numba-cuda 0.30 compiles for it when the
compute capability is given as a 3-tuple: ``cuda.compile_ptx(..., cc=(9, 0, "a"))`` writes
``.target sm_90a``. ``cuda.jit`` compiles for ``get_current_device().compute_capability``, a
plain 2-tuple attribute, so running wgmma from a jitted kernel needs that attribute set to
(9, 0, "a") before the first compile, or the PTX loaded by hand.

The kernel below is the register-A form, m64n8k16 bf16 with float32 accumulators. A warpgroup
(4 warps, 128 threads) holds A, 64 x 16, as four bf16x2 words a thread. B, 16 x 8, is in shared
memory and named by a 64-bit matrix descriptor. Each thread gets 4 of D's 64 x 8 float32. The
inline asm goes through llvmlite like ``kernels/_mma.py``'s mma.sync, with a fence before and a
commit and wait after. Twentieth session: ptxas (CUDA 13.0) assembles it to
``HGMMA.64x8x16.F32.BF16`` with ``WARPGROUP.ARRIVE`` / ``WARPGROUP.DEPBAR``.

What this does not answer yet (it needs the H200):
- whether a chain of wgmma k-steps from zero gives, for each 64-k chunk, the bits of four
  chained mma.sync m16n8k16, which the GEMMs' batch-invariance contract needs (docs/DESIGN.md §4);
- the descriptor layout for our shared tiles (start address >> 4, leading / stride byte
  offsets, swizzle mode).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile

from llvmlite import ir
from numba import config, cuda, float32, types
from numba.cuda.extending import intrinsic


def asm_void(text):
    """An intrinsic emitting ``text``, a PTX statement of no operands (also tools/wgmma_bits.py's)."""
    @intrinsic
    def emit(typingctx):
        def codegen(context, builder, signature, args):
            fn = ir.FunctionType(ir.VoidType(), [])
            builder.call(ir.InlineAsm(fn, text, "~{memory}", side_effect=True), [])
        return types.void(), codegen
    return emit


fence = asm_void("wgmma.fence.sync.aligned;")
commit = asm_void("wgmma.commit_group.sync.aligned;")
wait_all = asm_void("wgmma.wait_group.sync.aligned 0;")


# A shared-memory matrix descriptor's fixed fields for K-major core matrices with no swizzle: LBO,
# the bytes between core matrices along k, and SBO, along the rows (tools/wgmma_bits.py found this
# order on the H200). The start address (>> 4, 14 bits) is added per operand.
LBO, SBO = 128, 256


def desc_hi(lbo=LBO, sbo=SBO):
    """The descriptor's offset fields: LBO >> 4 at bit 16, SBO >> 4 at bit 32 (swizzle bits 0)."""
    return ((lbo >> 4) << 16) | ((sbo >> 4) << 32)


proxy_fence = asm_void("fence.proxy.async.shared::cta;")   # generic-proxy shared writes -> wgmma reads


@intrinsic
def shared_address(typingctx, arr):
    """The shared-window address (for a wgmma descriptor) of a shared array's first element."""
    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        p = builder.ptrtoint(ary.data, ir.IntType(64))
        fn = ir.FunctionType(ir.IntType(64), [ir.IntType(64)])
        return builder.call(ir.InlineAsm(fn, "cvta.to.shared.u64 $0, $1;", "=l,l"), [p])
    return types.uint64(arr), codegen


_WGMMA_RS = {}


def wgmma_rs(n, first=False):
    """An intrinsic ``wgmma_rs(acc, a0, a1, a2, a3, desc_b)``: acc (a float32 local array of n / 2,
    this thread's D fragment of 64 x n) += A (registers: four bf16x2 words, mma.sync's m16 A
    fragment of the warp's 16 rows) @ B (shared, 16 x n bf16 named by ``desc_b``), m64nNk16. The
    accumulators are read from and written back to ``acc`` (constant indices: registers).
    ``first``: acc = A @ B, its old values not read (scale-d false), so starting a chain writes no
    input register of a wgmma still in flight (ptxas serializes wgmma around such writes)."""
    if (n, first) in _WGMMA_RS:
        return _WGMMA_RS[n, first]
    m = n // 2
    outs = ",".join(f"${i}" for i in range(m))
    nin = 0 if first else m                 # operands: the m outputs, the m inputs tied to them (unless
    text = ("{ .reg .pred p; setp.ne.b32 p, " + ("0" if first else "1") + ", 0; "   # first), A, the descriptor
            f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 "
            f"{{{outs}}}, {{${m + nin}, ${m + nin + 1}, ${m + nin + 2}, ${m + nin + 3}}}, ${m + nin + 4}, p, 1, 1, 0; }}")
    cons = ",".join(["=f"] * m + [str(i) for i in range(nin)] + ["r"] * 4 + ["l"])

    @intrinsic
    def wg(typingctx, acc, a0, a1, a2, a3, desc):
        sig = types.void(acc, types.uint32, types.uint32, types.uint32, types.uint32, types.uint64)

        def codegen(context, builder, signature, args):
            from numba.core import cgutils
            f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
            ary = context.make_array(signature.args[0])(context, builder, args[0])
            ptrs = [cgutils.gep_inbounds(builder, ary.data, i) for i in range(m)]
            vals = [] if first else [builder.load(p) for p in ptrs]
            fn = ir.FunctionType(ir.LiteralStructType([f32] * m), [f32] * nin + [i32] * 4 + [i64])
            res = builder.call(ir.InlineAsm(fn, text, cons, side_effect=True), vals + list(args[1:]))
            for i, p in enumerate(ptrs):
                builder.store(builder.extract_value(res, i), p)
            return context.get_dummy_value()
        return sig, codegen
    _WGMMA_RS[n, first] = wg
    return wg


_WGMMA_N8 = wgmma_rs(8)             # the offline check's instruction


def probe(out, a, desc):
    t = cuda.threadIdx.x
    d = cuda.local.array(4, float32)
    for i in range(4):
        d[i] = float32(0)
    fence()
    _WGMMA_N8(d, a[t, 0], a[t, 1], a[t, 2], a[t, 3], desc[0])
    commit()
    wait_all()
    for i in range(4):
        out[t, i] = d[i]


def assemble_sm90a(ptx, ptxas):
    """'assembled', or ptxas's error, for PTX compiled with cc=(9, 0, "a")."""
    ptx = re.sub(r"^\.version \d+\.\d+", ".version 8.8", ptx, flags=re.M)   # what a CUDA 13.0 ptxas reads
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = f"{tmp}/k.ptx", f"{tmp}/k.cubin"
        with open(src, "w") as f:
            f.write(ptx)
        res = subprocess.run([ptxas, "-arch=sm_90a", src, "-o", cubin], capture_output=True, text=True)
    return "assembled" if res.returncode == 0 else res.stderr.strip()[:600]


if bool(config.ENABLE_CUDASIM):      # the simulator's stand-ins for the inline PTX (tools/wgmma_sim.py)
    from wgmma_sim import asm_void, shared_address, wgmma_rs  # noqa: F811
    fence, commit, wait_all = (asm_void(t) for t in ("wgmma.fence.sync.aligned;", "wgmma.commit_group.sync.aligned;",
                                                     "wgmma.wait_group.sync.aligned 0;"))
    proxy_fence = asm_void("fence.proxy.async.shared::cta;")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ptxas", nargs="?", help="a CUDA 12.3+ ptxas to assemble the PTX with")
    args = ap.parse_args()
    ptx, _ = cuda.compile_ptx(probe, "void(float32[:, ::1], uint32[:, ::1], uint64[::1])", cc=(9, 0, "a"))
    print([line for line in ptx.splitlines() if line.startswith(".target")])
    print([line.strip() for line in ptx.splitlines() if "wgmma" in line])
    if args.ptxas:
        print("ptxas:", assemble_sm90a(ptx, args.ptxas))


if __name__ == "__main__":
    main()
