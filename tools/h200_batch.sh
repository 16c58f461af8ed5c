#!/usr/bin/env bash
# The first H200 run after 6144fc3 (the MLA kernels' sequence table, cache pools, forward_batch):
# the GPU tests of the changed kernels and loops, compute-sanitizer memcheck over a forward and a
# pooled batched forward (tools/sanitize_forward.py), the demo pair --peer (same tokens and speed as at
# ba69dd6 expected), then benchmarks/batch.py with one pool and with separate caches.
# Run from the repo root with .whl carried; logs to $OUT.
set -u
export DDTREE_COMMIT=${DDTREE_COMMIT:-unknown}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/results"
T0=$(date +%s)
left() { echo $(( $1 - $(date +%s) + T0 )); }
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout $(left ${TEST_UNTIL:-200}) python3 -m pytest -q -rs -p no:cacheprovider tests/test_mla_kernel.py \
    tests/test_model_cuda.py tests/test_decode_cuda.py 2>&1 | tee "$OUT/pytest.log" | tail -8
fi
if [ -z "${SKIP_SANITIZER:-}" ]; then
  timeout $(left ${SANITIZER_UNTIL:-290}) compute-sanitizer --tool memcheck python3 tools/sanitize_forward.py \
    > "$OUT/sanitizer_memcheck.log" 2>&1
  echo "memcheck rc=$?"; tail -3 "$OUT/sanitizer_memcheck.log"
fi
if [ -z "${SKIP_DEMO:-}" ]; then
  timeout $(left ${DEMO_UNTIL:-440}) python3 benchmarks/demo_pair.py --peer 2>&1 | tail -14
  cp benchmarks/results/demo_pair.json "$OUT/results/" 2>/dev/null
fi
if [ -z "${SKIP_BATCH:-}" ]; then
  timeout $(left ${BATCH_UNTIL:-540}) python3 benchmarks/batch.py --reps 3 2>&1 | tail -16
  cp benchmarks/results/batch.json "$OUT/results/" 2>/dev/null
  timeout $(left ${SEPARATE_UNTIL:-590}) python3 benchmarks/batch.py --reps 3 --separate-caches --budgets 16 \
    --no-append 2>&1 | tail -8
fi
cp docs/PERFORMANCE.md "$OUT/PERFORMANCE.md"
echo "elapsed $(( $(date +%s) - T0 ))"
