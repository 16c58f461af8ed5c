#!/usr/bin/env bash
# The pending GPU call (forty-fourth session, for the next one; carry .whl and .commit). Logs to
# $OUT/log.txt; on an H200 the results files and PERFORMANCE.md to $OUT.
#  1. the GPU decode tests (greedy ddtree == ar, graphs == eager) in PDL 'trigger' + early reads,
#     the demo's mode since the forty-fourth session (a pytest process otherwise takes the mode of
#     whichever test builds a target or compiles a kernel first; 'wait' passed them before);
#  2. the demo pair in its own mode (the first CudaTarget picks 'trigger' + early parameter reads
#     for hidden <= 1024) and, alternated, in DDTREE_PDL=wait: the table titles name the mode; on
#     an H200 budgets 16 32 64 with the HF peer, appended (issue 14's 5,000 tokens/s there; last
#     H200 figure 4,847 at 22aed85);
#  3. the Moonlight verify (4 layers, 16 / 64 nodes) in its own mode ('wait' expected: 1.78 / 2.51
#     ms on an H100);
#  4. on an H200, tree_build.py --quick (the committed issue-15 results file is 21070de's).
source tools/h200_env.sh
{
nvidia-smi --query-gpu=name --format=csv,noheader
H200=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -c H200)
DDTREE_PDL=trigger timeout $(left 150) python3 -m pytest -q -x -p no:cacheprovider tests/test_decode_cuda.py -k "graph or equal" 2>&1 | tail -3
echo "demo elapsed $(( $(date +%s) - T0 ))"
if [ "$H200" = 1 ]; then
  timeout $(left 330) python3 benchmarks/demo_pair.py --budgets 16 32 64 --peer 2>&1 | grep -v Warn | grep "^| \|^###"
else
  timeout $(left 220) python3 benchmarks/demo_pair.py --budgets 16 64 --no-append 2>&1 | grep -v Warn | grep "^| ar\|^| ddtree\|^###"
fi
DDTREE_PDL=wait timeout $(left 390) python3 benchmarks/demo_pair.py --budgets 16 --no-append 2>&1 | grep -v Warn | grep "^| ar\|^| ddtree\|^###"
echo "moonlight elapsed $(( $(date +%s) - T0 ))"
timeout $(left 450) python3 benchmarks/verify_forward.py --layers 4 --nodes 16 64 --reps 5 --no-breakdown --no-append 2>&1 | grep -v PerformanceWarn | grep "^| [0-9]\|RuntimeWarning\|^###"
if [ "$H200" = 1 ]; then
  timeout $(left 590) python3 benchmarks/tree_build.py --quick 2>&1 | grep -v Warn | tail -10
  cp benchmarks/results/tree_build.json benchmarks/results/demo_pair.json docs/PERFORMANCE.md "$OUT/" 2>/dev/null
fi
echo "elapsed $(( $(date +%s) - T0 ))"
} 2>&1 | tee "$OUT/log.txt"
