#!/usr/bin/env bash
# The pending GPU call (forty-second session): is instruction fetch a fixed cost of our kernels in
# steady state? Under ncu's default cache flush the level build at budget 64 stalled 65 % on
# no_instruction. Here: ncu with --cache-control none (caches kept between the profiler's passes, as
# between replays of a graph), warp-state samples by reason for the level build at 64, top-K at k 64
# (V 163840), the warp build at 64 (V 264); then the level build with the flush, for the contrast.
source tools/h200_env.sh
export DDTREE_LINEINFO=1 DDTREE_CACHE=0
{
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for cc in none all; do
  for spec in "levels 163840 64" "topk 163840 64" "heap 264 64"; do
    [ $cc = all ] && [ "$spec" != "levels 163840 64" ] && continue
    set -- $spec
    name=$1_$3_$cc
    echo "== $spec, --cache-control $cc"
    timeout $(left 300) ncu --profile-from-start off --cache-control $cc --section WarpStateStats \
      --section SourceCounters --section LaunchStats --warp-sampling-interval 0 -o /tmp/$name -f \
      python3 tools/profile_build.py $spec 2>&1 | grep -v Warn | tail -1
    ncu --import /tmp/$name.ncu-rep --page source --csv --print-source sass > /tmp/$name.csv 2>&1
    python3 tools/ncu_sass.py /tmp/$name.csv 0 2>&1 | tail -2
    ncu --import /tmp/$name.ncu-rep --page details --csv 2>/dev/null | grep -E '"(Duration|Elapsed Cycles|Warp Cycles Per Issued Instruction)"' | cut -d, -f13-16
    echo "elapsed $(( $(date +%s) - T0 ))"
  done
done
} 2>&1 | tee "$OUT/log.txt"
