#!/usr/bin/env bash
# The pending GPU call (forty-seventh session, for the next one). Carry .whl, .commit and ab_old:
#   mkdir ab_old && git archive 0074d24 ddtree_numba benchmarks tools | tar -x -C ab_old \
#     && rm -rf ab_old/ddtree_numba/data
# (0074d24: before the GQA kernels' non-negative indices, 6f34983, and this session's four small
# kernels, 1ee63c2 / 48bcd51 / daadbb2 / de26143 / 039aa5e). Logs to $OUT/log.txt; ~10 minutes; in order of worth, so
# that a short device budget cuts the tail:
#  1. the GPU tests of the changed kernels (GQA, compaction, the norms, MoE routing and sort, the walk) and
#     of the decode loops (greedy ddtree == ar), in the demo's PDL mode;
#  2. on an H200: tree_build.py --quick (the issue-15 results file is 21070de's) and the demo pair
#     with the HF peer (issue 14's 5,000 tokens/s there; last 4,847 at 22aed85); results files and
#     PERFORMANCE.md to $OUT;
#  3. on an H100: the demo round's stages per side (old, new), the MoE block's launches per side at
#     1 / 17 / 65 rows (route and sort), the GQA warp kernel per side, the drafter's 256-output GEMMs
#     with whole-row tiles (PLANS §6), the wgmma probe at 272 rows (PLANS §00).
source tools/h200_env.sh
[ -d ab_old/ddtree_numba/data ] || cp -r ddtree_numba/data ab_old/ddtree_numba/
side() { local dir=$1 label=$2; shift 2; (cd "$dir" && PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/cache_$label "$@"); }
{
nvidia-smi --query-gpu=name --format=csv,noheader
side . new env DDTREE_PDL=trigger timeout 200 python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_gqa_kernel.py tests/test_compact.py tests/test_norm_rope_embed_kernels.py \
  tests/test_moe_kernel.py tests/test_accept.py tests/test_decode_cuda.py --tb=short 2>&1 \
  | grep -v Warn | tail -4
echo "t=$(( $(date +%s) - T0 ))"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  timeout 130 python3 benchmarks/tree_build.py --quick 2>&1 | grep -v Warn | tail -8
  echo "t=$(( $(date +%s) - T0 ))"
  timeout $(left 585) python3 benchmarks/demo_pair.py --budgets 16 32 64 --peer 2>&1 | grep -v Warn | grep "^| \|^###"
  cp benchmarks/results/tree_build.json benchmarks/results/demo_pair.json docs/PERFORMANCE.md "$OUT/" 2>/dev/null
else
  for label in old new; do
    echo "== round $label"
    dir=$([ $label = old ] && echo ab_old || echo .)
    side $dir $label timeout 70 python3 tools/profile_round.py --budgets 16 --prompts 4 2>&1 | grep -v Warn | tail -4
    echo "t=$(( $(date +%s) - T0 ))"
  done
  for label in new old; do
    echo "== moe_stages $label"
    dir=$([ $label = old ] && echo ab_old || echo .)
    side $dir $label timeout 80 python3 tools/moe_stages.py --rows 1 17 65 --repeat 20 2>&1 | grep -v Warn | grep '^|' | head -16
    echo "t=$(( $(date +%s) - T0 ))"
  done
  for label in new old; do
    echo "== gqa_keys $label"
    dir=$([ $label = old ] && echo ab_old || echo .)
    side $dir $label timeout 60 python3 tools/gqa_keys.py --keys 48 330 1000 --repeat 30 2>&1 | grep -v Warn | tail -7
    echo "t=$(( $(date +%s) - T0 ))"
  done
  timeout $(left 540) python3 tools/tune_tiles.py --only gemm --gemm-rows 17 1 --gemm-shapes 256,256 768,256 2>&1 \
    | grep -v Warn | tail -24
  echo "t=$(( $(date +%s) - T0 ))"
  timeout $(left 590) python3 tools/wgmma_gemm_probe.py --rows 272 --workspace 512 --shapes "2048,3072;2048,16384" \
    --blocks "L,64,4;S,64,8,1,0,2,1,1,2;S,128,4,1,0,2,1,1,2" 2>&1 | grep -v Warn | tail -8
fi
echo "elapsed $(( $(date +%s) - T0 ))"
} 2>&1 | tee "$OUT/log.txt"
