#!/usr/bin/env bash
# The pending GPU call (forty-second session): the top-K's second read made conditional (a thread
# re-reads only when its smallest kept key is >= tau) and its kept keys in registers; which keep
# (keys a thread) is fastest now at each k. Run from the repo root with .whl and .commit carried.
#  1. the GPU tests of top-K and the stages;
#  2. tools/topk_keep.py: top-K µs at k 16 .. 1024 for keep 1 / 2 / 4 / 8 / the default, each checked
#     against the twin (before: top-K alone 34.5 / 30.5 / 31.3 µs at k 16 / 32 / 64, H100, 87e251e);
#  3. benchmarks/tree_build.py --quick (the figure).
source tools/h200_env.sh
{
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout $(left 150) python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_topk.py tests/test_gpu_stages.py --tb=line 2>&1 | grep -v Warn | tail -4
echo "elapsed $(( $(date +%s) - T0 ))"
timeout $(left 330) python3 tools/topk_keep.py 2>&1 | grep -v Warn | tail -9
echo "elapsed $(( $(date +%s) - T0 ))"
timeout $(left 450) python3 benchmarks/tree_build.py --quick --no-append 2>&1 | grep -v Warn | tail -6
echo "elapsed $(( $(date +%s) - T0 ))"
} 2>&1 | tee "$OUT/log.txt"
