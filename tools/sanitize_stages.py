"""Run the tree, accept and compaction kernels once each at realistic sizes, for
compute-sanitizer (memcheck and racecheck):

    compute-sanitizer --tool racecheck python tools/sanitize_stages.py [--full]

The capped top-K's whole-row fallback and the level build with many exact ties (its three ways of
ordering them): ``capped_and_ties``. Then the demo round's own shapes (``demo_shapes``): the
warp-a-row top-K of 15 rows of the drafter's 264 entries (k 16 and 1), both heap builds at
budgets 16 and 64 (the warp kernel with redux.sync and with shuffles, and the block kernel), and
the drafter's GQA attention with its fused merge (the last split block's arrival counter) over 330
context keys. ``--capped-and-ties``: only ``capped_and_ties``; ``--demo-shapes``: only
``demo_shapes``. ``--full``: only the split top-K and the level-synchronous build, at the
issue-15 size (V = 163840, budget 1024, L = 15), with exact ties, and the fallback at that size.
Exits non-zero if any result differs from its numpy twin (the attention: from its float32
reference, within 1e-5).
"""

import argparse

import numpy as np
from numba import cuda

from ddtree_numba import kernels as kn
from ddtree_numba import reference as ref


def full_size():
    """Split top-K (partial + merge kernels) and build_tree_levels at B = 1024, V = 163840."""
    rng = np.random.default_rng(8)
    L, V, budget = 15, 163840, 1024
    logits = (rng.standard_normal((L, V)) * 2).astype(np.float32)
    logits[:, :4096] = np.round(logits[:, :4096])  # exact ties, across slices' candidates
    lp, ids = kn.topk_logprobs(logits, budget)
    lp_r, ids_r = ref.topk_logprobs(logits, budget)
    ok = np.array_equal(ids, ids_r) and np.array_equal(lp, lp_r)
    tree = kn.build_tree_levels(lp, ids, budget)
    ok &= tree == ref.build_tree(lp_r, ids_r, budget)
    ok &= capped_fallback(logits, budget)
    cuda.synchronize()
    print(f"full size: tree {tree.num_nodes} nodes; top-K and level build match twins: {bool(ok)}")
    return ok


def capped_fallback(logits, k):
    """The capped top-K's whole-row fallback (kernels.topk: a slice held more than its cap of the
    row's top k): row 1's top k is put into slice 0's runs alone; True if it matches its twin."""
    from ddtree_numba.kernels import topk as tk
    G, cap = tk._split(logits.shape[1], k)
    assert cap < k, "k must take the capped path"
    x = logits.copy()
    ids0 = np.arange(x.shape[1])
    x[1, ids0[ref.topk.slice_of(ids0, G, tk.SLICE_RUN) == 0][:k]] += 30.0     # all of the top k in slice 0
    lp, ids = kn.topk_logprobs(x, k)
    lp_r, ids_r = ref.topk_logprobs(x, k)
    ok = bool(np.array_equal(ids, ids_r) and np.array_equal(lp, lp_r))
    print(f"capped top-K (G {G}, cap {cap}, k {k}) with a fallback row matches its twin: {ok}")
    return ok


def capped_and_ties(rng):
    """The capped top-K's whole-row fallback, and the level build with many exact ties (its
    few-ties path, that path's overflow, and the preorder path); True if all match their twins."""
    ok = capped_fallback((rng.standard_normal((3, 40960)) * 2).astype(np.float32), 128)
    xt = rng.integers(-2, 2, (6, 40)).astype(np.float32)
    lpt, idt = ref.topk_logprobs(xt, 40)
    for tie_slots in (None, 256, 4, 0):
        ok &= kn.build_tree_levels(lpt, idt, 200, tie_slots=tie_slots) == ref.build_tree(lpt, idt, 200)
    cuda.synchronize()
    print(f"capped top-K fallback and level-build tie orderings match: {bool(ok)}")
    return ok


def demo_shapes(rng):
    """The kernels only the demo-sized round takes (module docstring); True if all match."""
    L, V = 15, 264
    logits = (rng.standard_normal((L, V)) * 3).astype(np.float32)
    logits[:, :32] = np.round(logits[:, :32])      # exact ties
    logits[0, 7] += 20                             # a confident row (the log-sum-exp's log1p path)
    ok = True
    for k in (16, 1):
        lp, ids = kn.topk_logprobs(logits, k)      # the rows kernel (topk._rows_path)
        lp_r, ids_r = ref.topk_logprobs(logits, k)
        ok &= np.array_equal(ids, ids_r) and np.array_equal(lp, lp_r)
    for budget in (16, 64):                        # the warp kernel (redux and shuffles), the block one
        lp, ids = ref.topk_logprobs(logits, budget)
        want = ref.build_tree(lp, ids, budget)
        ok &= kn.build_tree(lp, ids, budget, method="warp") == want
        ok &= kn.build_tree(lp, ids, budget, method="block") == want
        redux = kn.tree_build.WARP_REDUX
        try:
            kn.tree_build.WARP_REDUX = not redux
            ok &= kn.build_tree(lp, ids, budget, method="warp") == want
        finally:
            kn.tree_build.WARP_REDUX = redux
    T, S, Hq, Hkv, Dh = 16, 346, 8, 4, 32
    q = rng.standard_normal((T, Hq, Dh)).astype(np.float32)
    k = rng.standard_normal((S, Hkv, Dh)).astype(np.float32)
    v = rng.standard_normal((S, Hkv, Dh)).astype(np.float32)
    got = kn.gqa_attention(q, k, v, 0.17)
    ok &= np.allclose(got, ref.gqa_attention(q, k, v, 0.17), rtol=1e-5, atol=1e-6)
    cuda.synchronize()
    print(f"demo shapes (rows top-K, heap builds at 16 and 64, GQA with its fused merge) match: {bool(ok)}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--full", action="store_true", help="only the issue-15 size")
    only.add_argument("--capped-and-ties", action="store_true", help="only capped_and_ties")
    only.add_argument("--demo-shapes", action="store_true", help="only demo_shapes")
    args = ap.parse_args()
    if args.full:
        raise SystemExit(0 if full_size() else 1)
    rng = np.random.default_rng(7)
    if args.capped_and_ties:
        raise SystemExit(0 if capped_and_ties(rng) else 1)
    if args.demo_shapes:
        raise SystemExit(0 if demo_shapes(rng) else 1)
    L, V, budget = 15, 4096, 256
    logits = (rng.standard_normal((L, V)) * 2).astype(np.float32)
    logits[:, :64] = np.round(logits[:, :64])  # exact ties
    lp, ids = kn.topk_logprobs(logits, budget)
    lp_r, ids_r = ref.topk_logprobs(logits, budget)
    ok = np.array_equal(ids, ids_r) and np.array_equal(lp, lp_r)
    ok &= capped_and_ties(rng)
    tree = kn.build_tree(lp, ids, budget)
    ok &= tree == ref.build_tree(lp_r, ids_r, budget)
    ok &= np.array_equal(kn.visibility(tree.parents), ref.visibility(tree.parents))
    ok &= np.array_equal(kn.visibility_bits(tree.parents), ref.visibility_bits(tree.parents))
    tl = (rng.standard_normal((tree.num_nodes + 1, 512)) * 2).astype(np.float32)
    post = kn.sample_post(tl, 0.8, 11)
    ok &= np.array_equal(post, ref.sample_post(tl, 0.8, 11))
    for j in range(1, tree.num_nodes + 1):
        if rng.random() < 0.5:
            post[tree.parents[j]] = tree.tokens[j - 1]
    keep, bonus = kn.follow_tree(tree, post)
    keep_r, bonus_r = ref.follow_tree(tree, post)
    ok &= np.array_equal(keep, keep_r) and bonus == bonus_r
    rows = rng.standard_normal((100 + budget + 1, 576)).astype(np.float32)
    for method in ("columns", "scratch"):
        got, want = rows.copy(), rows.copy()
        kn.compact_rows(got, 100, keep, method=method)
        ref.compact_rows(want, 100, keep)
        ok &= np.array_equal(got, want)
    cuda.synchronize()
    print(f"tree {tree.num_nodes} nodes, accepted {len(keep)}; all match twins: {bool(ok)}")
    ok &= demo_shapes(rng)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
