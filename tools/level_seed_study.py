"""How many levels of the level build must select, with and without a seeded bound (CPU only).

The level build (``reference.build_tree_levels``) filters a level by its running bound tau (one
binary search a parent) and selects only when more than B children clear it; a selecting level
costs ~40 µs on the H200, and tau starts at -inf, so the first wide levels select. Any B real
nodes give a valid starting bound: the B-th best of their scores is <= the tree's B-th best. Two
families of nodes that need no search:

- single: one deviation, the path (0, .., 0, r) at each depth d: chain(d - 1) + lp[d, r];
- single + zeros: the same, continued by rank 0 to every deeper depth (r >= 1 there, so that no
  node is counted twice: r = 0 is the chain itself).

On six demo-drafter drafts (held-out prompts) the selecting levels fall, over the six, from 6 / 12
/ 15 / 19 (no seed) to 0 / 0 / 4 / 6 (single + zeros) at budgets 16 / 64 / 256 / 1024 (tenth
session). The cheaper subfamilies (deviations at the first depths only) do much less at 1024: 16 /
14 / 11 for depths < 1 / 2 / 3 (twenty-first session, docs/PLANS.md §1). The tree is unchanged
(checked here against the heap build's scores). A kernel would need the family's B-th best
cheaply, e.g. a bisection on the value counting each (depth, depth + j) list by binary search,
with a margin for the lists' sums taken out of path order (see docs/PLANS.md §1,
NOTES Next 1).

    python tools/level_seed_study.py [prompts]
"""

from __future__ import annotations

import argparse

import numpy as np

import ddtree_numba as dd
from ddtree_numba import reference as ref
from ddtree_numba.demo import demo_metadata
from ddtree_numba.reference import tree_build as tb


def demo_drafts(n: int) -> list:
    """The demo drafter's [L, V] logits after the first n held-out prompts (numpy backend)."""
    target_dir, drafter_dir = dd.demo_pair()
    target = dd.load_target(target_dir, progress=False, backend="numpy")
    drafter = dd.load_drafter(drafter_dir, target)
    out = []
    for p in demo_metadata()["prompts"][:n]:
        prompt = np.asarray(p["ids"][:141], np.int32)
        pre = target.forward(prompt, np.arange(len(prompt), dtype=np.int32), target.new_cache(256),
                             hidden_layer_ids=drafter.target_layer_ids)
        out.append(drafter.draft(pre.hidden, int(pre.logits[-1].argmax()), drafter.new_cache(256)))
    return out


def seed(lp64: np.ndarray, budget: int, zeros: bool, depths: int | None = None) -> float:
    """The budget-th best score of the family (module docstring); -inf when it has fewer.
    ``depths``: deviations at the first ``depths`` depths only (deeper depths give their chain
    node alone), the cheaper subfamilies."""
    L = lp64.shape[0]
    chain, family = 0.0, []
    for d in range(L):
        s = chain + lp64[d]                         # chain(d - 1) + lp[d, r], in path order
        if depths is not None and d >= depths:
            family.append(s[:1])
        else:
            family.append(s)
            if zeros:
                t = s[1:].copy()
                for e in range(d + 1, L):
                    t = t + lp64[e, 0]
                    family.append(t)
        chain = chain + lp64[d, 0]
    return tb._kth_largest(np.concatenate(family), budget)


# (name, seed arguments): no seed, then the families by size
FAMILIES = (("none", None), ("depth 0 + zeros", (True, 1)), ("depths < 2 + zeros", (True, 2)),
            ("depths < 3 + zeros", (True, 3)), ("single", (False, None)), ("single + zeros", (True, None)))


def levels(lp: np.ndarray, budget: int, tau: float) -> tuple[str, np.ndarray]:
    """The twin's level loop from a starting bound: each level's way ('f' filter, 'S' select) and
    the best ``budget`` scores kept."""
    L, K = lp.shape
    lp64, R = lp.astype(np.float64), min(K, budget)
    prev, kept, trace = np.zeros(1), np.zeros(0), ""
    for d in range(L):
        keep = tb.children_at_least(prev, lp64[d, :R], tau)
        filtered = keep.sum() <= budget
        if not filtered:
            keep = tb.select_level(prev, lp64[d, :R], budget)
        trace += "f" if filtered else "S"
        start = np.cumsum(keep) - keep
        parent = np.repeat(np.arange(prev.shape[0]), keep)
        score = prev[parent] + lp64[d, np.arange(parent.shape[0]) - start[parent]]
        kept = np.r_[kept, score]
        if kept.shape[0] >= budget:
            tau = max(tau, tb._kth_largest(kept, budget))
        if score.shape[0] == 0:
            break
        prev = score
    return trace, -np.sort(-kept)[:budget]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prompts", type=int, nargs="?", default=6, help="demo prompts to draft from (default 6)")
    drafts = demo_drafts(ap.parse_args().prompts)
    print("budget | selecting levels over the drafts: " + " / ".join(name for name, _ in FAMILIES)
          + " / the build's lazy seed (reference.build_tree_levels: family_seed's search at the first level"
          " that would select)")
    for budget in (16, 32, 64, 128, 256, 1024):
        sel, lazy = [0] * len(FAMILIES), 0
        for x in drafts:
            lp, ids = ref.topk_logprobs(x, min(budget, x.shape[1]))
            lp64 = lp[:, :min(lp.shape[1], budget)].astype(np.float64)
            want = ref.build_tree(lp, ids, budget).scores
            for i, (_, args) in enumerate(FAMILIES):
                tau = -np.inf if args is None else seed(lp64, budget, *args)
                trace, top = levels(lp, budget, tau)
                assert tau <= want[-1] and np.array_equal(top[:want.shape[0]], want), "a seed lost a node"
                sel[i] += trace.count("S")
            trace = []
            assert ref.build_tree_levels(lp, ids, budget, trace=trace) == ref.build_tree(lp, ids, budget)
            lazy += trace.count("select")
        print(f"{budget:6d} | {' / '.join(map(str, sel))} / {lazy}")


if __name__ == "__main__":
    main()
