#!/usr/bin/env bash
# An H200 check of issue 17's batched round on the GPU (decode/device_batch.py; docs/NOTES.md Next 4,
# docs/PLANS.md §4).
# Run from the repo root with .whl and .commit carried; logs to $OUT/log.txt, results to $OUT.
# PART=demo (the default, ~7 minutes):
# 1. (~3 minutes) the batch kernels and the batched round on the GPU: each sequence == its ar, a
#    stopping sequence, graph == eager (tests/test_decode_cuda.py -k batch), the kernels' twins.
# 2. (~4 minutes) the demo pair at batch 1 / 4 / 16, ar and ddtree at budget 16, every round one
#    CUDA graph (a warm-up run each first): `ddtree-numba sweep --batch`, the README's table.
# PART=check (~5 minutes): the batched round's GPU tests of tests/test_decode_cuda.py (the golden
#    drafter's kept configuration: the prefill's graph from the second call), then step 2 above.
# PART=gap (~4 minutes): the batched round's GPU tests (tests/test_decode_cuda.py -k batch), then
#    tools/batch_gap.py: generate against generate_batch of one prompt and of eight (docs/NOTES.md
#    Next 4; the table to hold it to in docs/PERFORMANCE.md).
# PART=moonlight (~9 minutes): benchmarks/batch.py at the Moonlight-16B-A3B shape, whole batched
#    rounds (results/batch.json, PERFORMANCE.md), then the verify alone at batch 16 in the same run.
#    BATCHES / BUDGETS (default "1 4 16 64" / "16 64") choose the rows, e.g. BATCHES="1 16"
#    BUDGETS="4 8 16": small trees at batch 16 (PLANS §4); budgets other than 16..1024 need a
#    results/demo_pair.json with rows at them (benchmarks/demo_pair.py's defaults include 4 and 8).
source tools/h200_env.sh
{
if [ "${PART:-demo}" = gap ]; then
timeout $(left 200) python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_decode_cuda.py -k "batch" --tb=short \
  2>&1 | grep -v Warn | tail -4
echo "tests done $(( $(date +%s) - T0 ))"
timeout $(left 420) python3 tools/batch_gap.py 2>&1 | grep -v Warn | tail -8
elif [ "${PART:-demo}" != moonlight ]; then
if [ "${PART:-demo}" = demo ]; then
timeout $(left 200) python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_decode_cuda.py tests/test_compact.py \
  tests/test_accept.py tests/test_visibility.py tests/test_generate_batch.py --tb=short -k "batch or pool or compact or trees or side" \
  2>&1 | grep -v Warn | tail -6
else
timeout $(left 200) python3 -m pytest -q -p no:cacheprovider tests/test_decode_cuda.py -k "gpu_resident_batch" --tb=short \
  2>&1 | grep -v Warn | tail -4
fi
echo "tests done $(( $(date +%s) - T0 ))"
# (the package is not installed there: the CLI's main, not the ddtree-numba script)
timeout $(left 560) python3 -m ddtree_numba.cli sweep --backend cuda --batch 1 4 16 --budgets 16 --max-new-tokens 128 \
  --out "$OUT/batch_demo.json" 2>&1 | grep -v Warn | tail -12
else
timeout $(left 440) python3 benchmarks/batch.py --batches ${BATCHES:-1 4 16 64} --budgets ${BUDGETS:-16 64} 2>&1 | grep -v Warn | tail -22
echo "rounds done $(( $(date +%s) - T0 ))"
timeout $(left 580) python3 benchmarks/batch.py --verify-only --batches 16 --budgets 16 --no-append 2>&1 | grep -v Warn | tail -5
fi
cp docs/PERFORMANCE.md benchmarks/results/*.json "$OUT/" 2>/dev/null
} 2>&1 | tee "$OUT/log.txt"
echo "elapsed $(( $(date +%s) - T0 ))"
