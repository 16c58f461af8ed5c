"""One cuda-backend forward of a golden checkpoint (prefix, then a tree), compaction included,
then a batched forward (``forward_batch``) of three sequences in slots of one cache pool, out of
order and of different lengths, compacted too, for compute-sanitizer:
python tools/sanitize_forward.py [case]."""

import argparse
import os

import numpy as np

import ddtree_numba as dd
from ddtree_numba.model.target import Segment

DATA = os.path.join(os.path.dirname(__file__), "..", "tests", "data")
ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("case", nargs="?", default="v3_noaux_tc", help="a golden checkpoint under tests/data (default v3_noaux_tc)")
case = ap.parse_args().case
target = dd.load_target(os.path.join(DATA, case), backend="cuda")
tree = np.load(os.path.join(DATA, case, "tree.npz"))
cache = target.new_cache(32)
target.forward(tree["prefix_ids"], tree["prefix_positions"], cache)
out = target.forward(tree["tree_ids"], tree["tree_positions"], cache, parents=tree["parents"],
                     hidden_layer_ids=(0,))
cache.compact(len(tree["prefix_ids"]), np.array([0, 1, 3], np.int32))
out2 = target.forward(tree["tree_ids"][:1], np.array([len(cache)]), cache)
finite = np.isfinite(out.logits).all() and np.isfinite(out2.logits).all()

# the batch: slots 3, 0, 1 of a 4-slot pool; a chain, the golden tree, one token
pool = target.new_cache_pool(4, 40).caches
p = len(tree["prefix_ids"])
for slot, cut in ((3, p), (0, p - 2), (1, 3)):
    target.forward(tree["prefix_ids"][:cut], tree["prefix_positions"][:cut], pool[slot])
segs = [Segment(tree["tree_ids"][:4], np.arange(p, p + 4), pool[3]),
        Segment(tree["tree_ids"], tree["tree_positions"] - 2, pool[0], tree["parents"]),
        Segment(tree["tree_ids"][:1], np.array([3]), pool[1])]
for graph in (False, True):
    lengths = [s.cache.length for s in segs]
    res = target.forward_batch(segs, hidden_layer_ids=(0,), graph=graph)
    finite = finite and all(np.isfinite(o.logits).all() for o in res.outputs)
    for s, n in zip(segs, lengths):
        s.cache.truncate(n)
target.forward_batch(segs)
pool[0].compact(p - 2, np.array([0, 1, 3], np.int32))      # the tree's accepted path, in its slot
print("finite:", bool(finite))
