#!/usr/bin/env bash
# The tree build's profile (issue 15; ninth session, ~5 minutes): per-kernel graph-replay times and
# Nsight Compute (launch, occupancy, warp states, instruction mix, source hot spots with lineinfo)
# of the split top-K, the level build and the heap build at V 163840, budgets 64 and 1024.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s)
left() { echo $(( $1 - $(date +%s) + T0 )); }
{
timeout $(left 150) python3 benchmarks/tree_build.py --kernels 2>&1 | grep -v Warn | tail -12
for b in 64 1024; do
DDTREE_LINEINFO=1 timeout $(left 400) ncu --clock-control none -k regex:kernel --launch-skip 4 --launch-count 4 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section InstructionStats --section SourceCounters \
  python3 tools/profile_tree.py 163840 $b > "$OUT/ncu_tree_$b.txt" 2>&1
grep -E "^  kernel|Duration|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Executed Instructions |Block Size|Grid Size" \
  "$OUT/ncu_tree_$b.txt" | head -40
done
} 2>&1 | tee "$OUT/log.txt"
echo "elapsed $(( $(date +%s) - T0 ))"
