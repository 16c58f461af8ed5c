#!/usr/bin/env bash
# Programmatic dependent launch, A/B in one run (under 10 minutes on a fresh H200): for each mode
# of PDL_MODES (default "off trigger"; each mode compiles every kernel once, its own cache entry,
# ~1-2 minutes), the demo pair at budget 16 and the Moonlight verify at 1 / 16 / 64 nodes, tables
# only (nothing appended); VERIFY_ARGS= adds verify_forward.py arguments (e.g. --shared-inline: the
# shared experts not on a side stream, whose kernels the early-launched ones may crowd).
# Then tools/pdl_probe.py (a chain of small kernels, each PDL variant) in the last ~60 s.
# Run from the repo root with .whl carried; logs to $OUT/log.txt.
source tools/h200_env.sh
MODES=(${PDL_MODES:-off trigger})
n=${#MODES[@]}
{
i=0
for mode in "${MODES[@]}"; do
  i=$((i + 1))
  share=$(( 520 * i / n ))                       # this mode's end, in seconds from the start
  echo "== DDTREE_PDL=$mode: demo_pair.py --budgets 16"
  DDTREE_PDL=$mode timeout $(( $(left $share) / 2 )) python3 benchmarks/demo_pair.py --budgets 16 --no-append \
    2>&1 | grep "^| [a-z]"
  echo "== DDTREE_PDL=$mode: verify_forward.py --nodes 1 16 64"
  DDTREE_PDL=$mode timeout $(left $share) python3 benchmarks/verify_forward.py --nodes 1 16 64 --no-breakdown \
    --no-append ${VERIFY_ARGS:-} 2>&1 | grep "^| [0-9]"
done
echo "== tools/pdl_probe.py"
timeout $(left 580) python3 tools/pdl_probe.py --blocks 1 132
} 2>&1 | tee "$OUT/log.txt"
echo "elapsed $(( $(date +%s) - T0 ))"
