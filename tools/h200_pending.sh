#!/usr/bin/env bash
# The pending GPU call (forty-second session): where the fixed costs of issue 15's budget-64 figure
# go, by SASS instruction (a source page of "cuda" printed no metric columns twice; "sass" has them).
# Run from the repo root with .whl and .commit carried; logs to $OUT/log.txt, the reports and their
# CSVs to $OUT (read them with tools/ncu_sass.py). Each profile: one launch of the stage after a
# warm-up (tools/profile_build.py), warp-state samples every 2^5 cycles.
#  1. the level build at budget 64, V 163840 (the draft: trees one deep, ~11 µs of fixed cost);
#  2. top-K at k 64, V 163840 (the partial kernel with its fused merge, ~31 µs);
#  3. the warp heap build at budget 64, V 264 (~0.6 µs a pop).
source tools/h200_env.sh
export DDTREE_LINEINFO=1 DDTREE_CACHE=0
{
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
ncu --version | tail -1
for spec in "levels 163840 64" "topk 163840 64" "heap 264 64"; do
  set -- $spec
  name=$1_$3
  echo "== $spec"
  timeout $(left 400) ncu --profile-from-start off --section SourceCounters --section WarpStateStats \
    --section SpeedOfLight --warp-sampling-interval 0 -o "$OUT/$name" -f \
    python3 tools/profile_build.py $spec 2>&1 | grep -v Warn | tail -3
  ncu --import "$OUT/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/$name.sass.csv" 2>&1
  ncu --import "$OUT/$name.ncu-rep" --page details --csv > "$OUT/$name.details.csv" 2>&1
  python3 tools/ncu_sass.py "$OUT/$name.sass.csv" 2>&1 | head -40
  echo "elapsed $(( $(date +%s) - T0 ))"
done
} 2>&1 | tee "$OUT/log.txt"
