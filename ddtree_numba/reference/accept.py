"""Tree acceptance (DESIGN.md section 1, step 6): the target's own choice at every node,
then the walk down the tree that follows it.

Shapes: N+1 tree nodes (root included), V vocabulary, n accepted nodes (root included).

``sample_post`` draws with the Gumbel-max trick from a counter-based hash of
``(seed, row, token)``: each draw is a pure function of its indices, so the numpy twin and
the kernel draw the same tokens, and ``argmax(logits / T + gumbel)`` is an exact sample
of ``softmax(logits / T)``.
"""

from __future__ import annotations

import numpy as np

from .._checks import check_array, check_int, check_logits_values, check_parents_values, is_host
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


def uniform_open(seed: int, row: np.ndarray, col: np.ndarray) -> np.ndarray:
    """A float64 in (0, 1) for each (seed, row, col): 53 hashed bits, centred in their cell."""
    with np.errstate(over="ignore"):
        h = splitmix64(np.uint64(seed) ^ splitmix64(
            (row.astype(np.uint64) << np.uint64(32)) | col.astype(np.uint64)))
    return ((h >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / 9007199254740992.0)


def _check_sample_inputs(logits, temperature, seed) -> tuple[float, int]:
    check_array("logits", logits, 2, np.float32)
    check_logits_values("logits", logits)
    temperature = float(temperature)
    if not temperature >= 0.0 or not np.isfinite(temperature):
        raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
    return temperature, check_int("seed", seed, 0, 2**64 - 1)


def sample_post(logits: np.ndarray, temperature: float, seed: int) -> np.ndarray:
    """The target's token at every tree node: argmax at T = 0, else a seeded sample.

    logits [N+1, V] float32 -> post [N+1] int32. At T > 0 the draw is
    ``argmax_v(logits[i, v] / T - log(-log(u(seed, i, v))))`` in float64; ties go to the
    lower token id in both cases.
    """
    temperature, seed = _check_sample_inputs(logits, temperature, seed)
    if temperature == 0.0:
        return logits.argmax(axis=1).astype(np.int32)
    n, v = logits.shape
    row, col = np.meshgrid(np.arange(n), np.arange(v), indexing="ij")  # [N+1, V]
    gumbel = -np.log(-np.log(uniform_open(seed, row, col)))            # [N+1, V]
    return (logits.astype(np.float64) / temperature + gumbel).argmax(axis=1).astype(np.int32)


def _check_follow_inputs(tree: Tree, post):
    if not isinstance(tree, Tree):
        raise ValueError(f"tree must be a Tree, got {type(tree).__name__}")
    n = tree.num_nodes
    check_array("tree.parents", tree.parents, 1, np.int32, shape=(n + 1,))
    check_array("tree.tokens", tree.tokens, 1, np.int32, shape=(n,))
    check_parents_values(tree.parents)
    check_array("post", post, 1, np.int32)
    if post.shape[0] < n + 1:
        raise ValueError(f"post has {post.shape[0]} entries; the tree has {n + 1} nodes")
    if post.shape[0] > n + 1:
        raise ValueError(f"post has {post.shape[0]} entries, more than the tree's {n + 1} nodes")
    if is_host(post) and (post < 0).any():
        raise ValueError("post holds a negative token id")


def follow_tree(tree: Tree, post: np.ndarray) -> tuple[np.ndarray, int]:
    """Walk from the root while the current node has a child holding ``post[current]``.

    tree with N nodes, post [N+1] int32 -> (keep [n] int32 with keep[0] = 0, strictly
    increasing; bonus = post[keep[-1]]). Children carry larger ids than their parent, so
    one pass over the nodes in id order finds the whole path; siblings hold distinct
    tokens, so the matching child is unique.
    """
    _check_follow_inputs(tree, post)
    keep = [0]
    for j in range(1, tree.num_nodes + 1):
        if tree.parents[j] == keep[-1] and tree.tokens[j - 1] == post[keep[-1]]:
            keep.append(j)
    return np.asarray(keep, np.int32), int(post[keep[-1]])
