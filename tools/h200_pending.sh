#!/usr/bin/env bash
# (Kept as it ran: that branch was merged at a2d1619. Each pending branch carries its own version of
# this script; the one to run next is on the branch NOTES Next 1 names.)
# The first GPU call for the branch next/gpu-pending (thirty-eighth session, NOTES Next 1-2): main
# + next/tie-count (the level build's tie limit, a kernel argument) + next/lse-shuffle (the top-K
# partial kernel's log-sum-exp pair by warp shuffles), simulator-tested only. Run from the repo
# root of this branch with .whl, .commit and ab_old carried, ab_old being main's package (`mkdir
# ab_old && git archive main ddtree_numba benchmarks tools | tar -x -C ab_old && rm -rf
# ab_old/ddtree_numba/data`); logs to $OUT/log.txt, and the issue's figure's results file and
# PERFORMANCE.md's tail to $OUT.
# PART=check (the default, ~6 minutes): the GPU tests of top-K, both tree builds and the full-size
#   stages; tools/level_ties_ab.py (default limit / 256 / 0); tools/topk_caps.py at k 64, 256 and
#   1024 for main (old) and the branch (new), alternated twice; benchmarks/tree_build.py --quick
#   (the figure; appends to docs/PERFORMANCE.md).
# PART=sanitize (~3 minutes with the kernels cached): racecheck over the capped top-K's fallback and
#   the level build's tie orderings (--capped-and-ties), memcheck over tools/sanitize_stages.py and
#   over --full (issue 15's size).
source tools/h200_env.sh
side() {  # $1 = directory, $2 = label: the rest of the command runs there with its own cache
  local dir=$1 label=$2; shift 2
  (cd "$dir" && PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/cache_$label "$@")
}
{
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "${PART:-check}" = check ]; then
  side . new timeout $(left 180) python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_topk.py \
    tests/test_tree_build.py tests/test_gpu_stages.py --tb=short 2>&1 | grep -v Warn | tail -4
  echo "elapsed $(( $(date +%s) - T0 ))"
  side . new timeout $(left 230) python3 tools/level_ties_ab.py --passes 1 2>&1 | grep -v Warn | tail -4
  echo "elapsed $(( $(date +%s) - T0 ))"
  for label in old new old new; do
    echo "== $label"
    dir=$([ $label = old ] && echo ab_old || echo .)
    side $dir $label timeout $(left 480) python3 tools/topk_caps.py --ks 64 256 1024 --slices 8 2>&1 |
      grep -v Warn | grep -E "^top-K k|budget 1024"
  done
  echo "elapsed $(( $(date +%s) - T0 ))"
  side . new timeout $(left 590) python3 benchmarks/tree_build.py --quick 2>&1 | grep -v Warn | grep -E "^\| 163840|^\| V"
  cp benchmarks/results/tree_build.json "$OUT/" 2>/dev/null; tail -40 docs/PERFORMANCE.md > "$OUT/perf_tail.md"
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
