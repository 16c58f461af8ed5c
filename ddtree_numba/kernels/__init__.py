"""numba.cuda kernels, one module per stage, same function names as ``reference``.

Two tiers (docs/DESIGN.md §3):

- **Launchers**, one per stage, named as their numpy twin (``linear``, ``build_tree``, ...):
  they accept numpy or numba device arrays, validate their arguments (``ValueError`` naming
  the problem), return numpy results for numpy inputs, and take ``out=`` (preallocated device
  outputs, filled without a host sync) and ``stream=``.
- **The device tier**, ``enqueue_*``: what the models and the GPU decode loop are built from.
  Device arrays only, no checks, no allocation, no host sync; the sizes that change between
  calls (live rows, cache length) are read from small device arrays, so a captured CUDA graph
  replays them. Each has a numpy twin of its own name and signature in ``reference`` (named
  in its docstring). ``TreeBuffers``, ``LevelScratch``,
  ``TopKScratch``, ``MLAScratch``, ``GQAScratch``, ``MoEBuffers`` and ``MoERoute`` are the
  buffers and parameters they take.
"""

from .topk import TopKScratch, topk_logprobs
from .tree_build import LevelScratch, TreeBatchBuffers, TreeBuffers, build_tree, build_tree_levels, build_trees
from .visibility import enqueue_visibility_bits, visibility, visibility_bits
from .accept import enqueue_round_seed, follow_tree, follow_trees, sample_post
from .compact import compact_rows, enqueue_compact_rows
from .._checks import PRECISIONS
from .linear import TILES, enqueue_linear, enqueue_linear_heads, linear
from .mla import MLAScratch, enqueue_mla_attention, mla_attention_absorbed
from .gqa import GQAScratch, enqueue_gqa_attention, gqa_attention
from .moe import MoEBuffers, MoERoute, enqueue_moe_block, enqueue_swiglu_mlp, moe_experts, moe_route, swiglu_mlp
from .rms_norm import enqueue_qkv_norm_rope, enqueue_rms_norm, rms_norm
from .rope import PoolRows, enqueue_rope, rope, rope_cos_sin
from .embedding import embedding, enqueue_embedding, lm_head

__all__ = [
    # launchers (twins in ddtree_numba.reference)
    "topk_logprobs", "build_tree", "build_tree_levels", "build_trees", "visibility", "visibility_bits", "follow_tree", "follow_trees", "sample_post",
    "compact_rows", "linear", "mla_attention_absorbed", "gqa_attention", "moe_route", "moe_experts",
    "swiglu_mlp", "rms_norm", "rope", "rope_cos_sin", "embedding", "lm_head",
    # the device tier
    "enqueue_visibility_bits", "enqueue_round_seed", "enqueue_compact_rows", "enqueue_linear",
    "enqueue_linear_heads", "enqueue_mla_attention",
    "enqueue_gqa_attention",
    "enqueue_swiglu_mlp", "enqueue_moe_block", "enqueue_rms_norm", "enqueue_qkv_norm_rope",
    "enqueue_rope", "enqueue_embedding",
    # buffers and parameters
    "TreeBuffers", "TreeBatchBuffers", "LevelScratch", "TopKScratch", "MLAScratch", "GQAScratch", "MoEBuffers", "MoERoute", "PoolRows", "TILES", "PRECISIONS",
]
