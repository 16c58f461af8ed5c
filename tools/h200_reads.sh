#!/usr/bin/env bash
# The first-wave parameter reads (DDTREE_PARAMS_EARLY=first, PLANS §6), A/B on one machine (~9
# minutes on a fresh one: each mode compiles every kernel it runs once, its own cache entry). Run
# from the repo root with .whl and .commit carried; logs to $OUT/log.txt; nothing appended.
#  1. the Moonlight verify (4 layers, 1 / 16 / 64 nodes, with the per-stage breakdown of one MoE layer)
#     in PDL 'wait' with no early reads (its mode), the first wave's, and every block's (+14 % at 64
#     nodes on an H100: the cost the experiment looks for);
#  2. the demo pair at budget 16 in 'trigger' with every block's reads (its mode) and the first wave's;
#  3. the Moonlight verify again, first wave and none, alternated (its kernels cached by then).
# The guess under test: the reads cost the large verify because every block pays them, and its
# grouped GEMMs' grids hold many blocks that exit at once; if so, 'first' keeps the demo's gain
# (ar 2,725 / ddtree 6,332 with every block's, 2,474 / 6,119 without, H100) and drops the cost.
source tools/h200_env.sh
{
nvidia-smi --query-gpu=name --format=csv,noheader
moonlight() {   # $1 early, $2 allowance, $3.. extra arguments
  echo "== DDTREE_PDL=wait DDTREE_PARAMS_EARLY=$1: verify_forward.py --layers 4 --nodes 1 16 64"
  DDTREE_PDL=wait DDTREE_PARAMS_EARLY=$1 timeout $(left $2) python3 benchmarks/verify_forward.py --layers 4 \
    --nodes 1 16 64 --reps 5 --no-append "${@:3}" 2>&1 | grep -v Warn | grep "^| \|^###\|Error"
}
moonlight 0 140
moonlight first 270
moonlight 1 390
for e in 1 first; do
  echo "== DDTREE_PDL=trigger DDTREE_PARAMS_EARLY=$e: demo_pair.py --budgets 16"
  DDTREE_PDL=trigger DDTREE_PARAMS_EARLY=$e timeout $(left $([ $e = 1 ] && echo 450 || echo 520)) \
    python3 benchmarks/demo_pair.py --budgets 16 --no-append 2>&1 | grep -v Warn | grep "^| ar\|^| ddtree\|^###"
done
moonlight first 555 --no-breakdown
moonlight 0 590 --no-breakdown
echo "elapsed $(( $(date +%s) - T0 ))"
} 2>&1 | tee "$OUT/log.txt"
