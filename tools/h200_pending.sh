#!/usr/bin/env bash
# The pending GPU call (forty-sixth session, for the next one; carry .whl and .commit). Logs to
# $OUT/log.txt; on an H200 the results files and PERFORMANCE.md to $OUT. ~8 minutes on an H200,
# ~3 on an H100.
#  1. the drafter's 256-output GEMMs with whole-row tiles (256 outputs a block) against the default
#     (PLANS §6: could a norm be such a block's epilogue?), at 17 and 1 rows;
#  2. the wgmma probe's many-row specs at 272 rows (issue 17's verify; PLANS §00), q_proj and an
#     lm_head-like shape, against the package's bits and torch;
#  3. on an H200: tree_build.py --quick (the issue-15 results file is 21070de's) and the demo pair
#     with the HF peer (issue 14's 5,000 tokens/s there; last 4,847 at 22aed85), appended.
source tools/h200_env.sh
{
nvidia-smi --query-gpu=name --format=csv,noheader
H200=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -c H200)
timeout $(left 100) python3 tools/tune_tiles.py --only gemm --gemm-rows 17 1 --gemm-shapes 256,256 768,256 2>&1 \
  | grep -v Warn | tail -24
echo "t=$(( $(date +%s) - T0 ))"
timeout $(left 180) python3 tools/wgmma_gemm_probe.py --rows 272 --workspace 512 --shapes "2048,3072;2048,16384" \
  --blocks "L,64,4;S,64,8,1,0,2,1,1,2;S,128,4,1,0,2,1,1,2" 2>&1 | grep -v Warn | tail -6
echo "t=$(( $(date +%s) - T0 ))"
if [ "$H200" = 1 ]; then
  timeout $(left 300) python3 benchmarks/tree_build.py --quick 2>&1 | grep -v Warn | tail -10
  timeout $(left 560) python3 benchmarks/demo_pair.py --budgets 16 32 64 --peer 2>&1 | grep -v Warn | grep "^| \|^###"
  cp benchmarks/results/tree_build.json benchmarks/results/demo_pair.json docs/PERFORMANCE.md "$OUT/" 2>/dev/null
fi
echo "elapsed $(( $(date +%s) - T0 ))"
} 2>&1 | tee "$OUT/log.txt"
