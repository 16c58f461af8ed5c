#!/usr/bin/env bash
# The pending GPU call (forty-second session, last): the GPU decode tests with the warp heap build
# the default (greedy ddtree == ar on the GPU, batches, graphs). Logs to $OUT/log.txt.
source tools/h200_env.sh
{
nvidia-smi --query-gpu=name --format=csv,noheader
timeout $(left 200) python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_decode_cuda.py --tb=short 2>&1 | grep -v Warn | tail -6
echo "elapsed $(( $(date +%s) - T0 ))"
} 2>&1 | tee "$OUT/log.txt"
