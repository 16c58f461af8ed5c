#!/usr/bin/env bash
# The pending GPU call (forty-eighth session, for the next one). Carry .whl, .commit and ab_old:
#   mkdir ab_old && git archive 08986a9 ddtree_numba benchmarks tools | tar -x -C ab_old \
#     && rm -rf ab_old/ddtree_numba/data
# (08986a9: the forty-seventh session's end, before the forty-eighth's changes: the GQA merge's
# partials loaded at once, the MoE routing's and sort's first inputs loaded with n_rows; and
# draft_ab's split+merge side). Logs to $OUT/log.txt; ~9 minutes; in order of worth, so that a
# short device budget cuts the tail:
#  1. the GPU tests of the changed kernels (GQA, MoE, the norms and rope), of the drafter (the
#     forty-ninth session's drafts of fewer depths) and of the decode loops (greedy ddtree == ar),
#     in the demo's PDL mode;
#  2. on an H200: tree_build.py --quick (the issue-15 results file is 21070de's) and the demo pair
#     with the HF peer (issue 14's 5,000 tokens/s there; last 4,847 at 22aed85); results files and
#     PERFORMANCE.md to $OUT;
#  3. on an H100: the whole draft with the attention forced to the fused split kernel, the split
#     kernel + its merge launch, the warp kernel, and whole rounds with gqa.FUSE_MERGE False (both ways) (tools/gqa_keys.py at a63815b: split + merge
#     1.4-2.8 µs a launch faster than the fused split, the demo's default at one sequence); the GQA
#     kernels per side; the MoE block per side (ab_old has the shared-memory sort, 0.4-0.8 µs
#     slower than 0074d24's at a63815b; the forty-ninth session returned to 0074d24's sort, so
#     this says whether the return holds); the demo round per side.
source tools/h200_env.sh
[ -d ab_old/ddtree_numba/data ] || cp -r ddtree_numba/data ab_old/ddtree_numba/
side() { local dir=$1 label=$2; shift 2; (cd "$dir" && PYTHONPATH=/tmp/site:$PWD DDTREE_CACHE_DIR=/tmp/cache_$label "$@"); }
{
nvidia-smi --query-gpu=name --format=csv,noheader
side . new env DDTREE_PDL=trigger timeout 200 python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_gqa_kernel.py \
  tests/test_norm_rope_embed_kernels.py tests/test_moe_kernel.py tests/test_decode_cuda.py tests/test_cuda_drafter.py -rf --tb=short 2>&1 \
  | grep -v Warn | grep -E "^FAILED|passed|failed|Max abs" | head -12
echo "t=$(( $(date +%s) - T0 ))"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  timeout 130 python3 benchmarks/tree_build.py --quick 2>&1 | grep -v Warn | tail -8
  echo "t=$(( $(date +%s) - T0 ))"
  timeout $(left 585) python3 benchmarks/demo_pair.py --budgets 4 8 16 32 64 --peer 2>&1 | grep -v Warn | grep "^| \|^###"
  cp benchmarks/results/tree_build.json benchmarks/results/demo_pair.json docs/PERFORMANCE.md "$OUT/" 2>/dev/null
else
  for keys in 330 48; do
    echo "== draft_ab $keys keys"
    side . new timeout 60 python3 tools/draft_ab.py --keys $keys --rounds 8 2>&1 | grep -v Warn | tail -5
    echo "t=$(( $(date +%s) - T0 ))"
  done
  for way in knob a-knob; do      # the fused merge against its own launch in whole rounds, both ways
    echo "== round_ab --$way FUSE_MERGE=False"
    side . new timeout 120 python3 tools/round_ab.py --$way ddtree_numba.kernels.gqa.FUSE_MERGE=False --passes 5 \
      2>&1 | grep -v Warn | tail -4
    echo "t=$(( $(date +%s) - T0 ))"
  done
  for label in new old; do
    echo "== gqa_keys $label"
    dir=$([ $label = old ] && echo ab_old || echo .)
    side $dir $label timeout 60 python3 tools/gqa_keys.py --keys 48 330 1000 --repeat 30 2>&1 | grep -v Warn | tail -5
    echo "t=$(( $(date +%s) - T0 ))"
  done
  for label in new old; do
    echo "== moe_stages $label"
    dir=$([ $label = old ] && echo ab_old || echo .)
    side $dir $label timeout 60 python3 tools/moe_stages.py --rows 1 17 65 --repeat 20 2>&1 | grep -v Warn | grep '^|' | head -5
    echo "t=$(( $(date +%s) - T0 ))"
  done
  for label in old new; do
    echo "== round $label"
    dir=$([ $label = old ] && echo ab_old || echo .)
    side $dir $label timeout $(left 590) python3 tools/profile_round.py --budgets 16 --prompts 4 2>&1 | grep -v Warn | tail -4
    echo "t=$(( $(date +%s) - T0 ))"
  done
fi
echo "elapsed $(( $(date +%s) - T0 ))"
} 2>&1 | tee "$OUT/log.txt"
