"""The plot helpers draw one artist per node and edge, and highlight exactly the accepted path."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import same_color  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from ddtree_numba import reference as ref  # noqa: E402
from ddtree_numba.plots import (  # noqa: E402
    ACCEPT_COLOUR, draw_tree, show_topk, show_visibility, tree_layout)


def _small_tree(seed=3, L=4, V=9, budget=14):
    logits = np.random.default_rng(seed).normal(0, 2, (L, V)).astype(np.float32)
    lp, ids = ref.topk_logprobs(logits, min(budget, V))
    return lp, ids, ref.build_tree(lp, ids, budget)


def _axes():
    return Figure().add_subplot()   # no pyplot state


def _by_gid(ax, gid):
    return [a for a in ax.get_children() if a.get_gid() == gid]


def _node_at(tree):
    xy = tree_layout(tree)
    return {(float(x), float(y)): i for i, (x, y) in enumerate(xy)}


def _accepted_path(tree):
    """The root-to-node path of the deepest node that is not on the rank-0 branch."""
    off = [i for i in range(1, tree.num_nodes + 1) if tree.ranks[i - 1] != 0]
    node = max(off, key=lambda i: (tree.depths[i - 1], -i))
    return np.asarray(tree.path(node), np.int32)


def test_layout_is_tidy():
    _, _, tree = _small_tree()
    xy = tree_layout(tree)                                           # [N+1, 2]
    assert xy.shape == (tree.num_nodes + 1, 2)
    assert np.array_equal(xy[1:, 0], tree.depths) and xy[0, 0] == 0
    assert len({tuple(p) for p in xy}) == len(xy), "two nodes share a position"
    # each node's subtree occupies one contiguous band of rows, its parent inside the band,
    # and siblings in rank order top-down
    for p in range(tree.num_nodes + 1):
        kids = [i for i in range(1, tree.num_nodes + 1) if tree.parents[i] == p]
        ys = [xy[k, 1] for k in sorted(kids, key=lambda k: tree.ranks[k - 1])]
        assert ys == sorted(ys)
        if kids:
            assert min(ys) <= xy[p, 1] <= max(ys)


def test_layout_of_a_deep_chain():
    lp = np.full((40, 1), -0.1, np.float32)
    tree = ref.build_tree(lp, np.zeros((40, 1), np.int32), 40)
    xy = tree_layout(tree)
    assert np.array_equal(xy[:, 0], np.arange(41)) and not xy[:, 1].any()


def test_draw_tree_counts_nodes_and_edges():
    _, _, tree = _small_tree()
    n = tree.num_nodes
    ax = draw_tree(tree, ax=_axes())
    nodes, edges = _by_gid(ax, "node"), _by_gid(ax, "edge")
    assert len(nodes) == n + 1 and len(edges) == n
    assert len(_by_gid(ax, "node-id")) == n + 1
    at = _node_at(tree)
    drawn = set()
    for line in edges:
        (x0, x1), (y0, y1) = line.get_xdata(), line.get_ydata()
        drawn.add((at[(float(x0), float(y0))], at[(float(x1), float(y1))]))
    assert drawn == {(int(tree.parents[i]), i) for i in range(1, n + 1)}
    assert not any(same_color(e.get_color(), ACCEPT_COLOUR) for e in edges)


def test_draw_tree_labels():
    _, _, tree = _small_tree()
    ax = draw_tree(tree, ax=_axes(), labels=lambda t: f"<{t}>", root_label="b")
    at = _node_at(tree)
    got = {at[tuple(map(float, t.get_position()))]: t.get_text() for t in _by_gid(ax, "node")}
    assert got == {0: "b", **{i: f"<{tree.tokens[i - 1]}>" for i in range(1, tree.num_nodes + 1)}}


def test_draw_tree_highlights_exactly_the_accepted_path():
    _, _, tree = _small_tree()
    keep = _accepted_path(tree)
    assert len(keep) >= 3
    ax = draw_tree(tree, accepted=keep, ax=_axes())
    at = _node_at(tree)
    hot_nodes = {at[tuple(map(float, t.get_position()))] for t in _by_gid(ax, "node")
                 if same_color(t.get_bbox_patch().get_facecolor(), ACCEPT_COLOUR)}
    assert hot_nodes == set(keep.tolist())
    hot_edges = set()
    for line in _by_gid(ax, "edge"):
        if same_color(line.get_color(), ACCEPT_COLOUR):
            (x0, x1), (y0, y1) = line.get_xdata(), line.get_ydata()
            hot_edges.add((at[(float(x0), float(y0))], at[(float(x1), float(y1))]))
    assert hot_edges == set(zip(keep[:-1].tolist(), keep[1:].tolist()))


def test_draw_tree_rejects_a_non_path():
    _, _, tree = _small_tree()
    siblings = [i for i in range(1, tree.num_nodes + 1) if tree.parents[i] == 0][:2]
    assert len(siblings) == 2
    for bad in ([1, 2], [0, tree.num_nodes + 1], [0, *siblings]):
        with pytest.raises(ValueError, match="accepted"):
            draw_tree(tree, accepted=np.asarray(bad, np.int32), ax=_axes())


def test_show_visibility():
    _, _, tree = _small_tree()
    vis = ref.visibility(tree.parents)
    keep = _accepted_path(tree)
    ax = show_visibility(vis, ax=_axes(), accepted=keep)
    (im,) = ax.get_images()
    assert np.array_equal(np.asarray(im.get_array()), vis)
    rows = sorted(r.get_y() + 0.5 for r in _by_gid(ax, "accepted-row"))
    assert rows == sorted(keep.tolist())
    with pytest.raises(ValueError):
        show_visibility(vis.astype(np.int32), ax=_axes())


def test_show_topk():
    lp, ids, _ = _small_tree()
    ax = show_topk(lp, ids, ax=_axes(), labels=lambda t: f"t{t}")
    (im,) = ax.get_images()
    assert np.array_equal(np.asarray(im.get_array()), lp)
    cells = _by_gid(ax, "topk-cell")
    assert len(cells) == lp.size
    assert cells[0].get_text() == f"t{ids[0, 0]}\n{lp[0, 0]:.2f}"


def test_new_figures_render_to_png():
    lp, ids, tree = _small_tree()
    keep = _accepted_path(tree)
    for ax in (draw_tree(tree, accepted=keep), show_visibility(ref.visibility(tree.parents)),
               show_topk(lp, ids)):
        buf = io.BytesIO()
        ax.figure.savefig(buf, format="png")
        assert buf.getvalue()[:8] == b"\x89PNG\r\n\x1a\n"
        plt.close(ax.figure)
