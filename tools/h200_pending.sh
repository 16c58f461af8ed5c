#!/usr/bin/env bash
# The pending GPU call (forty-second session): how much of a demo round's kernels' time is
# instruction fetch? (The level build at budget 64 stalls 50 % on no_instruction even with the
# caches kept between ncu's passes; top-K 4 %, the warp build 3 %.) ncu over every kernel of one
# ddtree round at budget 16 (graph nodes one by one, --cache-control none), the raw page as CSV:
# each kernel's duration and warp-stall breakdown (read it with tools/ncu_stalls.py).
source tools/h200_env.sh
{
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout $(left 330) ncu --profile-from-start off --graph-profiling node --cache-control none \
  --section WarpStateStats --section SpeedOfLight --section LaunchStats --csv --page raw \
  python3 tools/profile_round.py --kernels 16 > "$OUT/round16_raw.csv" 2> "$OUT/ncu_err.txt"
tail -3 "$OUT/ncu_err.txt"; wc -l "$OUT/round16_raw.csv"
python3 tools/ncu_stalls.py "$OUT/round16_raw.csv" 2>&1 | tail -40
echo "elapsed $(( $(date +%s) - T0 ))"
} 2>&1 | tee "$OUT/log.txt"
