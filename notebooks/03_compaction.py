# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Compacting the cache after acceptance, and why the obvious kernel races
#
# docs/DESIGN.md §1, step 7: the verify forward wrote one cache row per tree node at
# `start … start + N`; once the accepted path `keep` is known, row `start + keep[i]` moves to
# `start + i` and everything after `start + len(keep)` is free again. The twin
# `ref.compact_rows` is one fancy-index gather. On a GPU it is where parallel code goes wrong:
#
# 1. why `keep[i] >= i` always holds;
# 2. the naive one-thread-per-row in-place gather, replayed thread by thread in two orders;
# 3. which thread orders are safe, out of all of them;
# 4. the two safe schemes (columns walking in increasing `i`; gather to scratch, copy back);
# 5. compaction on a real MLA latent cache: decoding the leaf again gives the path's logits.
#
# Everything is numpy and runs on the CPU in seconds.

# %%
import itertools
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

import ddtree_numba as dd
from ddtree_numba import reference as ref
from ddtree_numba.plots import ACCEPT_COLOUR, draw_tree

np.set_printoptions(linewidth=110)

# %% [markdown]
# ## 1 · `keep[i] >= i`
#
# Nodes are numbered in pop order, so a child always has a larger id than its parent
# (`parents[i] < i`). The accepted path walks from the root down parent-to-child edges, so
# `keep = [0, …]` is strictly increasing, and a strictly increasing sequence of integers that
# starts at 0 satisfies `keep[i] >= i` (by induction: `keep[i] >= keep[i-1] + 1 >= i`).
#
# The loop below checks it on 2000 random trees: random drafter logits of random sharpness, a
# random budget, and a target that at each node follows its first-popped child with probability
# 0.6, another child with probability 0.3, and otherwise picks any token.

# %%
rng = np.random.default_rng(0)


def random_round(rng, vocab=24, depths=6):
    """A random tree and the accepted path of a target that mostly agrees with it."""
    sharp = rng.uniform(0.5, 4.0)
    logits = (sharp * rng.standard_normal((depths, vocab))).astype(np.float32)   # [L, V]
    budget = int(rng.integers(1, 40))
    lp, ids = ref.topk_logprobs(logits, min(budget, vocab))
    tree = ref.build_tree(lp, ids, budget)
    post = rng.integers(0, vocab, tree.num_nodes + 1).astype(np.int32)           # [N+1]
    for i in range(tree.num_nodes + 1):
        kids = np.flatnonzero(tree.parents == i)                     # in id order
        u = rng.random()
        if len(kids) and u < 0.9:                                    # follow a child:
            pick = kids[0] if u < 0.6 else rng.choice(kids)          # mostly the first-popped
            post[i] = tree.tokens[pick - 1]
    keep, _ = ref.follow_tree(tree, post)
    return tree, keep


rounds = [random_round(rng) for _ in range(2000)]
for tree, keep in rounds:
    n = len(keep)
    assert keep[0] == 0 and np.all(np.diff(keep) > 0)                 # strictly increasing
    assert np.all(keep >= np.arange(n))                              # keep[i] >= i
    assert all(tree.parents[keep[i]] == keep[i - 1] for i in range(1, n))  # a tree path
    assert keep[-1] <= tree.num_nodes                                # inside the verified rows
lengths = np.array([len(k) for _, k in rounds])
print(f"2000 rounds: accepted path lengths {lengths.min()}..{lengths.max()}, "
      f"{np.mean([len(ref.naive_row_hazards(k)) > 0 for _, k in rounds]):.0%} of them have a "
      "naive-gather hazard (next section)")

fig, ax = plt.subplots(figsize=(6.5, 4.2))
for tree, keep in rounds[:60]:
    ax.plot(np.arange(len(keep)), keep, "-o", ms=3, lw=1, alpha=0.5)
top = max(len(k) for _, k in rounds[:60])
ax.plot([0, top], [0, top], "k--", lw=1.5, label="keep[i] = i")
ax.set_xlabel("i (position on the accepted path)")
ax.set_ylabel("keep[i] (node id)")
ax.set_title("60 accepted paths: never below the diagonal")
ax.legend()
plt.show()

# %% [markdown]
# `keep[i] = i` exactly while the path follows the first-popped nodes (often the drafter's
# favourites); once it leaves them `keep[i] > i`, and from there on row `start + i` must be
# filled from a row further down.
#
# ## 2 · The naive in-place gather, step by step
#
# The obvious kernel gives each kept row a thread: thread `i` does
# `rows[start + i] = rows[start + keep[i]]` in place. Thread `i` reads row `start + keep[i]`;
# if `keep[i] < n`, that row is also *written*, by thread `keep[i]`. `ref.naive_row_hazards`
# lists these (reader, writer) pairs; nothing on a GPU orders the two threads, so the reader
# may get the row after it has been overwritten.
#
# We take a sampled round with the most hazards (and a small tree), label every cache row by its own content
# (`p*` = committed prefix, `n*` = tree node) and replay the threads one at a time with
# `ref.naive_gather_in_order`, in increasing and in decreasing thread order.

# %%
tree, keep = max(rounds[:400], key=lambda r: (len(ref.naive_row_hazards(r[1])), -r[1][-1]))
n = len(keep)
hazards = ref.naive_row_hazards(keep)
print("keep:", keep, " hazards (reader i, writer j):", hazards)
for i, j in hazards:
    print(f"  thread {i} reads row start+{keep[i]}, which thread {j} overwrites with row "
          f"start+{keep[j]}")
draw_tree(tree, accepted=keep)
plt.show()

START = 2
S = START + tree.num_nodes + 1
rows = np.arange(S, dtype=np.int32)[:, None]                         # [S, 1]: row r holds r
want = rows.copy()
ref.compact_rows(want, START, keep)                                  # the twin's answer


def label(r):
    return f"p{r}" if r < START else f"n{r - START}"


def show_replay(order, ax):
    """Cache rows (y) after each thread's copy (x); green = final value, red = wrong value."""
    states = [ref.naive_gather_in_order(rows, START, keep, order[:k])[:, 0]
              for k in range(len(order) + 1)]                        # [n+1] of [S]
    shown = range(START, START + keep[-1] + 1)                       # destinations and sources
    for x, state in enumerate(states):
        for y, r in enumerate(shown):
            moved = state[r] != r
            good = r < START + n and state[r] == want[r, 0]
            face = "white" if not moved else ("#b9e4c0" if good else "#f4b6b6")
            ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, fc=face, ec="#cccccc"))
            ax.text(x, y, label(int(state[r])), ha="center", va="center", fontsize=8)
        if x:
            y = START + order[x - 1] - shown[0]
            ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, ec="black", lw=2))
    ax.set_xlim(-0.5, len(states) - 0.5)
    ax.set_ylim(len(shown) - 0.5, -0.5)
    ax.set_xticks(range(len(states)), ["before"] + [f"thr {i}" for i in order], fontsize=8)
    ax.set_xlabel("the cache after each thread's copy")
    ax.set_yticks(range(len(shown)),
                  [f"start+{r - START}" + (" (dst)" if r - START < n else "") for r in shown],
                  fontsize=8)
    ok = np.array_equal(states[-1][:START + n], want[:START + n, 0])
    ax.set_title(f"threads in order {list(order)}: {'correct' if ok else 'WRONG'}",
                 color="black" if ok else ACCEPT_COLOUR)
    return states[-1]


fig, axes = plt.subplots(1, 2, figsize=(13, 0.45 * (keep[-1] + 1) + 1.5))
inc = show_replay(list(range(n)), axes[0])
dec = show_replay(list(range(n - 1, -1, -1)), axes[1])
plt.tight_layout()
plt.show()
print("twin      :", [label(int(r)) for r in want[START:START + n, 0]])
print("increasing:", [label(int(r)) for r in inc[START:START + n]])
print("decreasing:", [label(int(r)) for r in dec[START:START + n]])
assert np.array_equal(inc[:START + n], want[:START + n, 0])
assert not np.array_equal(dec[:START + n], want[:START + n, 0])

# %% [markdown]
# A black box marks the row a thread has just written. In increasing order each thread reads
# its source before any thread that writes it has run; in decreasing order thread `j` of a
# hazard pair runs first, so thread `i` copies an already-moved row: one node's latents end up
# twice and another's are lost. (Rows from `start + n` on are stale either way; they are free.)
#
# ## 3 · Which thread orders are safe?
#
# Replaying whole threads one at a time is already enough to break it. Over all `n!` orders,
# the gather is right exactly when, for every hazard `(i, j)`, reader `i` runs before writer
# `j`. Increasing order is one such order since `j = keep[i] > i`, but a GPU guarantees none of
# them: threads in different warps or blocks run in any order.

# %%
orders = list(itertools.permutations(range(n)))
ok = []
for order in orders:
    got = ref.naive_gather_in_order(rows, START, keep, order)
    ok.append(np.array_equal(got[:START + n], want[:START + n]))
    pos = {t: k for k, t in enumerate(order)}
    assert ok[-1] == all(pos[i] < pos[j] for i, j in hazards)
print(f"{sum(ok)} of {len(orders)} thread orders give the right cache ({sum(ok) / len(orders):.0%})")

# %% [markdown]
# ## 4 · Two safe schemes
#
# **Columns.** One thread per column (a latent dimension), each walking the rows in increasing
# `i`. At step `i` the column reads row `start + keep[i] >= start + i`, and its earlier writes
# all went to rows `< start + i`: nothing it reads has been overwritten. Columns never touch
# each other's data, so their order, or any interleaving of their steps, does not matter.
#
# **Scratch.** Phase 1: every thread `i` copies row `start + keep[i]` into `scratch[i]`.
# Phase 2: every thread copies `scratch[i]` back to `start + i`. Inside a phase the threads are
# independent (phase 1 only reads the cache, phase 2 only writes it); the kernel-launch
# boundary between the phases is the grid-wide barrier the naive gather lacks.
#
# Both are written out below as thread-by-thread replays with shuffled thread orders, and
# checked against `ref.compact_rows`: on this round, and on all 2000 random rounds from
# section 1 with random float rows. A column walking in *decreasing* `i` is the naive hazard
# again.

# %%
def columns_scheme(rows, start, keep, rng, reverse=False):
    """One 'thread' per column, steps of all columns interleaved at random; each column walks
    i increasing (or decreasing, which is wrong)."""
    out = rows.copy()
    steps = list(range(len(keep)))[::-1] if reverse else list(range(len(keep)))
    cursor = {c: 0 for c in range(rows.shape[1])}                    # next step of each column
    while cursor:
        c = int(rng.choice(list(cursor)))                            # any column may run next
        i = steps[cursor[c]]
        out[start + i, c] = out[start + keep[i], c]
        cursor[c] += 1
        if cursor[c] == len(steps):
            del cursor[c]
    return out


def scratch_scheme(rows, start, keep, rng):
    """Gather into scratch, barrier, copy back; thread order shuffled inside each phase."""
    out = rows.copy()
    scratch = np.empty((len(keep), rows.shape[1]), rows.dtype)      # [n, W]
    for i in rng.permutation(len(keep)):                             # phase 1: reads only
        scratch[i] = out[start + keep[i]]
    # --- barrier: the second kernel launch ---
    for i in rng.permutation(len(keep)):                             # phase 2: writes only
        out[start + i] = scratch[i]
    return out


wide = np.repeat(rows, 3, axis=1)                                    # [S, 3]: three columns
for scheme in (columns_scheme, scratch_scheme):
    got = scheme(wide, START, keep, rng)
    assert np.array_equal(got, np.repeat(want, 3, axis=1)), scheme.__name__
    print(f"{scheme.__name__:15s}:", [label(int(r)) for r in got[START:START + n, 0]])
bad = columns_scheme(wide, START, keep, rng, reverse=True)
print("columns, i down:", [label(int(r)) for r in bad[START:START + n, 0]], " <- wrong")

checked = 0
for tree_k, keep_k in rounds:
    start = int(rng.integers(0, 5))
    rows_k = rng.standard_normal((start + tree_k.num_nodes + 1 + 2, 4)).astype(np.float32)  # [S, W]
    twin = rows_k.copy()
    ref.compact_rows(twin, start, keep_k)
    assert np.array_equal(columns_scheme(rows_k, start, keep_k, rng), twin)
    assert np.array_equal(scratch_scheme(rows_k, start, keep_k, rng), twin)
    naive = ref.naive_gather_in_order(rows_k, start, keep_k, range(len(keep_k) - 1, -1, -1))
    assert np.array_equal(naive, twin) == (not ref.naive_row_hazards(keep_k))
    checked += 1
print(f"{checked} random rounds: both schemes == ref.compact_rows; the naive gather in decreasing "
      "order is wrong exactly when a hazard exists")

# %% [markdown]
# The GPU kernels are `ddtree_numba.kernels.compact_rows(rows, start, keep,
# method="columns" | "scratch")`, tested against the twin in `tests/test_compact.py`. On a
# machine with a GPU, or under numba's CUDA simulator (`NUMBA_ENABLE_CUDASIM=1` in the
# environment Jupyter starts from), the next cell runs them too.

# %%
from numba import config as numba_config, cuda

if numba_config.ENABLE_CUDASIM or cuda.is_available():
    from ddtree_numba import kernels as kn
    rows_f = rng.standard_normal((S, 8)).astype(np.float32)         # [S, W]
    twin = rows_f.copy()
    ref.compact_rows(twin, START, keep)
    for method in ("columns", "scratch"):
        got = rows_f.copy()
        kn.compact_rows(got, START, keep, method=method)
        assert np.array_equal(got, twin)
        print(f"kn.compact_rows(method={method!r}) == ref.compact_rows, bit for bit "
              f"({'simulator' if numba_config.ENABLE_CUDASIM else 'GPU'})")
else:
    print("no GPU and no CUDA simulator: kernels skipped")

# %% [markdown]
# ## 5 · Compacting a real MLA latent cache
#
# Now the rows are what they are in the model: per layer, one latent `c_kv [C]` and one rope
# key `k_pe [R]` per token (`MLACache`, docs/MODEL.md). We verify a draft tree of the trained
# demo pair (`dd.demo_pair()`, numpy backend, as in notebook 02) after 32 bytes of a module held
# out of training, `importlib/resources/simple.py`, cut mid-line where the accepted path skips
# a node (so the naive gather has a hazard), then:
#
# * `cache.compact(start, keep)` (that is `ref.compact_rows` on every layer's `c_kv` and
#   `k_pe`) must leave exactly the rows a causal forward over prompt + path would have written;
# * dropping the leaf's row and decoding the leaf token again must give the leaf's verify
#   logits, i.e. the path's logits;
# * the naive gather in decreasing thread order, on the same cache, must not.

# %%
from ddtree_numba.demo import byte_text, demo_metadata

target_dir, drafter_dir = dd.demo_pair()
target = dd.load_target(target_dir, backend="numpy", progress=False)
drafter = dd.load_drafter(drafter_dir, target)
PROMPT = np.asarray(demo_metadata()["prompts"][1]["ids"][105 - 32:105], np.int32)
P = len(PROMPT)


def prefill(hidden=()):
    cache = target.new_cache(64)
    out = target.forward(PROMPT, np.arange(P, dtype=np.int32), cache, hidden_layer_ids=hidden)
    return cache, out


cache, pre = prefill(drafter.target_layer_ids)
b = int(pre.logits[-1].argmax())
draft_logits = drafter.draft(pre.hidden, b, drafter.new_cache(64))   # [L, V]
lp, ids = ref.topk_logprobs(draft_logits, 20)                        # [L, K]
mtree = ref.build_tree(lp, ids, 20)
ids_tree = np.concatenate([[b], mtree.tokens]).astype(np.int32)      # [N+1]
pos_tree = (P + np.concatenate([[0], mtree.depths])).astype(np.int32)
verify = target.forward(ids_tree, pos_tree, cache, parents=mtree.parents)   # logits [N+1, V]
mkeep, bonus = ref.follow_tree(mtree, ref.sample_post(verify.logits, 0.0, seed=0))
mn = len(mkeep)
print(repr(byte_text(PROMPT)), "->", repr(byte_text(ids_tree[mkeep])))
print(f"verified {mtree.num_nodes + 1} nodes; cache rows {len(cache)}; keep {mkeep}; "
      f"hazards {ref.naive_row_hazards(mkeep)}")
assert ref.naive_row_hazards(mkeep), "this cut was chosen for its hazard"

# what a causal forward over prompt + the accepted path writes to its cache
path_cache, _ = prefill()
path_out = target.forward(ids_tree[mkeep], (P + np.arange(mn)).astype(np.int32), path_cache)

# the naive gather, decreasing thread order, on a copy of the verified cache
naive_cache = target.new_cache(64)
for layer in range(target.config.num_hidden_layers):
    for name in ("c_kv", "k_pe"):
        live = getattr(cache, name)[layer, :len(cache)]
        getattr(naive_cache, name)[layer, :len(cache)] = ref.naive_gather_in_order(
            live, P, mkeep, range(mn - 1, -1, -1))
naive_cache.length = P + mn

cache.compact(P, mkeep)                                              # the real thing
assert len(cache) == P + mn
for name in ("c_kv", "k_pe"):
    got, naive = getattr(cache, name)[:, :P + mn], getattr(naive_cache, name)[:, :P + mn]
    ref_rows = getattr(path_cache, name)[:, :P + mn]                 # [layers, P+n, C or R]
    assert np.allclose(got, ref_rows, rtol=1e-5, atol=1e-5)
    bad_rows = ~np.isclose(naive, ref_rows, rtol=1e-5, atol=1e-5)    # [layers, P+n, .]
    readers = [P + i for i, _ in ref.naive_row_hazards(mkeep)]      # rows of the hazards' readers
    assert sorted({int(r) for r in np.nonzero(bad_rows)[1]}) == readers
    print(f"{name}: compacted vs causal path rows, max |Δ| = {np.abs(got - ref_rows).max():.3g}; "
          f"naive gather: rows that differ {sorted({int(r) for r in np.nonzero(bad_rows)[1]})}")

# %% [markdown]
# Both caches keep the prompt untouched; the naive one holds the wrong latents in row
# `P + i` for the hazard's reader `i`. Now drop the leaf's row and decode the leaf token again
# at its position `P + n - 1`; the rows after the live ones are poisoned with NaN so any read
# of a stale tree row would show.

# %%
def redecode_leaf(c):
    c.truncate(P + mn - 1)
    c.c_kv[:, len(c):] = np.nan                                      # stale rows must not be read
    c.k_pe[:, len(c):] = np.nan
    leaf = mkeep[-1]
    return target.forward(ids_tree[leaf:leaf + 1], pos_tree[leaf:leaf + 1], c).logits[0]  # [V]


leaf_verify = verify.logits[mkeep[-1]]                               # [V] from the tree forward
leaf_ok = redecode_leaf(cache)
leaf_naive = redecode_leaf(naive_cache)
assert np.allclose(leaf_ok, leaf_verify, rtol=1e-4, atol=1e-5)
assert np.allclose(leaf_ok, path_out.logits[-1], rtol=1e-4, atol=1e-5)
assert int(leaf_ok.argmax()) == bonus
print(f"leaf again, compacted cache: max |Δ| vs verify {np.abs(leaf_ok - leaf_verify).max():.3g}, "
      f"vs causal path {np.abs(leaf_ok - path_out.logits[-1]).max():.3g}; argmax {leaf_ok.argmax()} "
      f"= bonus {bonus}")
print(f"leaf again, naive cache    : max |Δ| vs verify {np.abs(leaf_naive - leaf_verify).max():.3g};"
      f" argmax {leaf_naive.argmax()}")
assert not np.allclose(leaf_naive, leaf_verify, rtol=1e-4, atol=1e-5)

fig, ax = plt.subplots(figsize=(11, 3.4))
v = np.arange(target.config.vocab_size)
ax.plot(v, leaf_verify, color="#bbbbbb", lw=5, label="leaf's verify logits (tree forward)")
ax.plot(v, leaf_ok, color="#2e5c8a", lw=1.2, label="leaf again after compact_rows")
ax.plot(v, leaf_naive, color=ACCEPT_COLOUR, lw=1.2, ls="--",
        label="leaf again after the naive gather (decreasing order)")
ax.axvline(bonus, color="black", lw=0.8, ls=":")
ax.set_xlabel("token id (dotted: the bonus token)")
ax.set_ylabel("logit")
ax.set_title("decoding the accepted leaf again over the compacted cache")
ax.legend(fontsize=8, loc="lower right")
plt.show()

# %% [markdown]
# With the twin's compaction the cache is exactly the accepted path's cache, so the next
# round starts as if the path had been decoded one token at a time. With the naive gather the
# model attends to a wrong latent in one row of every layer, and the leaf's logits drift: the
# kind of bug that shows up only as a lower acceptance rate, or as output that slowly stops
# matching autoregressive decoding.
