#!/usr/bin/env bash
# The first GPU call for the branch next/gpu-pending (thirty-seventh session, NOTES Next 000000):
# its kernel changes, simulator-tested only, against main. Run from the repo root of this branch
# with .whl, .commit and ab_old carried, ab_old being main's package (`mkdir ab_old && git archive
# main ddtree_numba benchmarks tools | tar -x -C ab_old && rm -rf ab_old/ddtree_numba/data`);
# logs to $OUT/log.txt.
# PART=check (the default, ~5 minutes): the GPU tests of top-K, both tree builds and the stages;
#   tools/level_ties_ab.py (the level build's few-ties path against the preorder path, every tree
#   checked against the twin); then tools/topk_caps.py at k 256 and 1024 per side (old = main,
#   new = this branch, old, new): the merge's and the ranking's 32-bit loops in the top-K alone
#   and in the figure (top-K + level build at 1024).
# PART=sanitize (~6 minutes, this tree only): racecheck over the capped fallback and the level
#   build's tie orderings (--capped-and-ties), memcheck over tools/sanitize_stages.py, then
#   memcheck over --full (issue 15's size).
source tools/h200_env.sh
side() {  # $1 = directory, $2 = label: the rest of the command runs there with its own cache
  local dir=$1 label=$2; shift 2
  (cd "$dir" && PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/cache_$label "$@")
}
{
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "${PART:-check}" = check ]; then
  side . new timeout $(left 150) python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_topk.py \
    tests/test_tree_build.py tests/test_gpu_stages.py --tb=short 2>&1 | grep -v Warn | tail -4
  echo "elapsed $(( $(date +%s) - T0 ))"
  side . new timeout $(left 220) python3 tools/level_ties_ab.py 2>&1 | grep -v Warn | tail -4
  echo "elapsed $(( $(date +%s) - T0 ))"
  for label in old new old new; do
    echo "== $label"
    dir=$([ $label = old ] && echo ab_old || echo .)
    side $dir $label timeout $(left 570) python3 tools/topk_caps.py --ks 256 1024 --slices 8 2>&1 |
      grep -v Warn | grep -E "^top-K k|budget 1024"
  done
else
  side . new timeout $(left 150) compute-sanitizer --tool racecheck python3 tools/sanitize_stages.py \
    --capped-and-ties 2>&1 | grep -v Warn | grep -E "match|RACECHECK SUMMARY|Error" | head -6
  side . new timeout $(left 300) compute-sanitizer --tool memcheck python3 tools/sanitize_stages.py 2>&1 |
    grep -v Warn | grep -E "match|ERROR SUMMARY|Error" | head -8
  side . new timeout $(left 560) compute-sanitizer --tool memcheck python3 tools/sanitize_stages.py --full 2>&1 |
    grep -v Warn | grep -E "match|ERROR SUMMARY|Error" | head -8
fi
echo "elapsed $(( $(date +%s) - T0 ))"
} 2>&1 | tee "$OUT/log.txt"
