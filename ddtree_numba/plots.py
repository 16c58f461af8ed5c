"""Matplotlib pictures of the DDTree stages, for notebooks and ``figures/`` (DESIGN.md section 1).

Shapes: N tree nodes besides the root, L draft depths, K ranks per depth, n accepted nodes.

Only numpy and matplotlib; matplotlib is imported inside the functions, so importing the
package does not pull it in. Every helper draws into ``ax`` (a new figure when it is None)
and returns the Axes. Artists carry a ``gid`` (``"node"``, ``"node-id"``, ``"edge"``,
``"accepted-row"``, ``"topk-cell"``) so tests and callers can find them.
"""

from __future__ import annotations

import numpy as np

from .tree import Tree

ACCEPT_COLOUR = "#d1495b"   # the accepted path: strong, readable on white and on the mask
NODE_EDGE = "#4a4a4a"
EDGE_COLOUR = "#9a9a9a"
ROOT_FACE = "#e8e8e8"


def _new_axes(ax, size):
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt   # a pyplot figure is what a notebook displays

    return plt.subplots(figsize=size)[1]


def _check_accepted(accepted, parents) -> list[int]:
    """The accepted path as a list of node ids; it must run from the root along tree edges."""
    if accepted is None:
        return []
    keep = [int(k) for k in np.asarray(accepted).ravel()]
    if not keep or keep[0] != 0:
        raise ValueError("accepted must start at the root (accepted[0] = 0)")
    n = len(parents)
    for a, b in zip(keep, keep[1:]):
        if not 0 < b < n or int(parents[b]) != a:
            raise ValueError(f"accepted is not a tree path: node {b} is not a child of node {a}")
    return keep


def tree_layout(tree: Tree) -> np.ndarray:
    """Tidy coordinates for every node: x = depth, y = row (0 at the top).

    tree with N nodes -> xy [N+1, 2] float64. Children are ordered by rank, leaves take
    consecutive rows in depth-first order and a parent sits midway between its first and
    last child, so siblings sit together and no edges cross.
    """
    parents = np.asarray(tree.parents)
    n = parents.shape[0]
    children = [[] for _ in range(n)]
    for i in range(1, n):
        children[int(parents[i])].append(i)
    for c in children:
        c.sort(key=lambda i: (int(tree.ranks[i - 1]), i))
    xy = np.zeros((n, 2))
    xy[1:, 0] = tree.depths
    next_row = 0.0
    # iterative post-order walk: a deep chain (depth 32) must not hit the recursion limit
    stack = [(0, False)]
    while stack:
        node, done = stack.pop()
        if not children[node]:
            xy[node, 1] = next_row
            next_row += 1.0
        elif done:
            xy[node, 1] = 0.5 * (xy[children[node][0], 1] + xy[children[node][-1], 1])
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in reversed(children[node]))
    return xy


def draw_tree(tree: Tree, accepted=None, ax=None, labels=None, root_label="root",
              fontsize=9):
    """Draw a draft tree: one box per node (its token), one line per parent -> child edge.

    tree with N nodes; accepted [n] int (optional; ``keep`` from ``follow_tree``, drawn in a
    strong colour); labels: token id -> str (default ``str``). Depth runs left to right,
    siblings stack top-down in rank order; the small grey number above each box is the node id
    (its pop order). Returns the Axes; it holds N+1 ``"node"`` texts and N ``"edge"`` lines.
    """
    if not isinstance(tree, Tree):
        raise ValueError(f"tree must be a Tree, got {type(tree).__name__}")
    parents = np.asarray(tree.parents)
    keep = _check_accepted(accepted, parents)
    on_path = set(keep)
    path_edges = set(zip(keep, keep[1:]))
    labels = labels if labels is not None else str
    xy = tree_layout(tree)                                            # [N+1, 2]
    n = parents.shape[0]
    depth = int(xy[:, 0].max())
    rows = int(xy[:, 1].max()) + 1
    ax = _new_axes(ax, (1.6 + 1.5 * depth, 0.8 + 0.42 * rows))

    for i in range(1, n):
        p = int(parents[i])
        hot = (p, i) in path_edges
        ax.plot([xy[p, 0], xy[i, 0]], [xy[p, 1], xy[i, 1]], gid="edge",
                color=ACCEPT_COLOUR if hot else EDGE_COLOUR, lw=2.8 if hot else 1.1,
                zorder=2 if hot else 1, solid_capstyle="round")
    for i in range(n):
        hot = i in on_path
        text = root_label if i == 0 else labels(int(tree.tokens[i - 1]))
        face = ACCEPT_COLOUR if hot else (ROOT_FACE if i == 0 else "white")
        ax.text(xy[i, 0], xy[i, 1], text, gid="node", ha="center", va="center",
                fontsize=fontsize, color="white" if hot else "black",
                fontweight="bold" if hot else "normal", zorder=3,
                bbox=dict(boxstyle="round,pad=0.3", fc=face,
                          ec=ACCEPT_COLOUR if hot else NODE_EDGE, lw=1.5 if hot else 0.8))
        ax.annotate(str(i), (xy[i, 0], xy[i, 1]), xytext=(0, 0.9 * fontsize),
                    textcoords="offset points", gid="node-id", ha="center", va="bottom",
                    fontsize=fontsize - 2, color="#777777", zorder=3)

    ax.set_xlim(-0.5, depth + 0.5)
    ax.set_ylim(rows - 0.4, -0.7)                                     # row 0 at the top
    ax.set_xticks(range(depth + 1))
    ax.set_xticklabels(["root"] + [f"d={d}" for d in range(1, depth + 1)])
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    ax.set_title(f"draft tree: {n - 1} nodes"
                 + (f", accepted {len(keep) - 1}" if keep else ""))
    return ax


def show_visibility(vis, ax=None, accepted=None):
    """The tree-attention mask as an image: row i (query node) sees column j where true.

    vis [N+1, N+1] bool (from ``visibility``); accepted [n] int (optional): those rows
    are outlined and their tick labels coloured. Returns the Axes.
    """
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Rectangle

    vis = np.asarray(vis)
    if vis.ndim != 2 or vis.shape[0] != vis.shape[1] or vis.dtype != np.bool_:
        raise ValueError(f"vis must be a square bool matrix, got {vis.dtype} {vis.shape}")
    n = vis.shape[0]
    keep = [int(k) for k in np.asarray(accepted).ravel()] if accepted is not None else []
    if any(not 0 <= k < n for k in keep):
        raise ValueError(f"accepted holds a node outside 0..{n - 1}")
    ax = _new_axes(ax, (1.5 + 0.3 * n, 1.2 + 0.3 * n))
    ax.imshow(vis, cmap=ListedColormap(["#f4f4f4", "#2e5c8a"]), vmin=0, vmax=1,
              interpolation="nearest")
    for k in keep:
        ax.add_patch(Rectangle((-0.5, k - 0.5), n, 1, fill=False, ec=ACCEPT_COLOUR, lw=2,
                               gid="accepted-row", clip_on=False))
    step = 1 if n <= 40 else int(np.ceil(n / 40))
    ticks = np.arange(0, n, step)
    ax.set_xticks(ticks)
    ax.set_yticks(ticks)
    ax.tick_params(labelsize=7)
    for lab in ax.get_yticklabels() + ax.get_xticklabels():
        if int(lab.get_text() or -1) in keep:
            lab.set_color(ACCEPT_COLOUR)
            lab.set_fontweight("bold")
    ax.set_xlabel("key node j")
    ax.set_ylabel("query node i")
    ax.set_title("visibility: j is i or an ancestor of i")
    return ax


def show_topk(lp, ids, ax=None, labels=None):
    """The drafter's top-K per depth as a heatmap of log-probs, each cell naming its token.

    lp [L, K] float32 (rows descending), ids [L, K] int32, labels: token id -> str
    (default ``str``). Row d-1 is depth d, column r is rank r. Returns the Axes.
    """
    lp = np.asarray(lp)
    ids = np.asarray(ids)
    if lp.ndim != 2 or ids.shape != lp.shape:
        raise ValueError(f"lp and ids must be 2-D of one shape, got {lp.shape} and {ids.shape}")
    labels = labels if labels is not None else str
    L, K = lp.shape
    ax = _new_axes(ax, (1.5 + 0.95 * K, 0.9 + 0.55 * L))
    finite = lp[np.isfinite(lp)]
    lo = float(finite.min()) if finite.size else -1.0
    im = ax.imshow(lp, cmap="viridis", vmin=min(lo, -1e-3), vmax=0.0, aspect="auto",
                   interpolation="nearest")
    for d in range(L):
        for r in range(K):
            light = not np.isfinite(lp[d, r]) or lp[d, r] < 0.55 * lo
            ax.text(r, d, f"{labels(int(ids[d, r]))}\n{lp[d, r]:.2f}", gid="topk-cell",
                    ha="center", va="center", fontsize=7,
                    color="white" if light else "black")
    ax.set_xticks(range(K))
    ax.set_yticks(range(L))
    ax.set_yticklabels([f"d={d}" for d in range(1, L + 1)])
    ax.set_xlabel("rank")
    ax.set_title("top-K log-probs per depth")
    ax.figure.colorbar(im, ax=ax, label="log p", fraction=0.03, pad=0.02)
    return ax
