"""Command line: ``ddtree-numba demo``.

Until the trained demo pair exists, ``demo`` runs one DDTree round's tree stages on
synthetic drafter logits: top-K, best-first build, visibility, a target that agrees with
the drafter for a while, acceptance and cache compaction; it prints the tree and the
accepted path and checks the chosen backend against the numpy twins.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np


def _pick_backend(requested: str) -> str:
    if requested != "auto":
        return requested
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return "numpy"  # the simulator is for tests: the twins give the same answer, fast
    from numba import cuda
    return "cuda" if cuda.is_available() else "numpy"


def synthetic_drafter_logits(rng, depths: int, vocab: int) -> np.ndarray:
    """[L, V] float32 logits that look like a confident drafter: one favourite, a few runner-ups."""
    logits = rng.standard_normal((depths, vocab)).astype(np.float32)
    for d in range(depths):
        top = rng.choice(vocab, 4, replace=False)
        logits[d, top] += np.array([7.0, 5.5, 5.0, 3.0], np.float32) * (1.0 - 0.05 * d)
    return logits


def run_round_demo(backend: str, depths: int, vocab: int, budget: int, seed: int) -> int:
    from . import reference as ref
    stages = ref
    if backend == "cuda":
        from . import kernels as stages
    rng = np.random.default_rng(seed)
    logits = synthetic_drafter_logits(rng, depths, vocab)                    # [L, V]
    t0 = time.perf_counter()
    lp, ids = stages.topk_logprobs(logits, min(budget, vocab))               # [L, K]
    tree = stages.build_tree(lp, ids, budget)
    vis = stages.visibility(tree.parents)                                    # [N+1, N+1]
    # a target that takes the drafter's path through rank 0, then rank 1, then disagrees
    post = rng.integers(0, vocab, tree.num_nodes + 1).astype(np.int32)       # [N+1]
    node = 0
    for want_rank in [0, 1, 0, 0]:
        kids = [j for j in range(1, tree.num_nodes + 1)
                if tree.parents[j] == node and tree.ranks[j - 1] == want_rank]
        if not kids:
            break
        post[node] = tree.tokens[kids[0] - 1]
        node = kids[0]
    keep, bonus = stages.follow_tree(tree, post)
    start = 10
    cache = np.arange(start + tree.num_nodes + 1, dtype=np.float32)[:, None].repeat(4, 1)  # [S, W]
    stages.compact_rows(cache, start, keep)
    elapsed = time.perf_counter() - t0

    print(f"backend: {backend}   depths L={depths}  vocab V={vocab}  budget={budget}  seed={seed}")
    print(f"\ntop-K log-probs per depth (first 4 of K={lp.shape[1]}):")
    for d in range(depths):
        row = "  ".join(f"{int(ids[d, r]):>5d}:{lp[d, r]:6.2f}" for r in range(min(4, lp.shape[1])))
        print(f"  depth {d + 1:2d}  {row}")
    print(f"\ntree: {tree.num_nodes} nodes, max depth {int(tree.depths.max(initial=0))}; "
          f"visibility {vis.shape}, {int(vis.sum())} visible pairs")
    print(tree.format(root_label="<bonus b>", accepted=keep))
    print(f"\naccepted path (node ids): {keep.tolist()}  -> tokens "
          f"{[int(tree.tokens[k - 1]) for k in keep[1:]]}, new bonus {bonus}")
    print(f"cache rows {start}..{start + len(keep) - 1} after compaction: "
          f"{cache[start:start + len(keep), 0].astype(int).tolist()} (were rows start + keep)")

    # hold the chosen backend to the numpy twins
    ok = (ref.build_tree(*ref.topk_logprobs(logits, min(budget, vocab)), budget) == tree
          and ref.follow_tree(tree, post)[0].tolist() == keep.tolist())
    print(f"\n{backend} stages {'match' if ok else 'DO NOT MATCH'} the numpy twins; {elapsed * 1e3:.1f} ms")
    return 0 if ok else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="ddtree-numba", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="one DDTree round's tree stages on synthetic drafter logits")
    demo.add_argument("--backend", choices=["auto", "numpy", "cuda"], default="auto",
                      help="auto: cuda when a real GPU is present, else numpy")
    demo.add_argument("--depths", type=int, default=6)
    demo.add_argument("--vocab", type=int, default=1000)
    demo.add_argument("--budget", type=int, default=24)
    demo.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "demo":
        return run_round_demo(_pick_backend(args.backend), args.depths, args.vocab, args.budget, args.seed)
    return 2


if __name__ == "__main__":
    sys.exit(main())
