#!/usr/bin/env bash
# The pending GPU call (written at the end of the forty-second session, for the next one; carry .whl
# and .commit). Logs to $OUT/log.txt, the results file and PERFORMANCE.md to $OUT.
#  1. the GPU decode tests with the warp heap build the default since c9b7989 (greedy ddtree == ar,
#     batches, graphs; round_ab's tokens already matched, these were not run on it);
#  1b. the sorted-frontier heap build (method "sorted", new, not the default): its GPU tests, the
#     sanitizers over the demo shapes, and tools/warp_build_ab.py (against warp / block / levels;
#     predicted ~0.1-0.2 µs a pop against the warp kernel's ~0.58). If it is right and faster, make
#     it the default up to WARP_BUDGET (_build_method, DESIGN) after round_ab.py both ways;
#  2. benchmarks/tree_build.py --overhead: why the level build adds ~20 µs to the graph at
#     budget 64 (51.3 queued against top-K alone 31.0) when it costs ~11 alone (PLANS §1);
#  3. benchmarks/demo_pair.py at budgets 16 and 64 (issue 14's figure at this commit; not appended);
#  4. tools/param_cost.py: what k array parameters cost a launch against one packed array (the demo
#     round's kernels stalled 11 % on constant-cache misses, NOTES Next 3);
#  5. on an H200: benchmarks/tree_build.py --quick (the committed results file is 21070de's).
source tools/h200_env.sh
{
nvidia-smi --query-gpu=name --format=csv,noheader
timeout $(left 200) python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_decode_cuda.py tests/test_tree_build.py \
  --tb=short 2>&1 | grep -v Warn | tail -6
for tool in memcheck racecheck; do
  timeout $(left 260) compute-sanitizer --tool $tool python3 tools/sanitize_stages.py --demo-shapes 2>&1 | grep -v Warn | tail -2
done
timeout $(left 330) python3 tools/warp_build_ab.py --passes 2 2>&1 | grep -v Warn | tail -22
echo "elapsed $(( $(date +%s) - T0 ))"
timeout $(left 380) python3 benchmarks/tree_build.py --overhead 2>&1 | grep -v Warn | tail -20
echo "elapsed $(( $(date +%s) - T0 ))"
timeout $(left 540) python3 benchmarks/demo_pair.py --budgets 16 64 --no-append 2>&1 | grep -v Warn | tail -12
echo "elapsed $(( $(date +%s) - T0 ))"
timeout $(left 580) python3 tools/param_cost.py 2>&1 | grep -v Warn | tail -8
echo "elapsed $(( $(date +%s) - T0 ))"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  timeout $(left 590) python3 benchmarks/tree_build.py --quick 2>&1 | grep -v Warn | tail -10
  cp benchmarks/results/tree_build.json docs/PERFORMANCE.md "$OUT/" 2>/dev/null
fi
} 2>&1 | tee "$OUT/log.txt"
