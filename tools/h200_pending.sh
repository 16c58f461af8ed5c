#!/usr/bin/env bash
# The pending GPU call (forty-fourth session; carry .whl and .commit). Logs to $OUT/log.txt; on an
# H200 the issue-15 results file and PERFORMANCE.md to $OUT.
#  1. benchmarks/tree_build.py --overhead (the small-k top-K split, G 8 of 512 threads below k 32);
#  2. the demo pair at budgets 16 / 64 with PDL 'wait' (the default) and 'trigger' (which reads
#     every kernel's parameters before its wait), alternated: issue 14's 5,000 tokens/s on an H200
#     (last H200 figure 4,847 at 22aed85);
#  3. the Moonlight verify (4 layers, 16 / 64 nodes) in five modes, to tell apart what 'trigger'
#     with the early reads costs there (2.50 -> 2.88 ms at 64 nodes, H100): off, wait, wait with
#     the reads, trigger without them, trigger with them;
#  4. on an H200, tree_build.py --quick (the committed results file is 21070de's).
source tools/h200_env.sh
{
nvidia-smi --query-gpu=name --format=csv,noheader
timeout $(left 60) python3 benchmarks/tree_build.py --overhead 2>&1 | grep -v Warn | grep "^budget"
for M in wait trigger wait trigger; do
  echo "PDL=$M elapsed $(( $(date +%s) - T0 ))"
  DDTREE_PDL=$M timeout $(left 280) python3 benchmarks/demo_pair.py --budgets 16 64 --no-append 2>&1 | grep -v Warn | grep "^| ar\|^| ddtree"
done
for V in off:0 wait:0 wait:1 trigger:0 trigger:1; do
  echo "PDL=${V%:*} PARAMS_EARLY=${V#*:} elapsed $(( $(date +%s) - T0 ))"
  DDTREE_PDL=${V%:*} DDTREE_PARAMS_EARLY=${V#*:} timeout $(left 480) python3 benchmarks/verify_forward.py --layers 4 --nodes 16 64 --reps 5 --no-breakdown --no-append 2>&1 | grep -v Warn | grep "^| [0-9]"
done
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  timeout $(left 590) python3 benchmarks/tree_build.py --quick 2>&1 | grep -v Warn | tail -10
  cp benchmarks/results/tree_build.json docs/PERFORMANCE.md "$OUT/" 2>/dev/null
fi
echo "elapsed $(( $(date +%s) - T0 ))"
} 2>&1 | tee "$OUT/log.txt"
