#!/usr/bin/env bash
# The next session's first H200 call (after the eighth session, ~9 minutes); run from the repo root
# with .whl carried and DDTREE_COMMIT set; logs to $OUT/log.txt, Nsight Compute to $OUT/ncu_*.txt.
# 1. MLA's scores and p @ c_kv on tensor cores (kernels.mla.MMA_SCORES, MMA_PV: built and
#    simulator-tested, off until measured): the MLA tests on the GPU (within the twins' bounds,
#    reference.mla.mma_scores / mma_pv; a tree node == the token alone; sequences of a pool ==
#    their own launches), tools/mla_stages.py both ways (fp32 chains: scores 145 / 434 / 2,300 µs
#    and p @ c_kv 99 / 391 / 1,919 of 290 / 994 / 5,119 at 64 / 256 / 1024 nodes), and the verify
#    at 64 and 256 nodes with both (686f15d without: 24.51 / 65.97 ms; HF 68.4 at 64);
# 2. why a heap-build pop costs ~1.1-1.5 µs (2,000-2,600 cycles) whether the frontier is a
#    block's shared memory or one warp's registers: Nsight Compute on the build at budget 64;
# 3. Nsight Compute on the split top-K at V 163840, k 64 (partial ~60 µs, merge ~40);
# 4. benchmarks/tree_build.py (issue 15's table).
set -u
export DDTREE_COMMIT=${DDTREE_COMMIT:-unknown}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s)
left() { echo $(( $1 - $(date +%s) + T0 )); }
{
timeout $(left 100) python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_mla_kernel.py --tb=short 2>&1 \
  | grep -v Warn | tail -12
timeout $(left 170) python3 tools/mla_stages.py --shape moonlight --cases 64 256 1024 2>&1 | grep -v Warn | tail -6
timeout $(left 240) python3 tools/mla_stages.py --shape moonlight --cases 64 256 1024 16x17 --mma-scores --mma-pv \
  2>&1 | grep -v Warn | tail -7
timeout $(left 340) python3 benchmarks/verify_forward.py --nodes 64 256 --no-breakdown --reps 5 --no-append \
  --mma-scores --mma-pv 2>&1 | grep -v Warn | tail -4
timeout $(left 400) ncu --clock-control none -k regex:_build_tree_kernel --launch-count 2 --section SpeedOfLight \
  --section WarpStateStats --section InstructionStats --section LaunchStats \
  python3 tools/heap_threads.py --vocab 264 --budgets 64 --threads 64 --repeat 1 > "$OUT/ncu_heap.txt" 2>&1
grep -E "SM Frequency|Elapsed Cycles|Duration|Executed Ipc|Warp Cycles Per Issued|Executed Instructions " \
  "$OUT/ncu_heap.txt" | head -16
timeout $(left 450) ncu --clock-control none -k regex:_topk_ --launch-count 4 --section SpeedOfLight \
  --section WarpStateStats --section Occupancy --section LaunchStats python3 -c "
import numpy as np; from ddtree_numba import kernels as kn
x = (np.random.default_rng(0).standard_normal((15, 163840)) * 3).astype(np.float32)
for _ in range(2): kn.topk_logprobs(x, 64)" > "$OUT/ncu_topk.txt" 2>&1
grep -E "_topk_|SM Frequency|Duration|Achieved Occupancy|Warp Cycles Per Issued|Registers Per" "$OUT/ncu_topk.txt" | head -24
timeout $(left 560) python3 benchmarks/tree_build.py 2>&1 | grep -v Warn | tail -12
} 2>&1 | tee "$OUT/log.txt"
cp docs/PERFORMANCE.md "$OUT/"; cp benchmarks/results/tree_build.json "$OUT/" 2>/dev/null
echo "elapsed $(( $(date +%s) - T0 ))"
