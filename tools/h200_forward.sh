#!/usr/bin/env bash
# Issue 4 on the H200: the forward tests without the simulator, compute-sanitizer over a whole
# forward, the verify-forward benchmark. Run from the repo root with .whl carried; logs to $OUT.
source tools/h200_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q -rs -p no:cacheprovider ${TESTS:-tests/test_model_cuda.py \
    tests/test_linear_kernel.py tests/test_mla_kernel.py tests/test_moe_kernel.py \
    tests/test_norm_rope_embed_kernels.py} 2>&1 | tee "$OUT/pytest.log" | tail -15
fi
if [ -z "${SKIP_SANITIZER:-}" ]; then
  compute-sanitizer --tool memcheck python3 tools/sanitize_forward.py > "$OUT/sanitizer_memcheck.log" 2>&1
  echo "memcheck rc=$?"; tail -3 "$OUT/sanitizer_memcheck.log"
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/verify_forward.py ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -40
fi
cp docs/PERFORMANCE.md "$OUT/PERFORMANCE.md"
