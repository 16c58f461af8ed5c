#!/usr/bin/env bash
# The next session's first H200 call (after the seventh session, ~9.5 minutes):
# 1. the shared experts on a side stream (kernels.moe.CONCURRENT_SHARED, off until measured): its
#    test on a GPU (a non-default stream, the join ordering the combine), the MoE block both ways
#    (tools/moe_stages.py's last two columns), and the verify forward with it on
#    (--shared-side-stream) against 5cec055's 6.19 / 13.62 / 26.28 / 73.30 ms at 1 / 16 / 64 / 256;
# 2. the experts under two-row-tile register tiles (gate|up 263 µs at 65 rows, 107 of bytes; the
#    A/B of the seventh session tried one-row tiles only) and 32-row staged blocks (2,2,2,2 and
#    4,1,1,4: 246-252 registers, no spill by ptxas) for 272 rows' ~35-row experts, whose 64-row
#    blocks compute half padding (gate|up 834 µs, 129 of bytes); moe_stages sorts the work items
#    for each forced tile's rows;
# 3. the register kernel with its activations raw until the mma (kernels.linear._X_RAW, off until
#    measured; the SASS showed each chunk's prefetch waiting on its activations' loads before the
#    current chunk's mma, because they were packed to bf16 at once): moe_stages --x-raw;
# 4. Nsight Compute on the MoE block at 65 and 272 rows (why the grouped GEMMs stream at
#    1.7-4 TB/s below the copy rate: occupancy, registers, stall reasons): $OUT/ncu_moe.txt.
# Run from the repo root with .whl carried and DDTREE_COMMIT set; logs to $OUT/log.txt.
set -u
export DDTREE_COMMIT=${DDTREE_COMMIT:-unknown}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s)
left() { echo $(( $1 - $(date +%s) + T0 )); }
{
timeout $(left 80) python3 -m pytest -q -p no:cacheprovider tests/test_moe_kernel.py tests/test_linear_kernel.py \
  -k "side_stream or moe_block or raw_until" 2>&1 | tail -1
timeout $(left 230) python3 tools/moe_stages.py --rows 1 17 65 272 --tiles 1,2,1 1,2,2 1,2,4 2,2,1 2,2,2,2 4,1,1,4 \
  2>&1 | grep -v Warn | tail -40
timeout $(left 310) python3 tools/moe_stages.py --rows 1 17 65 272 --x-raw 2>&1 | grep -v Warn | tail -7
timeout $(left 420) ncu --profile-from-start off --clock-control none --section SpeedOfLight --section Occupancy \
  --section LaunchStats --section WarpStateStats python3 tools/moe_stages.py --rows 65 272 --profile \
  > "$OUT/ncu_moe.txt" 2>&1; grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Achieved Occupancy|Registers Per" "$OUT/ncu_moe.txt" | head -80
timeout $(left 570) python3 benchmarks/verify_forward.py --nodes 1 16 64 256 --no-breakdown --reps 5 \
  --shared-side-stream 2>&1 | tail -7
} 2>&1 | tee "$OUT/log.txt"
cp docs/PERFORMANCE.md "$OUT/PERFORMANCE.md"; cp benchmarks/results/verify_forward.json "$OUT/" 2>/dev/null
echo "elapsed $(( $(date +%s) - T0 ))"
