"""Pure-numpy twins of every kernel, one module per stage, same names as ``kernels`` (the device
tier's ``enqueue_*`` too: their signatures, on numpy arrays)."""

from .topk import topk_logprobs
from .tree_build import build_tree, build_tree_levels, build_trees, enumerate_paths
from .visibility import enqueue_visibility_bits, visibility, visibility_bits
from .accept import enqueue_round_seed, follow_tree, follow_trees, round_seed, sample_post
from .compact import compact_rows, enqueue_compact_rows, naive_gather_in_order, naive_row_hazards
from .embedding import embedding, enqueue_embedding, lm_head
from .linear import enqueue_linear, enqueue_linear_heads, linear
from .rms_norm import enqueue_qkv_norm_rope, enqueue_rms_norm, head_norm_rope, rms_norm
from .rope import dest_rows, enqueue_rope, rope, rope_cos_sin, rope_inv_freq, yarn_inv_freq, yarn_get_mscale, yarn_attention_factor, softmax_scale
from .gqa import enqueue_gqa_attention, gqa_attention
from .mla import (absorption_weights, chunked_attention, enqueue_mla_attention, mla_attention_absorbed,
                  mla_attention_naive, mla_kv_latent, mla_mask, split_kv_b)
from .moe import enqueue_moe_block, enqueue_swiglu_mlp, moe_route, moe_experts, swiglu_mlp
