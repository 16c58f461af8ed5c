"""numba.cuda kernels, one module per stage, same function names as ``reference``.

Every launcher accepts numpy or numba device arrays, validates its arguments
(``ValueError`` naming the problem), returns numpy results for numpy inputs, and takes
``out=`` (preallocated device outputs, filled without a host sync) and ``stream=``.
"""

from .topk import topk_logprobs
from .tree_build import TreeBuffers, build_tree
from .visibility import visibility, visibility_bits
from .accept import follow_tree, sample_post
from .compact import compact_rows
from .linear import linear
from .mla import mla_attention_absorbed
from .gqa import gqa_attention
from .moe import MoEBuffers, MoERoute, moe_experts, moe_route, swiglu_mlp
from .rms_norm import rms_norm
from .rope import rope, rope_cos_sin
from .embedding import embedding, lm_head
