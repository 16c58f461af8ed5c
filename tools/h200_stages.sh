#!/usr/bin/env bash
# Issue 2 on the H200: the test suite without the simulator, compute-sanitizer, the benchmark.
# Run from the repo root on the GPU machine with .whl carried; logs go to $OUT.
source tools/h200_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import numpy, numba, numba_cuda; print(numpy.__version__, numba.__version__)" | tee -a "$OUT/gpu.txt"
python3 -m pytest -q -rs -p no:cacheprovider tests/test_topk.py tests/test_tree_build.py tests/test_visibility.py \
  tests/test_accept.py tests/test_compact.py tests/test_gpu_stages.py tests/test_kernel_registry.py -s 2>&1 \
  | tee "$OUT/pytest.log" | tail -25
for tool in memcheck racecheck; do
  compute-sanitizer --tool $tool python3 tools/sanitize_stages.py > "$OUT/sanitizer_$tool.log" 2>&1
  echo "sanitizer $tool: rc=$?"; tail -3 "$OUT/sanitizer_$tool.log"
done
python3 benchmarks/tree_build.py ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -30
cp docs/PERFORMANCE.md "$OUT/PERFORMANCE.md"
