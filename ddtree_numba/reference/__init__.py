"""Pure-numpy twins of every kernel, one module per stage, same names as ``kernels``."""

from .topk import topk_logprobs
from .tree_build import build_tree, build_tree_levels, build_trees, enumerate_paths
from .visibility import visibility, visibility_bits
from .accept import follow_tree, round_seed, sample_post
from .compact import compact_rows, naive_gather_in_order, naive_row_hazards
from .embedding import embedding, lm_head
from .linear import linear
from .rms_norm import head_norm_rope, rms_norm
from .rope import rope, rope_cos_sin, rope_inv_freq, yarn_inv_freq, yarn_get_mscale, yarn_attention_factor, softmax_scale
from .gqa import gqa_attention
from .mla import (absorption_weights, chunked_attention, mla_attention_absorbed, mla_attention_naive, mla_kv_latent, mla_mask,
                  split_kv_b)
from .moe import moe_route, moe_experts, swiglu_mlp
