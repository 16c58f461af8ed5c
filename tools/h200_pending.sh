#!/usr/bin/env bash
# The first GPU call for a branch whose kernel changes are simulator-tested only (NOTES, Next).
# Now (thirty-eighth session): next/tie-count, the level build's tie limit as a kernel argument.
# Run from the repo root of the branch with .whl and .commit carried; logs to $OUT/log.txt (~4
# minutes with compiles).
# PART=check (the default): the GPU tests of both tree builds and the full-size stages (-n 4:
#   the level build compiles two variants a worker, ~10 s each), then tools/level_ties_ab.py (the
#   default limit, 256 and 0 on a one-tie and a 1/8-step draft at budgets 256 and 1024; every tree
#   checked against the twin).
# PART=sanitize: racecheck over the capped top-K's fallback and the level build's tie orderings
#   (--capped-and-ties), then memcheck over tools/sanitize_stages.py.
source tools/h200_env.sh
export DDTREE_CACHE_DIR=/tmp/cache_new
{
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "${PART:-check}" = check ]; then
  timeout $(left 240) python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_tree_build.py \
    tests/test_gpu_stages.py --tb=short 2>&1 | grep -v Warn | tail -4
  echo "elapsed $(( $(date +%s) - T0 ))"
  timeout $(left 330) python3 tools/level_ties_ab.py --passes 1 2>&1 | grep -v Warn | tail -4
else
  timeout $(left 150) compute-sanitizer --tool racecheck python3 tools/sanitize_stages.py \
    --capped-and-ties 2>&1 | grep -v Warn | grep -E "match|RACECHECK SUMMARY|Error" | head -6
  timeout $(left 300) compute-sanitizer --tool memcheck python3 tools/sanitize_stages.py 2>&1 |
    grep -v Warn | grep -E "match|ERROR SUMMARY|Error" | head -8
fi
echo "elapsed $(( $(date +%s) - T0 ))"
} 2>&1 | tee "$OUT/log.txt"
