# Sourced by the tools/h200_*.sh checks (bash, from the repo root, .whl carried): numpy 2.4 for
# numba-cuda from the carried wheel (../shared/GPU.md), $OUT, and left N: the seconds left of an
# N-second allowance counted from here (for `timeout $(left N)`).
set -u
export DDTREE_COMMIT=${DDTREE_COMMIT:-$(cat .commit 2>/dev/null || echo unknown)}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s)
left() { echo $(( $1 - $(date +%s) + T0 )); }
