#!/usr/bin/env bash
# An H200 run of the wgmma GEMM probe (~3 minutes; docs/NOTES.md Next 00, its specs in docs/PLANS.md
# §00): every default spec of
# tools/wgmma_gemm_probe.py at 65 and 17 live rows (q_proj and lm_head-like shapes), then the
# many-row specs at 1040 rows; each against the package's bits and torch. Run from the repo root
# with .whl carried; logs to $OUT/log.txt. Check the probe in the simulator first (NOTES).
# NCU="SPEC" adds Nsight Compute's warp-state and scheduler sections for that spec's first launch
# at 65 rows (q_proj); FAST=1 skips the 1040-row run.
source tools/h200_env.sh
{
python3 tools/wgmma_bits.py --seeds 10 2>&1 | tail -1
for rows in 65 17; do
timeout $(left 420) python3 tools/wgmma_gemm_probe.py --rows $rows --shapes "2048,3072;2048,16384" 2>&1 | tail -4
done
[ -n "${FAST:-}" ] || timeout $(left 560) python3 tools/wgmma_gemm_probe.py --rows 1040 --workspace 2048 --shapes "2048,3072;2048,16384" \
  --blocks "L,64,4;L,128,2,1,0,2;L,64,4,1,1,2;S,64,4;S,64,8,0,0,1,1,1,2;S,64,8,1,0,2,1,1,2;S,128,4,1,0,2,1,1,2;S,128,4,1,0,2,1,1" 2>&1 | tail -4
if [ -n "${NCU:-}" ]; then
  kernel=$([ "${NCU:0:1}" = S ] && echo build_swapped || echo build_lean)
  timeout $(left 590) ncu -k regex:$kernel -c 1 --section WarpStateStats --section SchedulerStats \
    python3 tools/wgmma_gemm_probe.py --rows 65 --shapes 2048,3072 --blocks "$NCU" 2>&1 | grep -v "^==PROF" | tail -45
fi
} 2>&1 | tee "$OUT/log.txt"
echo "elapsed $(( $(date +%s) - T0 ))"
