#!/usr/bin/env bash
# The routed experts' GEMMs on the H200 (~5 minutes): the GEMM and MoE tests (TESTS= names them),
# MOE_STAGES= runs of tools/moe_stages.py (each a quoted argument list, ';'-separated),
# compute-sanitizer over the cp.async weight-ring tests (SANITIZE= names the tools; empty skips
# them), VERIFY= the arguments of a benchmarks/verify_forward.py run, BATCH= those of a
# benchmarks/batch.py run, DEMO= those of a benchmarks/demo_pair.py run (tables appended to
# docs/PERFORMANCE.md, results copied to $OUT).
# Run from the repo root with .whl carried; logs to $OUT/log.txt.
source tools/h200_env.sh
{
TESTS=${TESTS-tests/test_linear_kernel.py tests/test_moe_kernel.py}
[ -n "$TESTS" ] && timeout $(left 240) python3 -m pytest -q -p no:cacheprovider -n 4 \
  $TESTS --tb=short 2>&1 | grep -v Warn | tail -8
IFS=';' read -ra RUNS <<< "${MOE_STAGES-}"
for run in "${RUNS[@]}"; do
  echo "== moe_stages.py $run"
  timeout $(left 480) python3 tools/moe_stages.py $run 2>&1 | grep -v Warn | tail -40
done
for tool in ${SANITIZE-racecheck memcheck}; do
  echo "== $tool"
  timeout $(left 520) compute-sanitizer --tool $tool python3 -m pytest -q -p no:cacheprovider -n 0 \
    tests/test_linear_kernel.py -k weight_ring 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" | tail -3
done
if [ -n "${VERIFY-}" ]; then
  echo "== verify_forward.py $VERIFY"
  timeout $(left 570) python3 benchmarks/verify_forward.py $VERIFY 2>&1 | grep -v Warn | tail -40
fi
if [ -n "${DEMO-}" ]; then                       # DEMO= benchmarks/demo_pair.py's arguments
  echo "== demo_pair.py $DEMO"
  timeout $(left 560) python3 benchmarks/demo_pair.py $DEMO 2>&1 | grep -v Warn | tail -30
fi
if [ -n "${BATCH-}" ]; then
  echo "== batch.py $BATCH"
  timeout $(left 590) python3 benchmarks/batch.py $BATCH 2>&1 | grep -v Warn | tail -30
fi
} 2>&1 | tee "$OUT/log.txt"
cp docs/PERFORMANCE.md "$OUT/"; cp benchmarks/results/{verify_forward,batch,demo_pair}.json "$OUT/" 2>/dev/null
echo "elapsed $(( $(date +%s) - T0 ))"
