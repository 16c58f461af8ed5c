#!/usr/bin/env bash
# Programmatic dependent launch, A/B in one run (~6 minutes on a fresh H200; each mode compiles the
# kernels once, its own cache entry): for each mode of PDL_MODES (default "off trigger off wait"),
# the demo pair at budget 16 and the Moonlight verify at 1 / 16 / 64 nodes, tables only (nothing
# appended). Run from the repo root with .whl carried; logs to $OUT/log.txt.
source tools/h200_env.sh
{
for mode in ${PDL_MODES:-off trigger off wait}; do
  echo "== DDTREE_PDL=$mode: demo_pair.py --budgets 16"
  DDTREE_PDL=$mode timeout 150 python3 benchmarks/demo_pair.py --budgets 16 --no-append 2>&1 | grep "^| [a-z]"
  echo "== DDTREE_PDL=$mode: verify_forward.py --nodes 1 16 64"
  DDTREE_PDL=$mode timeout 200 python3 benchmarks/verify_forward.py --nodes 1 16 64 --no-breakdown --no-append \
    2>&1 | grep "^| [0-9]"
done
} 2>&1 | tee "$OUT/log.txt"
echo "elapsed $(( $(date +%s) - T0 ))"
