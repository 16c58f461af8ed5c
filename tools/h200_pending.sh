#!/usr/bin/env bash
# The pending GPU call (written in the forty-third session, for the next one; carry .whl and
# .commit). Logs to $OUT/log.txt; the issue-15 results file and PERFORMANCE.md to $OUT on an H200.
#  1. benchmarks/tree_build.py --overhead (the small-k top-K split, G 8 of 512 threads below k 32,
#     measured only by tools/topk_occupancy.py) and on an H200 tree_build.py --quick (the committed
#     results file is 21070de's);
#  2. the demo pair on the H200 with PDL 'wait' (the default) and 'trigger' (which since the
#     forty-third session reads every kernel's parameters before its wait: +11 % ar, +3.6 % ddtree on
#     an H100), for issue 14's 5,000 tokens/s there (last H200 figure 4,847 at 22aed85);
#  3. the Moonlight verify at 16 and 64 nodes (27 layers) in both modes: whether 'trigger' with the
#     early reads still loses there (4 layers: 2.50 -> 2.88 ms at 64 nodes).
source tools/h200_env.sh
{
nvidia-smi --query-gpu=name --format=csv,noheader
timeout $(left 60) python3 benchmarks/tree_build.py --overhead 2>&1 | grep -v Warn | grep "^budget"
for M in wait trigger wait trigger; do
  echo "PDL=$M elapsed $(( $(date +%s) - T0 ))"
  DDTREE_PDL=$M timeout $(left 300) python3 benchmarks/demo_pair.py --budgets 16 64 --no-append 2>&1 | grep -v Warn | grep "^| ar\|^| ddtree"
done
for M in wait trigger; do
  echo "PDL=$M elapsed $(( $(date +%s) - T0 ))"
  DDTREE_PDL=$M timeout $(left 440) python3 benchmarks/verify_forward.py --nodes 16 64 --reps 5 --no-breakdown --no-append 2>&1 | grep -v Warn | grep "^| [0-9]"
done
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  timeout $(left 590) python3 benchmarks/tree_build.py --quick 2>&1 | grep -v Warn | tail -10
  cp benchmarks/results/tree_build.json docs/PERFORMANCE.md "$OUT/" 2>/dev/null
fi
} 2>&1 | tee "$OUT/log.txt"
