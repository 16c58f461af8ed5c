#!/usr/bin/env bash
# Issue 14's MLA attention on the H200 (~5 minutes): the attention, forward and decode tests
# (TESTS= names them), MLA_STAGES= runs of
# tools/mla_stages.py (each a quoted argument list, ';'-separated), compute-sanitizer memcheck and
# racecheck over one small tensor-core attention (SANITIZE= names the tools; empty skips them),
# VERIFY= the arguments of a benchmarks/verify_forward.py run (its table appended to
# docs/PERFORMANCE.md, copied to $OUT with results/verify_forward.json), DEMO= those of a
# benchmarks/demo_pair.py run (results/demo_pair.json).
# Run from the repo root with .whl carried; logs to $OUT/log.txt.
source tools/h200_env.sh
{
TESTS=${TESTS-tests/test_mla_kernel.py tests/test_model_cuda.py tests/test_decode_cuda.py}
[ -n "$TESTS" ] && timeout $(left 240) python3 -m pytest -q -p no:cacheprovider -n 4 \
  $TESTS --tb=short 2>&1 | grep -v Warn | tail -6
IFS=';' read -ra RUNS <<< "${MLA_STAGES-}"
for run in "${RUNS[@]}"; do
  echo "== mla_stages.py $run"
  timeout $(left 520) python3 tools/mla_stages.py --shape moonlight $run 2>&1 | grep -v Warn | tail -12
done
if [ -n "${VERIFY-}" ]; then                     # VERIFY= benchmarks/verify_forward.py's arguments
  echo "== verify_forward.py $VERIFY"
  timeout $(left 560) python3 benchmarks/verify_forward.py $VERIFY 2>&1 | grep -v Warn | tail -40
fi
if [ -n "${DEMO-}" ]; then                       # DEMO= benchmarks/demo_pair.py's arguments
  echo "== demo_pair.py $DEMO"
  timeout $(left 560) python3 benchmarks/demo_pair.py $DEMO 2>&1 | grep -v Warn | tail -30
fi
for tool in ${SANITIZE-memcheck racecheck}; do
  echo "== $tool"
  timeout $(left 580) compute-sanitizer --tool $tool python3 tools/mla_stages.py --shape moonlight \
    --prefix 260 --cases 9 2x5 --repeat 1 2>&1 | tail -2
done
} 2>&1 | tee "$OUT/log.txt"
cp docs/PERFORMANCE.md "$OUT/"; cp benchmarks/results/{verify_forward,demo_pair}.json "$OUT/" 2>/dev/null
echo "elapsed $(( $(date +%s) - T0 ))"
