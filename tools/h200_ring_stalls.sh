#!/usr/bin/env bash
# Where the cp.async ring GEMM waits (~3 minutes on the H200; the eighteenth session ruled out DRAM
# re-reads, the chunk loop's instruction count, and the depth of both prefetches: docs/NOTES.md
# "Next" 0). Nsight Compute on the staged ring kernel's launches of tools/moe_stages.py --profile
# at ROWS (default "65 272"): speed of light, occupancy, warp stall reasons, scheduler issue
# rates and shared-memory bank conflicts of the fragment loads, KERNELS (default 4) launches a row
# count. Run from the repo root with .whl carried and DDTREE_COMMIT set; logs to $OUT/log.txt.
source tools/h200_env.sh
{
for rows in ${ROWS:-65 272}; do
  echo "== ncu, moe_stages.py --rows $rows --profile (the staged kernel's launches)"
  timeout $(left 170) ncu --profile-from-start off --clock-control none -k regex:staged \
    --launch-count ${KERNELS:-4} --section SpeedOfLight --section Occupancy --section WarpStateStats \
    --section SchedulerStats --section MemoryWorkloadAnalysis_Tables \
    --metrics l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,smsp__inst_executed_op_shared_ld.sum \
    python3 tools/moe_stages.py --rows $rows --profile 2>&1 | grep -v Warn \
    | grep -E "staged|Duration|Throughput|Occupancy|Registers|Stall|stall|Issue|Eligible|Active Warps|bank_conflicts|shared_ld|Block Limit|Warp Cycles" \
    | head -120
done
} 2>&1 | tee "$OUT/log.txt"
echo "elapsed $(( $(date +%s) - T0 ))"
