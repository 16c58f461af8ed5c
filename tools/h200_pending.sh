#!/usr/bin/env bash
# The pending GPU call (forty-second session). The warp heap build passed its GPU tests at 87e251e
# (H100) and was faster than the block kernel alone at 16 / 32 / 64 (10.4 / 19.2 / 39.3 against
# 12.7 / 23.7 / 47.8 µs), so it became the default up to WARP_BUDGET. Run from the repo root with .whl
# and .commit carried (`git rev-parse --short HEAD > .commit`); logs to $OUT/log.txt. STOP: the
# second mark (s) past which the optional steps are skipped.
#  1. the GPU tests of the tree builds (the default now the warp kernel at <= 64);
#  2. compute-sanitizer memcheck and racecheck over the demo round's tree kernels (both heap builds
#     at 16 and 64, with ties; tools/sanitize_stages.py --demo-shapes);
#  3. tools/round_ab.py both ways, the block kernel as the knob (WARP_DEFAULT_UP_TO=0), budgets 16
#     and 64: half the difference of B - A over the two runs is the change, half the sum the sides' bias;
#  4. ncu by SASS instruction of the warp build at budget 64 (V 264): where a pop's ~1,200 cycles go.
source tools/h200_env.sh
STOP=${STOP:-560}
step() {  # step SECONDS_MARK command...: run while the call has time left before the mark
  local mark=$1; shift
  local l=$(left $mark)
  if [ "$l" -gt 20 ]; then timeout $l "$@"; else echo "skipped (no time): $*"; fi
}
KNOB=ddtree_numba.kernels.tree_build.WARP_DEFAULT_UP_TO=0
{
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
step 120 python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_tree_build.py --tb=line 2>&1 | grep -v Warn | tail -6
echo "elapsed $(( $(date +%s) - T0 ))"
for tool in memcheck racecheck; do
  step 220 compute-sanitizer --tool $tool python3 tools/sanitize_stages.py --demo-shapes 2>&1 | grep -v Warn | tail -4
done
echo "elapsed $(( $(date +%s) - T0 ))"
for b in 16 64; do
  for side in --knob --a-knob; do
    echo "== round_ab budget $b: $side $KNOB (the block kernel)"
    step $STOP python3 tools/round_ab.py $side $KNOB --budget $b --passes 3 2>&1 | grep -v Warn | tail -4
    echo "elapsed $(( $(date +%s) - T0 ))"
  done
done
( export DDTREE_LINEINFO=1 DDTREE_CACHE=0
  step $((STOP + 30)) ncu --profile-from-start off --section SourceCounters --section WarpStateStats \
    -o "$OUT/warp_64" -f python3 tools/profile_build.py heap 264 64 2>&1 | tail -2
  ncu --import "$OUT/warp_64.ncu-rep" --page source --csv --print-source sass > "$OUT/sass_warp_64.csv" 2>&1
  head -c 600 "$OUT/sass_warp_64.csv" )
echo "elapsed $(( $(date +%s) - T0 ))"
} 2>&1 | tee "$OUT/log.txt"
