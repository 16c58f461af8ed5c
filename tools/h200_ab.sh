#!/usr/bin/env bash
# A same-run A/B of the demo pair on a GPU: this tree against ab_old/, an older commit's package
# (`mkdir ab_old && git archive REV ddtree_numba benchmarks tools | tar -x -C ab_old && rm -rf
# ab_old/ddtree_numba/data`: git-ignored; its data is copied from this tree on the device). Run
# from the repo root with .whl, .commit and ab_old carried; logs to $OUT/log.txt. Each side has its
# own kernel cache.
# PART=demo (the default, ~4 minutes): benchmarks/demo_pair.py at budgets 16 and 64 (not
#   appended), alternating old, new, old, new, so that the machine's drift shows.
# PART=stages (~2 minutes): per side, the per-stage round times (tools/profile_round.py) and the
#   time of every kernel of one ddtree round at budget 16 under Nsight Compute (graph nodes
#   profiled one by one: $OUT/ncu_old.csv, $OUT/ncu_new.csv; compare with tools/ncu_summary.py).
# PART=gap (~8 minutes): this tree's GPU tests of the decode loops (tests/test_decode_cuda.py: the
#   prefill's graph, kept configurations, the batched round), then tools/batch_gap.py per side
#   (old, new): generate against generate_batch of one prompt and of eight, the wall time a call
#   spends before its first round beside a round's (docs/PERFORMANCE.md, "batch gap").
# PART=batch_ncu (~4 minutes, this tree only): Nsight Compute, graph nodes one by one, of a batched
#   ddtree round of --batch 8 demo prompts ($OUT/ncu_b8.csv) and of generate's ddtree round
#   ($OUT/ncu_b1.csv), budget 16; compare with tools/ncu_summary.py.
# PART=kernels (~5 minutes): this tree's GPU tests of top-K, the GPU stages, the tree build, the
#   GQA attention, the CUDA drafter and the decode loops; then per side (old, new) the kernels the
#   demo round's ddtree-only stages run (tools/gqa_keys.py, tools/topk_short_rows.py,
#   tools/heap_threads.py at V 264), benchmarks/tree_build.py --kernels (V 163840, printed only)
#   and tools/profile_round.py (thirty-second session: what its ad-hoc scripts ran).
# PART=sanitize (~5 minutes, this tree only): compute-sanitizer memcheck and racecheck over
#   tools/sanitize_stages.py (the stages at realistic sizes, then the demo round's own: the
#   warp-a-row top-K, the one-warp heap build, the drafter's GQA with its fused merge), then
#   memcheck over --full (issue 15's size); each must print "ERROR SUMMARY: 0 errors" and match.
# PART=gqa (~5 minutes, this tree then old): the drafter's GQA warp kernel (thirty-fourth session,
#   NOTES Next 000): tools/gqa_keys.py over the warp tiles (each bit-checked against the split
#   kernel first), tools/tune_tiles.py --only gqa --sequences 8 (a batch), tools/verify_stages.py
#   --rows 1 17, then tools/profile_round.py per side (old, new, old, new: the draft stage's drift).
# (Twenty-sixth session: this is how the norm fold of 511ebd5 / 19ce1c1 / 01c2860 was found to
#   cost the demo round ~11 %; docs/PERFORMANCE.md.)
source tools/h200_env.sh
[ -d ab_old/ddtree_numba/data ] || cp -r ddtree_numba/data ab_old/ddtree_numba/   # (not carried: 26 MB, unchanged)
side() {  # $1 = directory, $2 = label: the rest of the command runs there with its own cache
  local dir=$1 label=$2; shift 2
  (cd "$dir" && PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/cache_$label "$@")
}
{
if [ "${PART:-demo}" = demo ]; then
for label in old new old new; do
  echo "== $label"
  dir=$([ $label = old ] && echo ab_old || echo .)
  side $dir $label timeout $(left 560) python3 benchmarks/demo_pair.py --budgets 16 64 --no-append 2>&1 |
    grep -v Warn | grep "^| \(ar\|dflash\|ddtree\)"
done
elif [ "$PART" = batch_ncu ]; then
M="--profile-from-start off --clock-control none --graph-profiling node"
M="$M --metrics gpu__time_duration.sum,launch__registers_per_thread --csv"
timeout $(left 280) ncu $M python3 tools/batch_gap.py --kernels batch --batch 8 > "$OUT/ncu_b8.csv" 2>/dev/null
echo "batch 8 rc $?"
timeout $(left 500) ncu $M python3 tools/profile_round.py --kernels 16 > "$OUT/ncu_b1.csv" 2>/dev/null
echo "generate rc $?"
elif [ "$PART" = kernels ]; then
side . new timeout $(left 240) python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_topk.py tests/test_gpu_stages.py \
  tests/test_tree_build.py tests/test_gqa_kernel.py tests/test_cuda_drafter.py tests/test_decode_cuda.py --tb=short \
  2>&1 | grep -v Warn | tail -4
for label in old new; do
  echo "== $label"
  dir=$([ $label = old ] && echo ab_old || echo .)
  for tool in "tools/gqa_keys.py --keys 48 330 520" "tools/topk_short_rows.py" \
              "tools/heap_threads.py --vocab 264 --budgets 16 64 128 --threads 32 64"; do
    side $dir $label timeout 90 python3 $PWD/$tool 2>&1 | grep -v Warn | grep "^|"
  done
  side $dir $label timeout 150 python3 benchmarks/tree_build.py --kernels 2>&1 | grep -v Warn | tail -12
  side $dir $label timeout 150 python3 tools/profile_round.py --budgets 16 64 --prompts 4 2>&1 | grep -v Warn | tail -5
done
elif [ "$PART" = sanitize ]; then
for tool in memcheck racecheck; do
  echo "== $tool"
  side . new timeout $(left $([ $tool = memcheck ] && echo 140 || echo 280)) compute-sanitizer --tool $tool \
    python3 tools/sanitize_stages.py 2>&1 | grep -v Warn | grep -E "match|ERROR SUMMARY|RACECHECK SUMMARY|Error" | head -8
done
echo "== memcheck --full"
side . new timeout $(left 560) compute-sanitizer --tool memcheck python3 tools/sanitize_stages.py --full 2>&1 |
  grep -v Warn | grep -E "match|ERROR SUMMARY|Error" | head -8
elif [ "$PART" = gqa ]; then
side . new timeout 100 python3 tools/gqa_keys.py --keys 48 330 520 1000 \
  --warp-tiles 4,8,1,16 4,8,1,0 4,8,0,16 2,8 8,8 4,4 2>&1 | grep -v Warn | tail -8
side . new timeout 80 python3 tools/tune_tiles.py --only gqa --sequences 8 2>&1 | grep -v Warn | grep "gqa\|GQA"
side . new timeout 100 python3 tools/verify_stages.py --rows 1 17 2>&1 | grep -v Warn | tail -18
for label in old new old new; do
  echo "== $label"
  dir=$([ $label = old ] && echo ab_old || echo .)
  side $dir $label timeout $(left 580) python3 tools/profile_round.py --budgets 16 --prompts 4 2>&1 | grep -v Warn | tail -4
done
elif [ "$PART" = gap ]; then
side . new timeout $(left 200) python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_decode_cuda.py --tb=short \
  2>&1 | grep -v Warn | tail -4
for label in old new; do
  echo "== $label"
  dir=$([ $label = old ] && echo ab_old || echo .)
  side $dir $label timeout $(left $([ $label = old ] && echo 390 || echo 580)) python3 tools/batch_gap.py 2>&1 |
    grep -v Warn | tail -9
done
else
for label in old new; do
  echo "== $label"
  dir=$([ $label = old ] && echo ab_old || echo .)
  side $dir $label timeout 150 python3 tools/profile_round.py --budgets 16 --prompts 4 2>&1 | grep -v Warn | tail -5
  side $dir $label timeout 150 ncu --profile-from-start off --clock-control none --graph-profiling node \
    --metrics gpu__time_duration.sum,launch__registers_per_thread --csv \
    python3 tools/profile_round.py --kernels 16 > "$OUT/ncu_$label.csv" 2>/dev/null; echo "ncu rc $?"
done
fi
} 2>&1 | tee "$OUT/log.txt"
echo "elapsed $(( $(date +%s) - T0 ))"
