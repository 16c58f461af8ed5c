"""Matplotlib pictures of the DDTree stages, for notebooks and ``figures/`` (docs/DESIGN.md §1).
Drawing only: the tables and checks behind the acceptance figures are ``stats``'s.

Shapes: N tree nodes besides the root, L draft depths, K ranks per depth, n accepted nodes.

matplotlib is imported inside the functions, so importing the package does not pull it in.
Every helper draws into ``ax`` (a new figure when it is None) and returns the Axes. Artists carry
a ``gid`` (``"node"``, ``"node-id"``, ``"edge"``, ``"accepted-row"``, ``"topk-cell"``) so tests and
callers can find them.
"""

from __future__ import annotations

import numpy as np

from ._checks import check_int
from .stats import (acceptance_histogram, best_row, check_stats, depth_survival, launches_label, projected_tokens_per_s,
                    summary_rows)
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


# ----------------------------------------------------------------------------------------------
# acceptance statistics (the JSON of ``ddtree_numba.stats.acceptance_sweep``)
# ----------------------------------------------------------------------------------------------
CHAIN_COLOUR = "#3c6e9f"    # the DFlash chain
AR_COLOUR = "#555555"       # autoregressive decoding (the batch figures)
TREE_COLOUR = ACCEPT_COLOUR  # DDTree
SPECIAL_NAMES = {256: "<BOS>", 257: "<EOS>", 258: "<PAD>", 259: "<MASK>"}


def _tree_shades(n: int, lightest: float) -> list[tuple]:
    """n shades of ``TREE_COLOUR`` for DDTree's budgets, deeper as they grow: from ``lightest``
    of its strength (mixed with white) to the full colour."""
    import matplotlib.colors as mcolors
    base = np.array(mcolors.to_rgb(TREE_COLOUR))
    return [tuple(1 - s * (1 - base)) for s in np.linspace(lightest, 1.0, n)]


def byte_label(token: int) -> str:
    """A short printable label for a byte-level token (the demo pair's vocabulary): the character,
    with space, newline and tab drawn as visible marks; special ids by name; others in hex."""
    token = int(token)
    if token in SPECIAL_NAMES:
        return SPECIAL_NAMES[token]
    if token == 32:
        return "\u2423"          # open box
    if token == 10:
        return "\u23ce"          # return symbol
    if token == 9:
        return "\u21e5"          # tab arrow
    if 33 <= token < 127:
        return chr(token)
    return f"x{token:02x}"


def plot_acceptance_vs_budget(stats: dict, ax=None):
    """Mean acceptance length (tokens per verify round, bonus included) against the tree budget:
    DDTree per budget with the per-prompt range as a band, the DFlash chain as a dashed line."""

    rows = summary_rows(stats)
    tree = [r for r in rows if r["method"] == "ddtree"]
    chain = [r for r in rows if r["method"] == "dflash"]
    if not tree:
        raise ValueError("the statistics hold no ddtree runs")
    ax = _new_axes(ax, (6.0, 4.0))
    b = np.array([r["budget"] for r in tree])
    ax.fill_between(b, [r["prompt_min"] for r in tree], [r["prompt_max"] for r in tree], color=TREE_COLOUR,
                    alpha=0.15, lw=0, label="DDTree, per-prompt range")
    ax.plot(b, [r["mean_acceptance"] for r in tree], "o-", color=TREE_COLOUR, lw=2, label="DDTree", gid="ddtree")
    for r in tree:
        ax.annotate(f"{r['mean_acceptance']:.2f}", (r["budget"], r["mean_acceptance"]), xytext=(0, 7),
                    textcoords="offset points", ha="center", fontsize=8, color=TREE_COLOUR)
    if chain:
        c = chain[0]
        ax.axhline(c["mean_acceptance"], color=CHAIN_COLOUR, ls="--", lw=1.5, gid="dflash",
                   label=f"DFlash chain ({c['mean_acceptance']:.2f})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(b)
    ax.set_xticklabels([str(int(v)) for v in b])
    ax.set_xlabel("tree budget (drafted nodes verified per round)")
    ax.set_ylabel("mean acceptance length (tokens / verify round)")
    ax.set_ylim(bottom=1.0)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("acceptance length vs tree budget")
    return ax


def plot_batch_sweep(stats: dict, axes=None):
    """A ``stats.batch_sweep``: tokens/s against the batch size for ar and ddtree at each budget
    (left), and the distinct routed experts a verify forward's router picks per MoE layer (right):
    the reads a batch shares, which is where tree verification on an MoE target pays."""
    import matplotlib.pyplot as plt

    if stats.get("kind") != "batch_sweep" or not stats.get("rows"):
        raise ValueError("plot_batch_sweep needs the output of stats.batch_sweep")
    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(11.0, 4.0))
    left, right = axes
    configs = sorted({(r["method"], r["budget"] or 0) for r in stats["rows"]}, key=lambda c: (c[0] != "ar", c[1]))
    trees = [c for c in configs if c[0] != "ar"]
    shade = dict(zip(trees, _tree_shades(len(trees), 1.0 if len(trees) == 1 else 0.5)))
    for method, budget in configs:
        rows = sorted((r for r in stats["rows"] if r["method"] == method and (r["budget"] or 0) == budget),
                      key=lambda r: r["batch"])
        label = "AR" if method == "ar" else f"DDTree, budget {budget}"
        colour = AR_COLOUR if method == "ar" else shade[(method, budget)]
        b = [r["batch"] for r in rows]
        left.plot(b, [r["tokens_per_s"] for r in rows], "o-", label=label, color=colour)
        if rows[0]["unique_experts"] is not None:
            right.plot(b, [r["unique_experts"] for r in rows], "o-", label=label, color=colour)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(stats["batches"])
        ax.set_xticklabels([str(b) for b in stats["batches"]])
        ax.set_xlabel("sequences in flight (batch)")
        ax.grid(alpha=0.3)
    left.set_ylabel(f"tokens / s ({stats['backend']} backend, {stats['device']})")
    left.set_title("throughput vs batch")
    left.legend(fontsize=8)
    if stats.get("n_routed_experts"):
        right.axhline(stats["n_routed_experts"], color="grey", ls=":", lw=1, label="all routed experts")
    right.set_ylabel("distinct routed experts per MoE layer, per verify")
    right.set_title("experts a verify forward reads")
    right.legend(fontsize=8)
    return axes


def batch_caption(stats: dict) -> str:
    """The caption of ``plot_batch_sweep``'s figure of ``stats``: what ran, where, and what the
    tokens/s count."""
    ddtree = [b for b in stats.get("budgets", []) if b]
    experts = f" of {stats['n_routed_experts']}" if stats.get("n_routed_experts") else ""
    what = (f"Tokens/s against the batch (left) and the distinct routed experts{experts} a verify forward's router "
            f"picks per MoE layer (right), ar and DDTree at budget{'s' if len(ddtree) > 1 else ''} "
            f"{', '.join(str(b) for b in ddtree)}")
    if stats.get("source") == "benchmarks/batch.py":
        run = (f"the {stats.get('shape') or 'benchmark'} shape, random weights, whole batched rounds on the GPU: "
               "a DDTree round credited with the demo pair's measured mean acceptance (benchmarks/batch.py)")
    else:
        run = (f"the demo pair, {stats['prompts']} held-out prompts x {stats['max_new_tokens']} tokens, every prompt "
               f"at every batch size, the median of {stats.get('repeats', 1)} timed pass"
               f"{'es' if stats.get('repeats', 1) > 1 else ''}")
    where = ", ".join(str(x) for x in (stats.get("device"), stats.get("date"),
                                        stats.get("commit") and f"commit {stats['commit']}") if x)
    return f"{what}: {run}; {stats['backend']} backend ({where})."


def write_batch_figure(stats: dict, out_dir, name: str, command: str | None = None, dpi: int = 120) -> str:
    """Write ``plot_batch_sweep``'s figure of ``stats`` as ``name`` into ``out_dir`` and its
    section (``batch_caption``, the command) into the directory's ``README.md``, keeping the other
    figures' sections there. -> the caption."""
    import os

    from matplotlib.figure import Figure

    fig = Figure(figsize=(11.0, 4.0))
    plot_batch_sweep(stats, (fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)))
    fig.tight_layout()
    os.makedirs(out_dir, exist_ok=True)
    fig.savefig(os.path.join(out_dir, name), dpi=dpi)
    caption = batch_caption(stats)
    readme = os.path.join(out_dir, "README.md")
    sections = {}
    if os.path.exists(readme):
        with open(readme) as f:
            text = f.read()
        for part in text.split("\n## ")[1:]:
            sections[part.split("\n", 1)[0].strip()] = "## " + part.rstrip() + "\n"
    sections[name] = (f"## {name}\n\n![{name}]({name})\n\n{caption}\n"
                      + (f"\nMade by `{command}`.\n" if command else ""))
    with open(readme, "w") as f:
        f.write("# Batch figures\n\nEach made by `ddtree-numba plot` of a `sweep --batch` JSON or of a "
                "`benchmarks/batch.py` record (its section says which).\n\n" + "\n".join(sections[k] for k in sorted(sections)))
    return caption


def plot_depth_acceptance(stats: dict, ax=None, budgets=None, conditional: bool = False):
    """Per drafted depth d, the fraction of rounds that accepted at least d drafted tokens
    (``conditional=True``: the rate at depth d given d-1), for the DFlash chain and DDTree at
    ``budgets`` (default: three spread over the sweep)."""

    ax = _new_axes(ax, (6.0, 4.0))
    all_b = list(stats["budgets"])
    budgets = list(budgets) if budgets is not None else sorted({all_b[0], all_b[len(all_b) // 2], all_b[-1]})
    missing = [b for b in budgets if b not in all_b]
    if missing:
        raise ValueError(f"budgets {missing} are not in the sweep ({all_b})")
    curves = [("DFlash chain", "dflash", None, CHAIN_COLOUR, "--")]
    curves += [(f"DDTree {b}", "ddtree", b, shade, "-") for b, shade in zip(budgets, _tree_shades(len(budgets), 0.45))]
    for label, method, budget, colour, ls in curves:
        if not any(r["method"] == method for r in stats["runs"]):
            continue
        d, reached, cond = depth_survival(stats, method, budget)
        ax.plot(d, cond if conditional else reached, ls, marker="o", ms=3, color=colour, label=label, gid=method)
    ax.set_xlabel("drafted depth d")
    ax.set_ylabel("P(depth d accepted | d-1 accepted)" if conditional else "rounds accepting >= d drafted tokens")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("per-depth acceptance" + (" (conditional)" if conditional else ""))
    return ax


def plot_acceptance_histogram(stats: dict, budget: int | None = None, ax=None):
    """Distribution of acceptance lengths per round: DDTree at ``budget`` (default: the best
    budget of the sweep) beside the DFlash chain."""

    budget = budget if budget is not None else best_row(stats)["budget"]
    if budget not in stats["budgets"]:
        raise ValueError(f"budget {budget} is not in the sweep ({stats['budgets']})")
    ax = _new_axes(ax, (6.0, 4.0))
    width = 0.4
    for off, label, method, b, colour in ((-width / 2, "DFlash chain", "dflash", None, CHAIN_COLOUR),
                                          (width / 2, f"DDTree {budget}", "ddtree", budget, TREE_COLOUR)):
        if not any(r["method"] == method for r in stats["runs"]):
            continue
        x, frac = acceptance_histogram(stats, method, b)
        ax.bar(x + off, frac, width=width, color=colour, label=label, gid=method)
    ax.set_xlabel("acceptance length (tokens accepted per verify round, bonus included)")
    ax.set_ylabel("fraction of rounds")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    ax.set_title("acceptance lengths per round")
    return ax


def example_tree(example: dict, max_nodes: int | None = 24) -> tuple[Tree, list[int]]:
    """(Tree, accepted path) of one traced round from ``stats["examples"]``, cut to its first
    ``max_nodes`` nodes in pop order plus the accepted path (None: the whole tree). Pop order is
    best-first, so every kept node's parent is kept; node ids are renumbered in that order."""
    parents = np.asarray(example["parents"], np.int64)
    keep = [int(k) for k in example["keep"]]
    n = parents.shape[0] - 1
    if max_nodes is not None:
        max_nodes = check_int("max_nodes", max_nodes, 0)
    chosen = set(range(n + 1)) if max_nodes is None else set(range(min(n, max_nodes) + 1)) | set(keep)
    order = sorted(chosen)
    new_id = {old: i for i, old in enumerate(order)}
    sel = np.array(order[1:], np.int64) - 1                                  # node i -> array index i-1
    tree = Tree(tokens=np.asarray(example["tokens"], np.int32)[sel],
                depths=np.asarray(example["depths"], np.int32)[sel],
                parents=np.array([-1] + [new_id[int(parents[o])] for o in order[1:]], np.int32),
                ranks=np.asarray(example["ranks"], np.int32)[sel],
                scores=np.asarray(example["scores"], np.float64)[sel])
    return tree, [new_id[k] for k in keep]


def plot_example_tree(example: dict, ax=None, max_nodes: int | None = 24, labels=byte_label):
    """One traced DDTree round: the draft tree (first ``max_nodes`` nodes in pop order plus the
    accepted path) with the accepted path highlighted; the root shows the round's bonus token."""
    tree, keep = example_tree(example, max_nodes)
    ax = draw_tree(tree, accepted=keep, ax=ax, labels=labels, root_label=labels(example["bonus"]))
    shown = "" if tree.num_nodes == len(example["tokens"]) else f" (first {tree.num_nodes} shown)"
    ax.set_title(f"round {example['round']}, budget {example['budget']}: {len(example['tokens'])} nodes{shown}, "
                 f"accepted {len(keep) - 1} drafted + bonus")
    return ax


def plot_cost_vs_budget(stats: dict, verify_bench: dict | None = None, axes=None):
    """The cost side of the budget: verify time per round and tokens/s against the budget.

    stats         a sweep run on the GPU (``backend == "cuda"``): the demo pair's measured verify
                  time per round and end-to-end tokens/s at each budget
    verify_bench  optional ``{"label": str, "nodes": [..], "ms": [..]}`` verify-forward times of a
                  larger target (``benchmarks/verify_forward.py --json``; ``nodes`` counts the rows
                  verified, the root included, so R rows are a tree of budget R - 1 and are drawn
                  there). Its tokens/s is projected as the demo pair's mean acceptance length at
                  that budget over (its verify time + the demo pair's other per-round stages), both
                  interpolated in log budget between the sweep's budgets (and held at the end
                  values outside them); marked "projected"
    axes          two Axes (verify time, tokens/s); new ones when None. Returns them.
    """
    rows = [r for r in summary_rows(stats) if r["method"] == "ddtree"]
    if not rows:
        raise ValueError("the statistics hold no ddtree runs")
    if stats.get("graph") not in (False, "stages") or not all(r["verify_ms"] > 0 for r in rows):
        raise ValueError(f"the GPU sweep did not time its verify stage apart ({launches_label(stats)}, "
                         f"timed as a whole): sweep with --stage-graphs (or --eager) for the cost figure")
    if axes is None:
        import matplotlib.pyplot as plt
        axes = plt.subplots(1, 2, figsize=(11.0, 4.0))[1]
    ax_t, ax_s = axes
    b = np.array([r["budget"] for r in rows])
    dev = stats.get("device", stats.get("backend", ""))
    ax_t.plot(b, [r["verify_ms"] for r in rows], "o-", color=TREE_COLOUR, label=f"demo pair ({dev})", gid="verify")
    ax_s.plot(b, [r["tokens_per_s"] for r in rows], "o-", color=TREE_COLOUR, label="demo pair, measured",
              gid="tokens-per-s")
    ar = [r for r in summary_rows(stats) if r["method"] == "ar"]
    if ar:
        ax_s.axhline(ar[0]["tokens_per_s"], color="#777777", ls=":", label="demo pair, ar")
    if verify_bench is not None:
        x, y = projected_tokens_per_s(stats, verify_bench)
        ms = np.asarray(verify_bench["ms"], np.float64)
        label = verify_bench.get("label", "benchmark")
        ax_t.plot(x, ms, "s-", color=CHAIN_COLOUR, label=label, gid="bench")
        ax_s.plot(x, y, "s--", color=CHAIN_COLOUR, label=f"{label}, projected", gid="projected")
    for ax in (ax_t, ax_s):
        ax.set_xscale("log", base=2)
        ax.set_xticks(b)
        ax.set_xticklabels([str(int(v)) for v in b])
        ax.set_xlabel("tree budget")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("verify forward per round (ms)")
    ax_t.set_title("verify cost vs budget")
    ax_s.set_ylabel("generated tokens / s")
    ax_s.set_title("throughput vs budget")
    return axes


def _prompts_text(stats) -> str:
    """'8 held-out prompts x 128 greedy tokens' (held out: every prompt names its module)."""
    held = all(p.get("module") for p in stats["prompts"])
    return f"{len(stats['prompts'])} {'held-out ' if held else ''}prompts x {stats['max_new_tokens']} greedy tokens"


def write_figures(stats: dict, out_dir, cost_stats: dict | None = None, verify_bench: dict | None = None,
                  command: str | None = None, dpi: int = 120) -> list[tuple[str, str]]:
    """Write every acceptance figure as PNG into ``out_dir``, with a ``README.md`` that gives each
    figure's caption and the command that made it. ``cost_stats``: a GPU sweep for the cost
    figure (and ``verify_bench`` for the larger target's curve); without it that figure is left
    out. Returns [(file name, caption)]."""
    import os

    from matplotlib.figure import Figure        # no pyplot: no GUI backend, no global figure state


    check_stats(stats)
    if cost_stats is not None:
        check_stats(cost_stats, "cost statistics")
        if cost_stats["backend"] != "cuda":
            raise ValueError(f"the cost figure needs a sweep run on the GPU (backend cuda), got {cost_stats['backend']}")
    if verify_bench is not None:
        if cost_stats is None:
            raise ValueError("verify_bench is drawn in the cost figure: give the GPU sweep (cost_stats) too")
        projected_tokens_per_s(cost_stats, verify_bench)          # its ValueError names a bad file
    os.makedirs(out_dir, exist_ok=True)
    best = best_row(stats)
    chain = [r for r in summary_rows(stats) if r["method"] == "dflash"]
    where = f"{_prompts_text(stats)}, {stats['backend']} backend ({stats['device']}, {stats['date']})"
    chain_text = f" ({chain[0]['mean_acceptance']:.2f})" if chain else ""
    written = []

    def save(name, draw, size, caption):
        fig = Figure(figsize=size)
        draw(fig)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, name), dpi=dpi)
        written.append((name, caption))

    save("acceptance_vs_budget.png", lambda f: plot_acceptance_vs_budget(stats, f.add_subplot()), (6.4, 4.2),
         f"Mean acceptance length (tokens accepted per verify round, bonus included) against the tree budget, DDTree "
         f"against the DFlash chain{chain_text}; the band "
         f"is the per-prompt range. Best: {best['mean_acceptance']:.2f} at budget {best['budget']}. {where}.")
    save("depth_acceptance.png", lambda f: plot_depth_acceptance(stats, f.add_subplot()), (6.4, 4.2),
         f"Fraction of rounds that accepted at least d drafted tokens, per depth d. {where}.")
    save("acceptance_histogram.png", lambda f: plot_acceptance_histogram(stats, best["budget"], f.add_subplot()),
         (6.4, 4.2), f"Acceptance lengths per round at budget {best['budget']} and for the DFlash chain. {where}.")
    for k, ex in enumerate(stats.get("examples", [])[:2]):
        save(f"example_tree_{k + 1}.png", lambda f, ex=ex: plot_example_tree(ex, f.add_subplot()), (12.0, 7.0),
             f"Round {ex['round']} of the first prompt at budget {ex['budget']}: the draft tree's first nodes in "
             f"pop order (node ids above the boxes) and the accepted path in red; byte tokens drawn as "
             f"characters (\u2423 space, \u23ce newline).")
    if cost_stats is not None:
        label = verify_bench.get("label", "benchmark") if verify_bench else None
        save("cost_vs_budget.png",
             lambda f: plot_cost_vs_budget(cost_stats, verify_bench, (f.add_subplot(1, 2, 1), f.add_subplot(1, 2, 2))),
             (11.5, 4.2),
             f"Left: verify forward per round against the budget, the demo pair on "
             f"{cost_stats['device']} ({cost_stats['date']})" + (f" and {label}" if label else "") + ". "
             f"Right: generated tokens/s, the demo pair measured end to end (every round on the GPU, "
             f"{launches_label(cost_stats)})"
             + (f"; for {label}, projected as the demo pair's acceptance length over that verify time plus the "
                f"demo pair's other stages (its R verified rows are a tree of budget R - 1; the demo pair's "
                f"figures are interpolated in log budget, held at budget {cost_stats['budgets'][0]}'s below it)"
                if label else "") + ".")
    lines = ["# Figures", ""]
    if command:
        lines += [f"Made by `{command}`.", ""]
    made = [("acceptance statistics", stats), ("GPU sweep", cost_stats)]
    lines += [f"The {what}: `{s['command']}` ({s['backend']} backend, {s['device']}, {s['date']})."
              for what, s in made if s is not None and s.get("command")]
    if verify_bench is not None:
        lines.append(f"The larger target's verify times: `benchmarks/verify_forward.py --json` "
                     f"({verify_bench.get('device', '?')}, commit {verify_bench.get('commit', '?')}, "
                     f"{verify_bench.get('date', '?')}).")
    lines.append("")
    for name, caption in written:
        lines += [f"## {name}", "", f"![{name}]({name})", "", caption, ""]
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write("\n".join(lines))
    return written
