#!/usr/bin/env bash
# The pending GPU call (forty-second session): the warp pop in 32-bit integers (int32 loop state,
# unsigned shared indices, a branch-free order key), against the call before it (87e251e: 10.4 /
# 19.2 / 39.3 µs at budgets 16 / 32 / 64 on the synthetic draft). Run from the repo root with .whl
# and .commit carried; logs to $OUT/log.txt.
#  1. the GPU tests of the tree builds; compute-sanitizer memcheck + racecheck over the demo shapes;
#  2. tools/warp_build_ab.py (every tree checked against the twin first);
#  3. ncu by SASS of the warp build at 64 (executed instructions a pop) and of top-K at k 64 (V 163840).
source tools/h200_env.sh
export DDTREE_LINEINFO=1
{
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout $(left 110) python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_tree_build.py --tb=line 2>&1 | grep -v Warn | tail -4
for tool in memcheck racecheck; do
  timeout $(left 190) compute-sanitizer --tool $tool python3 tools/sanitize_stages.py --demo-shapes 2>&1 | grep -v Warn | tail -2
done
echo "elapsed $(( $(date +%s) - T0 ))"
timeout $(left 300) python3 tools/warp_build_ab.py --passes 2 2>&1 | grep -v Warn | tail -20
echo "elapsed $(( $(date +%s) - T0 ))"
for spec in "heap 264 64" "topk 163840 64"; do
  set -- $spec
  name=$1_$3
  DDTREE_CACHE=0 timeout $(left 450) ncu --profile-from-start off --section SourceCounters --section WarpStateStats \
    --warp-sampling-interval 0 -o /tmp/$name -f python3 tools/profile_build.py $spec 2>&1 | grep -v Warn | tail -1
  ncu --import /tmp/$name.ncu-rep --page source --csv --print-source sass > "$OUT/$name.sass.csv" 2>&1
  python3 tools/ncu_sass.py "$OUT/$name.sass.csv" 12 2>&1
  echo "elapsed $(( $(date +%s) - T0 ))"
done
} 2>&1 | tee "$OUT/log.txt"
