#!/usr/bin/env bash
# The pending GPU call (written in the forty-third session, for the next one; carry .whl, .commit).
# Logs to $OUT/log.txt; the issue-15 results file and PERFORMANCE.md to $OUT on an H200.
#  1. the kernels' parameter words read before the PDL wait (_device.grid_dependency_after,
#     DDTREE_PARAMS_EARLY=1; off by default until measured): tools/param_cost.py's "read before the
#     wait" column against the plain PDL one, in 'wait' and 'trigger' modes; the demo pair at budget
#     16 with it on and off, alternated (ar and ddtree tokens/s); the GPU decode tests with it on.
#     If it wins: default on (_device.PARAMS_EARLY), DESIGN's PDL paragraph, round_ab both ways;
#  2. benchmarks/tree_build.py --overhead (the small-k top-K split: k 16 on G 8 of 512 threads);
#  3. on an H200: benchmarks/tree_build.py --quick (the committed results file is 21070de's).
source tools/h200_env.sh
{
nvidia-smi --query-gpu=name --format=csv,noheader
DDTREE_PARAMS_EARLY=1 timeout $(left 40) python3 tools/param_cost.py --ks 1 4 16 2>&1 | grep -v Warn | tail -6
DDTREE_PARAMS_EARLY=1 DDTREE_PDL=trigger timeout $(left 80) python3 tools/param_cost.py --ks 1 4 16 2>&1 | grep -v Warn | tail -6
for E in 1 0 1 0; do
  echo "PARAMS_EARLY=$E elapsed $(( $(date +%s) - T0 ))"
  DDTREE_PARAMS_EARLY=$E timeout $(left 300) python3 benchmarks/demo_pair.py --budgets 16 --no-append 2>&1 | grep -v Warn | grep "^| ar\|^| ddtree"
done
DDTREE_PARAMS_EARLY=1 timeout $(left 420) python3 -m pytest -q -p no:cacheprovider -n 4 -x tests/test_decode_cuda.py \
  --tb=short 2>&1 | grep -v Warn | tail -6
echo "elapsed $(( $(date +%s) - T0 ))"
timeout $(left 480) python3 benchmarks/tree_build.py --overhead 2>&1 | grep -v Warn | grep "^budget"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  timeout $(left 590) python3 benchmarks/tree_build.py --quick 2>&1 | grep -v Warn | tail -10
  cp benchmarks/results/tree_build.json docs/PERFORMANCE.md "$OUT/" 2>/dev/null
fi
} 2>&1 | tee "$OUT/log.txt"
