"""tools/contraction_audit.py: the multiply-adds a kernel's PTX leaves for ptxas to fuse (docs/DESIGN.md
§4), found in hand-written PTX, and none in kernels that must agree bit for bit (the forty-eighth
session: `a * c - b * s` left to ptxas made two rope kernels differ on a GPU)."""

import os
import subprocess
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))

from contraction_audit import contractable  # noqa: E402

PTX = """
.version 8.8
.target sm_90
.visible .entry k(
\t.param .u64 k_param_0
)
{
\t.loc\t1 10 0
\tmul.f32 \t%f3, %f1, %f2;
\tmul.f32 \t%f6, %f4, %f5;
\t.loc\t1 11 0
\tsub.f32 \t%f7, %f3, %f6;
\t.loc\t1 12 0
\tmul.f32 \t%f8, %f1, %f5;
\tneg.f32 \t%f9, %f8;
\tadd.f32 \t%f10, %f2, %f9;
\t.loc\t1 13 0
\tmul.rn.f32 \t%f11, %f1, %f2;
\tadd.f32 \t%f12, %f11, %f4;
\t.loc\t1 14 0
\tmul.f32 \t%f13, %f1, %f4;
\tsub.rn.f32 \t%f14, %f13, %f2;
\tfma.rn.f32 \t%f15, %f1, %f2, %f13;
\t.loc\t1 15 0
\tadd.f32 \t%f16, %f1, %f2;
\t@%p1 mul.f64 \t%fd3, %fd1, %fd2;
\tadd.f64 \t%fd4, %fd3, %fd1;
\tret;
}
\t.file\t1 "/src/kernel.py"
"""


def test_the_pairs_ptxas_may_fuse_are_found_and_no_others():
    # line 11: a sub of two plain muls; 12: through a neg; 15: an f64 mul under a predicate. Not:
    # 13 (the mul rounds: .rn), 14 (the sub rounds; an fma.rn's addend), 15's add of two loads.
    assert contractable(PTX) == [("/src/kernel.py", 11, "sub.f32"), ("/src/kernel.py", 12, "add.f32"),
                                 ("/src/kernel.py", 15, "add.f64")]


def test_kernels_that_must_agree_leave_nothing_to_ptxas():
    """The three kernels that rotate rope vectors, and the GQA warp kernel, whose bits must be the
    split kernel's (its running sum's rescale is a written fma; the split kernel has the same line,
    left out here for its compile time)."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run([sys.executable, str(TOOLS / "contraction_audit.py"), "rope._rope_kernel",
                           "rope._rope_table_kernel", "rms_norm._qkv_norm_rope_kernel", "gqa._gqa_warp_kernel"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 source lines with a multiply-add left to ptxas in 4 kernel(s)" in proc.stdout, proc.stdout
