#!/usr/bin/env bash
# An H200 check of the twenty-second session's launch cuts (docs/NOTES.md Next 00b): norms folded
# into their GEMMs, the drafter's attention in one launch, the level build's seed. Run from the repo
# root with .whl carried (and ab_old/ for PART=ab); logs to $OUT/log.txt.
# PART=tests (~4 minutes): the fold against the norm's own launch bit for bit (tests/test_norm_fold.py:
#   the GPU's _warp_inv_rms, 256 virtual threads in shuffles), the fused attention merge against its
#   own launch (tests/test_gqa_kernel.py), the seeded level build against the twin
#   (tests/test_tree_build.py), and the models and rounds over them.
# PART=ab (~6 minutes): the demo pair in one run on both sides, ab_old/ (a copy of the tree before
#   the fold: git worktree add ab_old 7d0cc9b, or git archive 7d0cc9b | tar -x -C ab_old) and this
#   one: per-stage round times (tools/profile_round.py) and tokens/s (benchmarks/demo_pair.py,
#   not appended).
# PART=c7 (~4 minutes): ab_old/ = c7f9e50 (git archive c7f9e50 ddtree_numba benchmarks | tar -x -C
#   ab_old; its ddtree_numba/data may be left out, copied from this tree), the commit of the best demo figures, against this tree: benchmarks/demo_pair.py at
#   budgets 16 and 64, alternating old, new, old, new (each side its own kernel cache).
# PART=knob (~1 minute): the fold alone, in one checkout: benchmarks/demo_pair.py at budgets 16 and
#   64 with the fold on, off (linear._NORM_FOLD_K = 0: each norm its own launch, the same bits),
#   on again, off again (alternating, so the machine's drift shows).
source tools/h200_env.sh
{
if [ "${PART:-tests}" = tests ]; then
timeout $(left 560) python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_norm_fold.py tests/test_gqa_kernel.py \
  tests/test_tree_build.py tests/test_model_cuda.py tests/test_cuda_drafter.py tests/test_decode_cuda.py --tb=short \
  2>&1 | grep -v Warn | tail -6
elif [ "${PART}" = c7 ]; then
[ -d ab_old/ddtree_numba/data ] || cp -r ddtree_numba/data ab_old/ddtree_numba/   # (not carried: 26 MB, unchanged)
for side in ab_old . ab_old .; do
  echo "== $side"
  (cd $side && export PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/cache_$(basename $PWD) &&
   timeout $(left 560) python3 benchmarks/demo_pair.py --budgets 16 64 --no-append 2>&1 | grep -v Warn |
   grep "^| \(ar\|dflash\|ddtree\)")
done
elif [ "${PART}" = knob ]; then
for fold in 1024 0 1024 0; do
  echo "== _NORM_FOLD_K = $fold"
  timeout $(left 580) python3 -c "
import runpy, sys
import ddtree_numba.kernels.linear as lin
lin._NORM_FOLD_K = $fold
sys.argv = ['demo_pair.py', '--budgets', '16', '64', '--no-append']
runpy.run_path('benchmarks/demo_pair.py', run_name='__main__')" 2>&1 | grep -v Warn | grep "^| \(ar\|dflash\|ddtree\)"
done
else
end=0
for side in ab_old .; do                        # each side its own kernel cache and half the time
  echo "== $side"
  end=$((end + 290))
  (cd $side && export PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/cache_$(basename $PWD) &&
   timeout $(left $((end - 150))) python3 tools/profile_round.py --budgets 16 64 --prompts 4 2>&1 | grep -v Warn | tail -12;
   timeout $(left $end) python3 benchmarks/demo_pair.py --budgets 16 32 64 --no-append 2>&1 | grep -v Warn | tail -9)
done
fi
} 2>&1 | tee "$OUT/log.txt"
echo "elapsed $(( $(date +%s) - T0 ))"
