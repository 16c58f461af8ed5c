#!/usr/bin/env bash
# The next session's first H200 call (after the ninth session, ~6 minutes); run from the repo root
# with .whl carried and DDTREE_COMMIT set; logs to $OUT/log.txt, Nsight Compute's source view to
# $OUT/src_*.csv. The ninth session's last tree-build changes (the split top-K without sorts in its
# slices, the level build's pop order by binary search, a one-parent level without its sort) are
# simulator-tested and compile for sm_90 but have not run on a GPU: their GPU tests, the per-kernel
# table (top-K by slices and block, level vs heap build on the synthetic and the demo drafter's
# draft), memcheck and racecheck at full size, the tree_build table, and where the kernels stall.
set -u
export DDTREE_COMMIT=${DDTREE_COMMIT:-unknown}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s)
left() { echo $(( $1 - $(date +%s) + T0 )); }
{
timeout $(left 200) python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_topk.py tests/test_tree_build.py tests/test_gpu_stages.py tests/test_decode_cuda.py --tb=short 2>&1 | grep -v Warn | tail -8
timeout $(left 330) python3 benchmarks/tree_build.py --kernels 2>&1 | grep -v Warn | tail -30
for tool in memcheck racecheck; do
timeout $(left 420) compute-sanitizer --tool $tool python3 tools/sanitize_stages.py --full 2>&1 | tail -2
done
timeout $(left 460) python3 benchmarks/tree_build.py --quick 2>&1 | grep -v Warn | tail -10
for b in 64 1024; do
DDTREE_LINEINFO=1 timeout $(left 540) ncu --clock-control none -k regex:kernel --launch-skip 4 --launch-count 3 \
  --section SourceCounters --section WarpStateStats --section LaunchStats --import-source yes --page source \
  --print-source cuda --csv python3 tools/profile_tree.py 163840 $b > "$OUT/src_$b.csv" 2>&1
head -c 600 "$OUT/src_$b.csv"; echo; wc -l "$OUT/src_$b.csv"
done
} 2>&1 | tee "$OUT/log.txt"
cp docs/PERFORMANCE.md "$OUT/"; cp benchmarks/results/tree_build.json "$OUT/" 2>/dev/null
echo "elapsed $(( $(date +%s) - T0 ))"
