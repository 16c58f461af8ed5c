#!/usr/bin/env bash
# Tile sweeps and the stale figures on the H200 (~9 minutes), the next session's first run: the GPU
# tests of TESTS (default test_mla_kernel), benchmarks/gemm.py's sweep of GEMM_SWEEP (default
# lm_head,q_proj,o_proj,kv_a) at GEMM_ROWS (default 16,64; tables only; the sweep stops after
# 150 s), tools/mla_stages.py --tree ddtree at MLA_CASES (default 64 256 1024), then
# benchmarks/batch.py with BATCH= its arguments (its table appended to docs/PERFORMANCE.md,
# results/batch.json copied to $OUT; BATCH=skip skips it). Run from the repo root with .whl carried
# and DDTREE_COMMIT set; logs to $OUT/log.txt.
source tools/h200_env.sh
{
TESTS=${TESTS-tests/test_mla_kernel.py}
[ -n "$TESTS" ] && timeout $(left 60) python3 -m pytest -q -p no:cacheprovider -n 4 $TESTS --tb=short 2>&1 \
  | grep -v Warn | tail -4
echo "== gemm.py sweep ${GEMM_SWEEP:-lm_head,q_proj,o_proj,kv_a} at ${GEMM_ROWS:-16,64} rows"
timeout $(left 330) python3 benchmarks/gemm.py --rows ${GEMM_ROWS:-16,64} --fp32-rows "" --no-peer --no-append \
  --no-kind-checks --sweep ${GEMM_SWEEP:-lm_head,q_proj,o_proj,kv_a} --budget 150 2>&1 | grep -v Warn \
  | grep -E "^\[|SWEEP|FAIL|ALL CHECKS" | grep -vE "check .*: OK|batch invariance .*OK" | tail -70
echo "== mla_stages.py --tree ddtree --cases ${MLA_CASES:-64 256 1024}"
timeout $(left 410) python3 tools/mla_stages.py --shape moonlight --tree ddtree --cases ${MLA_CASES:-64 256 1024} \
  2>&1 | grep -v Warn | tail -8
if [ "${BATCH-}" != "skip" ]; then
  echo "== batch.py ${BATCH-}"
  timeout $(left 570) python3 benchmarks/batch.py ${BATCH-} 2>&1 | grep -v Warn | tail -30
fi
} 2>&1 | tee "$OUT/log.txt"
cp docs/PERFORMANCE.md "$OUT/"; cp benchmarks/results/batch.json "$OUT/" 2>/dev/null
echo "elapsed $(( $(date +%s) - T0 ))"
