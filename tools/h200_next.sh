#!/usr/bin/env bash
# The next session's first H200 call (after the sixth session): 8cecbf9's grouped one-row-tile rule
# end to end (a 65-node Moonlight verify: a 128-row workspace, where the forced-tile A/B gave routed
# gate|up 669 -> 345 µs), the MoE block at more tiles (more warps splitting K at few rows; the
# router), then benchmarks/batch.py (batch 4 x 17 = 68 rows is such a workspace too; and the pooled
# cache writes, kernels.PoolRows, tested here first on a GPU).
# Run from the repo root with .whl carried and DDTREE_COMMIT set; logs to $OUT. ~8 minutes.
set -u
export DDTREE_COMMIT=${DDTREE_COMMIT:-unknown}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/results"
T0=$(date +%s)
left() { echo $(( $1 - $(date +%s) + T0 )); }
# PoolRows changed rms_norm's and rope's kernels (every forward's): their tests first on a GPU
timeout $(left 60) python3 -m pytest -q -p no:cacheprovider tests/test_norm_rope_embed_kernels.py 2>&1 | tail -1
timeout $(left 120) python3 -m pytest -q -p no:cacheprovider tests/test_model_cuda.py -k batched 2>&1 | tail -1
timeout $(left 200) python3 benchmarks/verify_forward.py --nodes 64 65 --no-breakdown --reps 5 --no-append 2>&1 | tail -5
timeout $(left 360) python3 tools/moe_stages.py --rows 1 17 65 272 --tiles 1,1,4 1,1,8 2,1,2 2,1,4 \
  --router-tiles 1,1,8 1,1,16 2>&1 | tail -32
timeout $(left 480) python3 benchmarks/batch.py --reps 3 2>&1 | tail -11
cp benchmarks/results/batch.json "$OUT/results/" 2>/dev/null; cp docs/PERFORMANCE.md "$OUT/PERFORMANCE.md"
echo "elapsed $(( $(date +%s) - T0 ))"
