#!/usr/bin/env bash
# Where the cp.async ring GEMM waits (~3 minutes on the H200; the eighteenth session ruled out DRAM
# re-reads, the chunk loop's instruction count, and the depth of both prefetches: docs/NOTES.md
# "Next" 0, in full docs/PLANS.md §0). Nsight Compute on the staged ring kernel's launches of
# tools/moe_stages.py --profile
# at ROWS (default "65 272"): speed of light, occupancy, every warp stall reason, scheduler issue
# rates and shared-memory bank conflicts, KERNELS (default 4) launches a row count. numba names
# every kernel `kernel`, so the filter matches the demangled name (its factory). Each row count's
# report is saved as $OUT/ring_ROWS.ncu-rep too. Run from the repo root with .whl carried and
# DDTREE_COMMIT set; logs to $OUT/log.txt.
source tools/h200_env.sh
{
for rows in ${ROWS:-65 272}; do
  echo "== ncu, moe_stages.py --rows $rows --profile (the staged kernel's launches)"
  timeout 170 ncu --profile-from-start off --clock-control none --kernel-name-base demangled \
    -k regex:_staged_kernel --launch-count ${KERNELS:-4} -o "$OUT/ring_$rows" -f \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
    --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,smsp__inst_executed_op_shared_ld.sum \
    python3 tools/moe_stages.py --rows $rows --profile 2>&1 | grep -v Warn | grep -E "==PROF==|No kernels|rows:" | tail -5
  ncu --import "$OUT/ring_$rows.ncu-rep" --print-details all 2>&1 \
    | grep -E "_staged_kernel|Duration|Throughput|Occupancy|Registers|stalled|Issue|Eligible|Active Warps|bank_conflicts|shared_ld|Block Limit" \
    | head -150
done
} 2>&1 | tee "$OUT/log.txt"
echo "elapsed $(( $(date +%s) - T0 ))"
