"""One experiment: can numba-cuda emit Hopper's wgmma (needs the sm_90a target)?"""
from llvmlite import ir
from numba import cuda, types
from numba.cuda.extending import intrinsic


@intrinsic
def _fence(typingctx):
    sig = types.void()

    def codegen(context, builder, signature, args):
        asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), "wgmma.fence.sync.aligned;", "")
        builder.call(asm, [])
    return sig, codegen


@cuda.jit
def probe(out):
    _fence()
    out[0] = 1


import numpy as np
d = cuda.to_device(np.zeros(1, np.int32))
try:
    probe[1, 128](d)
    cuda.synchronize()
    print("wgmma.fence: launched, out =", d.copy_to_host())
except Exception as exc:
    print("wgmma.fence on the default target failed:", type(exc).__name__, str(exc)[:300])
ptx, _ = cuda.compile_ptx(probe.py_func, "void(int32[::1])", cc=(9, 0))
print([l for l in ptx.splitlines() if l.startswith(".target")])
