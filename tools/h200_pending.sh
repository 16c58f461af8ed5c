#!/usr/bin/env bash
# The pending GPU call (forty-first session; NOTES Next 1): the warp heap build. Its first run (H100,
# be5a1f6) gave wrong trees past 31 slots: an int32 ballot sign-extended in the tie loop (fixed
# after, with a simulator test of the GPU path in an emulated warp; not yet rerun on a GPU). Run from the repo root with .whl and .commit
# carried (`git rev-parse --short HEAD > .commit`); logs to $OUT/log.txt, the issue-15 results file
# and PERFORMANCE.md to $OUT. STOP: the second mark (s) past which the optional steps are skipped.
#  1. the GPU tests of both heap kernels, the level build and the stages (warp: with and without
#     redux.sync; ties, chains, batches, device budgets);
#  2. tools/warp_build_ab.py: warp (redux) / warp (shuffles) / block / level build, alone, on the
#     synthetic, random V 264 and demo drafts at budgets 16 / 32 / 64, alternated twice; then top-K +
#     warp against top-K + levels on the draft;
#  3. benchmarks/tree_build.py --quick (the figure; round_us = top-K + the default build);
#  4. tools/round_ab.py, side B with the warp kernel as the default (WARP_DEFAULT_UP_TO=64), demo
#     rounds at budgets 16 and 64 (run it both ways, --a-knob, when there is time);
#  5. ncu source counters of the level build at budget 64 (V 163840): where its ~13 µs go.
# If the warp kernel is right and faster: WARP_DEFAULT_UP_TO = WARP_BUDGET (and the DESIGN line).
source tools/h200_env.sh
STOP=${STOP:-560}
step() {  # step SECONDS_MARK command...: run while the call has time left before the mark
  local mark=$1; shift
  local l=$(left $mark)
  if [ "$l" -gt 20 ]; then timeout $l "$@"; else echo "skipped (no time): $*"; fi
}
{
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
step 150 python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_tree_build.py tests/test_gpu_stages.py \
  --tb=line 2>&1 | grep -v Warn | tail -14
echo "elapsed $(( $(date +%s) - T0 ))"
step 250 python3 tools/warp_build_ab.py --passes 2 2>&1 | grep -v Warn | tail -22
echo "elapsed $(( $(date +%s) - T0 ))"
step 380 python3 benchmarks/tree_build.py --quick 2>&1 | grep -v Warn | tail -10
cp benchmarks/results/tree_build.json docs/PERFORMANCE.md "$OUT/" 2>/dev/null
echo "elapsed $(( $(date +%s) - T0 ))"
for b in 16 64; do
  echo "== round_ab budget $b: B = the warp kernel"
  step $STOP python3 tools/round_ab.py --knob ddtree_numba.kernels.tree_build.WARP_DEFAULT_UP_TO=64 \
    --budget $b --passes 3 2>&1 | grep -v Warn | tail -5
  echo "elapsed $(( $(date +%s) - T0 ))"
done
( export DDTREE_LINEINFO=1 DDTREE_CACHE=0
  # (source pages come from a saved report: on a live run --page source printed no sampling column)
  step $STOP ncu --profile-from-start off --section SourceCounters --section WarpStateStats \
    --import-source yes -o "$OUT/levels_64" -f python3 tools/profile_build.py levels 163840 64 2>&1 | tail -2
  ncu --import "$OUT/levels_64.ncu-rep" --page source --csv --print-source cuda > "$OUT/src_levels_64.csv" 2>&1
  python3 tools/ncu_lines.py "$OUT/src_levels_64.csv" 25 2>&1 | head -36 )
echo "elapsed $(( $(date +%s) - T0 ))"
} 2>&1 | tee "$OUT/log.txt"
