"""One cuda-backend forward of a golden checkpoint (prefix, then a tree), compaction included,
for compute-sanitizer: python tools/sanitize_forward.py [case]."""

import os
import sys

import numpy as np

import ddtree_numba as dd

DATA = os.path.join(os.path.dirname(__file__), "..", "tests", "data")
case = sys.argv[1] if len(sys.argv) > 1 else "v3_noaux_tc"
target = dd.load_target(os.path.join(DATA, case), backend="cuda")
tree = np.load(os.path.join(DATA, case, "tree.npz"))
cache = target.new_cache(32)
target.forward(tree["prefix_ids"], tree["prefix_positions"], cache)
out = target.forward(tree["tree_ids"], tree["tree_positions"], cache, parents=tree["parents"],
                     hidden_layer_ids=(0,))
cache.compact(len(tree["prefix_ids"]), np.array([0, 1, 3], np.int32))
out2 = target.forward(tree["tree_ids"][:1], np.array([len(cache)]), cache)
print("finite:", bool(np.isfinite(out.logits).all() and np.isfinite(out2.logits).all()))
