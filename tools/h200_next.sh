#!/usr/bin/env bash
# An H200 check of the top-K and tree build (~4 minutes); run from the repo root with .whl carried
# and DDTREE_COMMIT set; logs to $OUT/log.txt. The GPU tests of the top-K, both builds, the
# full-size stages and the decode loop (TESTS= narrows them); the tree_build table (appended to
# docs/PERFORMANCE.md); the per-kernel breakdown (--kernels); memcheck and racecheck of the
# full-size stages (SANITIZE= names the tools; empty skips them). BENCH= the tree_build modes.
source tools/h200_env.sh
{
TESTS=${TESTS:-tests/test_topk.py tests/test_tree_build.py tests/test_gpu_stages.py tests/test_decode_cuda.py}
timeout $(left 200) python3 -m pytest -q -p no:cacheprovider -n 4 $TESTS --tb=short 2>&1 | grep -v Warn | tail -4
for mode in ${BENCH---quick --kernels}; do          # BENCH= names tree_build.py's modes
timeout $(left 400) python3 benchmarks/tree_build.py $mode 2>&1 | grep -v Warn | tail -40
done
for tool in ${SANITIZE-memcheck racecheck}; do
timeout $(left 470) compute-sanitizer --tool $tool python3 tools/sanitize_stages.py --full 2>&1 | tail -2
done
} 2>&1 | tee "$OUT/log.txt"
cp docs/PERFORMANCE.md "$OUT/"; cp benchmarks/results/tree_build.json "$OUT/" 2>/dev/null
echo "elapsed $(( $(date +%s) - T0 ))"
