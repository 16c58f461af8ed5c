"""The draft tree that DDTree builds, verifies and walks (docs/DESIGN.md §1).

Shape vocabulary: N tree nodes besides the root, L draft depths.
Node 0 is the root (the bonus token, already decided); nodes 1..N are numbered in
best-first pop order, so ``parents[i] < i`` for every i >= 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class Tree:
    """A best-first draft tree.

    tokens  [N]   int32    token id of node i is ``tokens[i - 1]`` (the root's token is the bonus)
    depths  [N]   int32    depth of node i is ``depths[i - 1]`` (1..L; the root has depth 0)
    parents [N+1] int32    ``parents[0] = -1``; ``0 <= parents[i] < i`` otherwise
    ranks   [N]   int32    rank of node i among its depth's top-K tokens (0 = the drafter's best)
    scores  [N]   float64  0.0 + the path's log-probs, accumulated in path order (so never -0.0)
    """

    tokens: np.ndarray
    depths: np.ndarray
    parents: np.ndarray
    ranks: np.ndarray
    scores: np.ndarray

    @property
    def num_nodes(self) -> int:
        """N, the number of drafted nodes (the root not counted)."""
        return int(self.tokens.shape[0])

    def path(self, node: int) -> list[int]:
        """Node ids from the root (0) down to ``node``."""
        out = []
        while node >= 0:
            out.append(int(node))
            node = int(self.parents[node])
        return out[::-1]

    def format(self, labels=None, accepted=None, root_label="<root>") -> str:
        """The tree as indented text, one node a line; nodes on the accepted path get a ``*``.

        ``labels`` maps a token id to a string (default: the id); ``accepted`` is ``keep``.
        """
        label = labels or str
        kids = [[] for _ in range(self.num_nodes + 1)]
        for i in range(1, self.num_nodes + 1):
            kids[int(self.parents[i])].append(i)
        marked = set() if accepted is None else {int(a) for a in accepted}
        lines = []

        def walk(node, prefix, last):
            text = root_label if node == 0 else (
                f"{label(int(self.tokens[node - 1]))}  (node {node}, rank {int(self.ranks[node - 1])}, "
                f"score {self.scores[node - 1]:.3f})")
            star = " *" if node in marked else ""
            branch = "" if node == 0 else ("`-- " if last else "|-- ")
            lines.append(prefix + branch + text + star)
            child_prefix = prefix + ("" if node == 0 else ("    " if last else "|   "))
            for k, c in enumerate(kids[node]):
                walk(c, child_prefix, k == len(kids[node]) - 1)

        walk(0, "", True)
        return "\n".join(lines)

    def __eq__(self, other) -> bool:
        """The same nodes in the same order, and the same scores bit for bit (a -0.0 score is
        not a +0.0 one: the builds promise the twin's bits, which ``np.array_equal`` of the
        values would not see)."""
        if not isinstance(other, Tree):
            return NotImplemented
        return all(
            np.array_equal(getattr(self, f), getattr(other, f))
            for f in ("tokens", "depths", "parents", "ranks")
        ) and self.scores.shape == other.scores.shape and np.array_equal(
            np.ascontiguousarray(self.scores, np.float64).view(np.uint64),
            np.ascontiguousarray(other.scores, np.float64).view(np.uint64))

    def __repr__(self) -> str:
        return f"Tree(N={self.num_nodes}, max_depth={int(self.depths.max(initial=0))})"

    def _repr_html_(self) -> str:
        """Jupyter: the tree as text (``format``); ``plots.draw_tree`` draws it."""
        import html
        return f"<pre>{html.escape(repr(self))}\n{html.escape(self.format())}</pre>"
