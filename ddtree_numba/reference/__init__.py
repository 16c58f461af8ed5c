"""Pure-numpy twins of every kernel, one module per stage, same names as ``kernels``."""

from .topk import topk_logprobs
from .tree_build import build_tree, enumerate_paths
from .visibility import visibility, visibility_bits
from .accept import follow_tree, sample_post
from .compact import compact_rows, naive_gather_in_order, naive_row_hazards
