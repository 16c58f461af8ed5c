"""Tree acceptance (docs/DESIGN.md §1, step 6): the target's own choice at every node,
then the walk down the tree that follows it.

Shapes: N+1 tree nodes (root included), V vocabulary, n accepted nodes (root included).

``sample_post`` draws with the Gumbel-max trick from a counter-based hash of
``(seed, row, token)``: each draw is a pure function of its indices, so the numpy twin and
the kernel draw the same tokens, and ``argmax(logits / T + gumbel)`` is an exact sample
of ``softmax(logits / T)``.
"""

from __future__ import annotations

import numpy as np

from .._checks import check_follow_inputs, check_sample_inputs
from ..tree import Tree

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser on uint64 (wrapping arithmetic)."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


def round_seed(seed: int, r: int) -> int:
    """The sampling seed of round r (0 = the prefill): splitmix64 of (seed, r), so rounds draw
    independent tokens and ``sample_post``'s draws stay a pure function of (seed, round, node, token)."""
    with np.errstate(over="ignore"):
        return int(splitmix64(np.uint64(seed) ^ splitmix64(np.uint64(r))))


def enqueue_round_seed(seed, rounds, out, *, stream=0) -> None:
    """out[0] = round_seed(seed[0], rounds[0]); twin of ``kernels.accept.enqueue_round_seed`` (its
    signature, numpy arrays). seed [1] uint64, rounds [>= 1] int32, out [1] uint64."""
    out[0] = np.uint64(round_seed(int(seed[0]), int(rounds[0])))


def uniform_open(seed: int, row: np.ndarray, col: np.ndarray) -> np.ndarray:
    """A float64 in (0, 1) for each (seed, row, col): 53 hashed bits, centred in their cell."""
    with np.errstate(over="ignore"):
        h = splitmix64(np.uint64(seed) ^ splitmix64(
            (row.astype(np.uint64) << np.uint64(32)) | col.astype(np.uint64)))
    return ((h >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / 9007199254740992.0)


def sample_post(logits: np.ndarray, temperature: float, seed: int) -> np.ndarray:
    """The target's token at every tree node: argmax at T = 0, else a seeded sample.

    logits [N+1, V] float32 -> post [N+1] int32. At T > 0 the draw is
    ``argmax_v(logits[i, v] / T - log(-log(u(seed, i, v))))`` in float64; ties go to the
    lower token id in both cases.
    """
    temperature, seed = check_sample_inputs(logits, temperature, seed)
    if temperature == 0.0:
        return logits.argmax(axis=1).astype(np.int32)
    n, v = logits.shape
    row, col = np.meshgrid(np.arange(n), np.arange(v), indexing="ij")  # [N+1, V]
    gumbel = -np.log(-np.log(uniform_open(seed, row, col)))            # [N+1, V]
    return (logits.astype(np.float64) / temperature + gumbel).argmax(axis=1).astype(np.int32)


def follow_tree(tree: Tree, post: np.ndarray) -> tuple[np.ndarray, int]:
    """Walk from the root while the current node has a child holding ``post[current]``.

    tree with N nodes, post [N+1] int32 -> (keep [n] int32 with keep[0] = 0, strictly
    increasing; bonus = post[keep[-1]]). Children carry larger ids than their parent, so
    one pass over the nodes in id order finds the whole path; siblings hold distinct
    tokens, so the matching child is unique.
    """
    check_follow_inputs(tree, post)
    keep = [0]
    for j in range(1, tree.num_nodes + 1):
        if tree.parents[j] == keep[-1] and tree.tokens[j - 1] == post[keep[-1]]:
            keep.append(j)
    return np.asarray(keep, np.int32), int(post[keep[-1]])


def follow_trees(trees: list, post: np.ndarray, seqs: np.ndarray) -> list:
    """``follow_tree`` of each tree of a batch, as ``kernels.follow_trees`` walks them: trees S
    ``Tree``s, post [R] int32 the target's token at every verify row of the batch, seqs [S, 4]
    int32 = (cache rows, t, row0, slot) a tree (its node i verified at row row0 + i). -> a (keep,
    bonus) a tree; a tree with t = 0 (a finished sequence) is not walked: (keep [0], 0)."""
    out = []
    for tree, (_, t, row0, _) in zip(trees, np.asarray(seqs)):
        if t == 0:
            out.append((np.zeros(0, np.int32), 0))
        else:
            out.append(follow_tree(tree, np.asarray(post)[row0:row0 + tree.num_nodes + 1]))
    return out
