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
# # 01 · Building, verifying and committing one DDTree draft tree
#
# One DDTree round (docs/DESIGN.md §1) on a toy vocabulary, stage by stage, with the
# pure-numpy twins in `ddtree_numba.reference` — the same functions the `numba.cuda`
# kernels are tested against, so everything here runs on the CPU in a second or two.
#
# | step | docs/DESIGN.md §1 | twin |
# |---|---|---|
# | top-K per depth | 2 | `ref.topk_logprobs` |
# | best-first build | 3 | `ref.build_tree` |
# | ancestor-only mask | 4 | `ref.visibility` |
# | accept | 6 | `ref.sample_post`, `ref.follow_tree` |
# | cache compaction | 7 | `ref.compact_rows` |

# %%
import heapq

import matplotlib.pyplot as plt
import numpy as np

import ddtree_numba as dd
from ddtree_numba import reference as ref
from ddtree_numba.plots import draw_tree, show_topk, show_visibility

np.set_printoptions(linewidth=110)

# %% [markdown]
# ## 1 · Drafter logits
#
# The drafter runs once on `[b, MASK, …, MASK]` and returns logits for the `L = B - 1`
# positions after the bonus token `b` (§1 step 1). We fake them: Gaussian noise over a
# 16-word vocabulary, plus a clear favourite and two runner-ups per depth. Uniform noise alone
# would give a dull tree (STYLE.md: make test inputs *less* uniform on purpose).

# %%
VOCAB = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran",
         "to", "park", "and", "slept", ".", ",", "big", "red"]
TOK = {w: i for i, w in enumerate(VOCAB)}
word = VOCAB.__getitem__          # token id -> label, for the plots

V = len(VOCAB)
L = 4                              # draft depths (block size B = 5)
BUDGET = 12                        # tree nodes besides the root

# per depth: a favourite and two runner-ups (the noise may swap close ones)
BUMPS = [{"cat": 4.0, "dog": 3.0, "big": 2.0},
         {"sat": 4.5, "ran": 2.5, "slept": 1.5},
         {"on": 4.0, "to": 3.5, ".": 1.0},
         {"a": 4.0, "mat": 2.0, "the": 1.5}]

rng = np.random.default_rng(7)
logits = rng.normal(0.0, 1.0, (L, V)).astype(np.float32)          # [L, V]
for d, bumps in enumerate(BUMPS):
    for w, b in bumps.items():
        logits[d, TOK[w]] += b

probs = np.exp(logits - logits.max(1, keepdims=True))
probs /= probs.sum(1, keepdims=True)                                 # [L, V]
fig, axes = plt.subplots(1, L, figsize=(14, 2.4), sharey=True)
for d, ax in enumerate(axes):
    ax.bar(range(V), probs[d], color="#2e5c8a")
    ax.set_xticks(range(V), VOCAB, rotation=90, fontsize=7)
    ax.set_title(f"depth {d + 1}")
axes[0].set_ylabel("drafter p")
plt.show()

# %% [markdown]
# ## 2 · Top-K per depth
#
# `logp = logits - logsumexp(logits)` per depth, and the `K = min(budget, V)` best tokens,
# sorted by descending logit with ties to the lower token id (§1 step 2). Row `d` of the table
# is depth `d`; column `r` is rank `r`. A tree node will be a path of these ranks.

# %%
K = min(BUDGET, V)
lp, ids = ref.topk_logprobs(logits, K)                               # [L, K] f32, [L, K] i32
print("lp", lp.shape, lp.dtype, " ids", ids.shape, ids.dtype)
show_topk(lp, ids, labels=word)
plt.show()

# %% [markdown]
# ### On a GPU: a row in slices, each keeping a capped list
#
# A real vocabulary is ~10^5 tokens, too many for one block, so the kernel deals each row out to
# several blocks (*slices*) in runs of consecutive tokens, and each slice keeps only its `cap`
# best (fewer than `K`: the lists then fit one block's shared memory for the merge). The merge
# takes the `K` best of the lists. That misses a token only if one slice held more than `cap` of
# the row's top `K`; the merge cannot count that, so it checks something it can: a *full* list
# whose last token still ranks inside the top `K - 1`. Then it falls back to the whole row. The
# kernel sets `cap` four standard deviations above a slice's average share `K / slices`, so a row
# whose top tokens fall on the slices at random rarely falls back (`kernels.topk._split` gives the
# odds). `ref.topk.capped_merge` is that merge, step by step, on one row.

# %%
from ddtree_numba.reference.topk import capped_merge, fallback_odds, slice_of

row = np.random.default_rng(0).standard_normal(64).astype(np.float32)   # a 64-token row
slices = slice_of(np.arange(64), 4, 4)                              # runs of 4 tokens, 4 slices
top_ids, fell_back = capped_merge(row, 8, slices=4, cap=4, run=4)   # top 8 from 4 lists of 4
print("slices of the row's top 8:", slices[ref.topk_logprobs(row[None], 8)[1][0]],
      " falls back?", fell_back)
assert not fell_back and (top_ids == ref.topk_logprobs(row[None], 8)[1][0]).all()
crowded = row.copy()
crowded[slices == 0] += 10.0                                        # every strong token in slice 0
print("crowded row: slices of its top 8:", slices[ref.topk_logprobs(crowded[None], 8)[1][0]],
      " falls back?", capped_merge(crowded, 8, slices=4, cap=4, run=4)[1])

# %% [markdown]
# How often does a row fall back? If a row's top `K` tokens land on the 8 slices at random, each
# slice holds a Binomial(K, 1/8) share of them, and the merge falls back when some slice holds
# `cap` of the top `K - 1`. The kernel's lists at a 163,840-token vocabulary
# (`kernels.topk._split`), and those odds (`ref.topk.fallback_odds`, a union bound over the slices):

# %%
from ddtree_numba.kernels.topk import _split

for k in (32, 64, 128, 256, 512, 1024):
    G, cap = _split(163840, k)
    print(f"K {k:5d}: {G} slices, lists of {cap:3d}, a random row falls back with odds ~{fallback_odds(k, G, cap):.0e}")

# %% [markdown]
# ## 3 · The best-first build, one pop at a time
#
# §1 step 3: a node is a rank path `(r1..rd)` scored `sum_i logp[i, r_i]` (float64, in path
# order). Start from `(0,)`; pop the best path (ties: the lexicographically smaller rank path),
# make it the next node, and push its **next sibling** (same parent, rank + 1) and its **first
# child** (rank 0 one level deeper). Stop after `budget` pops.
#
# Python's `heapq` is a min-heap, and comparing `(-score, path)` tuples is exactly the tie rule.
# The loop below is `ref.build_tree` with prints added; we check that it builds the same tree.

# %%
def build_tree_verbose(lp, ids, budget):
    L, K = lp.shape
    lp64 = lp.astype(np.float64)
    node_of_path, score_of_path = {(): 0}, {(): 0.0}
    tokens, depths, parents, ranks, scores = [], [], [-1], [], []
    heap = [(-lp64[0, 0], (0,))]
    print("node  score   rank path     token  parent | pushed")
    while heap and len(tokens) < budget:
        neg, path = heapq.heappop(heap)
        score, d, r = -neg, len(path), path[-1]
        node = len(tokens) + 1
        node_of_path[path], score_of_path[path] = node, score
        tokens.append(ids[d - 1, r]); depths.append(d); ranks.append(r); scores.append(score)
        parents.append(node_of_path[path[:-1]])
        pushed = []
        if r + 1 < K:                                    # next sibling
            sib = path[:-1] + (r + 1,)
            s = score_of_path[path[:-1]] + lp64[d - 1, r + 1]
            heapq.heappush(heap, (-s, sib)); pushed.append(f"sib {sib} {s:.3f}")
        if d < L:                                        # first child
            child = path + (0,)
            s = score + lp64[d, 0]
            heapq.heappush(heap, (-s, child)); pushed.append(f"child {child} {s:.3f}")
        print(f"{node:4d}  {score:6.3f}  {str(path):13s} {word(ids[d - 1, r]):6s} "
              f"{parents[-1]:6d} | {', '.join(pushed)}")
    print(f"left on the heap: {len(heap)} paths, best {-heap[0][0]:.3f} {heap[0][1]}")
    return dd.Tree(tokens=np.asarray(tokens, np.int32), depths=np.asarray(depths, np.int32),
                   parents=np.asarray(parents, np.int32), ranks=np.asarray(ranks, np.int32),
                   scores=np.asarray(scores, np.float64))


mine = build_tree_verbose(lp, ids, BUDGET)
tree = ref.build_tree(lp, ids, BUDGET)
assert mine == tree, "the inline loop and ref.build_tree disagree"
print(tree, " parents", tree.parents)

# %% [markdown]
# Every popped score is no higher than the one before: the tree is exactly the `budget` best
# rank paths, numbered best first, so `parents[i] < i`. (`ref.enumerate_paths` checks that by
# brute force.)

# %%
best = ref.enumerate_paths(lp)[:BUDGET]
assert [p for _, p in best] == [tuple(int(tree.ranks[j - 1]) for j in tree.path(i)[1:])
                               for i in range(1, tree.num_nodes + 1)]
assert np.all(np.diff(tree.scores) <= 0)

# %% [markdown]
# ### The same tree with no pop chain
#
# The heap pops one node at a time: `budget` steps in a row, which a GPU runs on one block, one
# pop after another. Since a child never scores above its parent, the tree is also reachable
# level by level: depth `d` keeps the best `budget` children of depth `d - 1`'s survivors,
# found as a *threshold* (the `budget`-th best child score) plus the ties at it, taken in
# rank-path order; then the best `budget` nodes over all depths, by score and then preorder.
# Every step is a sort, a selection or a prefix sum: what the parallel kernel
# (`kernels.build_tree_levels`) does with a thousand threads. `ref.build_tree_levels` is its
# twin; below, each level's threshold and how many nodes it keeps.

# %%
from ddtree_numba.reference.tree_build import select_level     # one level's selection

prev = np.zeros(1)                                          # the root's score
R = min(lp.shape[1], BUDGET)
for d in range(lp.shape[0]):
    keep_per_parent = select_level(prev, lp[d, :R].astype(np.float64), BUDGET)
    parent = np.repeat(np.arange(prev.shape[0]), keep_per_parent)
    rank = np.concatenate([np.arange(c) for c in keep_per_parent])
    prev = prev[parent] + lp[d, rank].astype(np.float64)   # this level's scores, in path order
    print(f"depth {d + 1}: {len(prev):3d} nodes kept, lowest score {prev.min():7.3f}")
assert ref.build_tree_levels(lp, ids, BUDGET) == tree       # the heap's tree, bit for bit

# %% [markdown]
# ## 4 · The tree
#
# Depth runs left to right; siblings are stacked in rank order (the drafter's favourite on
# top); the grey number above each box is the node id, i.e. its pop order. The root is the
# bonus token `b`.

# %%
draw_tree(tree, labels=word, root_label="b")
plt.show()

# %% [markdown]
# ## 5 · Visibility
#
# §1 step 4: in the verify forward, node `i` may attend to node `j` iff `j` is `i` or one of
# its ancestors (the committed prefix is visible to all). Row `i` is row `parents[i]` plus the
# diagonal, so each row is a root-to-node path. `ref.visibility_bits` packs the same mask into
# 32-bit words for the tree-attention kernel.

# %%
N = tree.num_nodes
vis = ref.visibility(tree.parents)                                   # [N+1, N+1] bool
bits = ref.visibility_bits(tree.parents)                             # [N+1, 1] uint32
print("vis", vis.shape, " bits", bits.shape)
print("row 9 of bits, j = 0..N:", format(int(bits[9, 0]), f"0{N + 1}b")[::-1])
assert np.array_equal(vis[9], [tree.path(9).count(j) == 1 for j in range(N + 1)])
show_visibility(vis)
plt.show()

# %% [markdown]
# ## 6 · Accept
#
# §1 step 6: the target scores every node in one forward; `post[i]` is its choice at node `i`
# (argmax at T = 0). From the root, move to the child whose token equals `post[current]`
# while there is one. We fake target logits whose argmax writes *"cat sat on the"* after `b`:
# the target agrees with the drafter's favourite at depth 1 but takes the runner-up `sat` at
# depth 2, so the accepted path leaves the first branch (`cat ran to a`).

# %%
TARGET_WORDS = ["cat", "sat", "on", "the"]
target_logits = np.random.default_rng(1).normal(0, 1, (N + 1, V)).astype(np.float32)  # [N+1, V]
node = 0
for w in TARGET_WORDS:                 # push the target's choice up along its own path
    target_logits[node, TOK[w]] += 8.0
    nxt = [j for j in range(1, N + 1) if tree.parents[j] == node and tree.tokens[j - 1] == TOK[w]]
    if not nxt:
        break
    node = nxt[0]

post = ref.sample_post(target_logits, 0.0, seed=0)                   # [N+1] int32
keep, bonus = ref.follow_tree(tree, post)                            # [n] int32, int
print("post :", [word(t) for t in post])
print("keep :", keep, "->", [word(tree.tokens[j - 1]) for j in keep[1:]], "+ bonus", word(bonus))
assert [word(tree.tokens[j - 1]) for j in keep[1:]] + [word(bonus)] == TARGET_WORDS
assert any(tree.ranks[j - 1] != 0 for j in keep[1:]), "the path should leave the first branch"

fig, (a0, a1) = plt.subplots(1, 2, figsize=(15, 5), gridspec_kw={"width_ratios": [3, 2]})
draw_tree(tree, accepted=keep, ax=a0, labels=word, root_label="b")
show_visibility(vis, ax=a1, accepted=keep)
plt.show()

# %% [markdown]
# `b` and the accepted tokens are emitted, and `post[keep[-1]]` becomes the next round's bonus
# token: four tokens for one target forward here.
#
# ## 7 · Committing: compact the KV cache
#
# §1 step 7: the verify forward appended `N + 1` rows to the cache at `start … start + N`, one
# per node. Only the accepted nodes' rows stay: row `start + keep[i]` moves to `start + i`.
# Below each cache row holds its own row number, so we can see which row landed where
# (`p*` = committed prefix, `n*` = tree node).

# %%
START = 3
S, W = START + N + 1, 2
rows = np.repeat(np.arange(S, dtype=np.int32)[:, None], W, axis=1)   # [S, W]: row r holds r


def label(r):
    return f"p{r}" if r < START else f"n{r - START}"


def show_rows(**cols):
    print("row  " + "  ".join(f"{k:>10s}" for k in cols))
    for r in range(S):
        mark = f" <- i = {r - START}" if START <= r < START + len(keep) else ""
        print(f"{r:3d}  " + "  ".join(f"{label(int(c[r, 0])):>10s}" for c in cols.values()) + mark)


compacted = rows.copy()
ref.compact_rows(compacted, START, keep)                             # in place
show_rows(before=rows, after=compacted)   # rows from start + n on are stale: free for the next round
assert np.array_equal(compacted[:START], rows[:START])               # the prefix is untouched
assert np.array_equal(compacted[START:START + len(keep), 0], START + keep)

# %% [markdown]
# ### Why the naive kernel is wrong
#
# The obvious kernel gives each row its own thread: thread `i` does
# `rows[start + i] = rows[start + keep[i]]` in place. Since `keep[i] >= i`, thread `i` may read a
# row that another thread `j = keep[i]` writes (docs/DESIGN.md §1, "Compaction races").
# `ref.naive_row_hazards` lists those pairs, and `ref.naive_gather_in_order` replays the threads
# one at a time in a chosen order — any order is a schedule a GPU may pick.

# %%
hazards = ref.naive_row_hazards(keep)
for i, j in hazards:
    print(f"thread {i} reads row start+{keep[i]}, which thread {j} overwrites with row "
          f"start+{keep[j]}")
assert hazards, "this keep has no read/write overlap to show"

n = len(keep)
increasing = ref.naive_gather_in_order(rows, START, keep, range(n))
decreasing = ref.naive_gather_in_order(rows, START, keep, range(n - 1, -1, -1))
show_rows(twin=compacted, increasing=increasing, decreasing=decreasing)
assert np.array_equal(increasing, compacted)
assert not np.array_equal(decreasing, compacted)

# %% [markdown]
# In increasing order each row is read before any later write can reach it; in decreasing order
# thread `j` has already overwritten the row thread `i` needed, so a node's K/V is duplicated
# and another's is lost. The kernels avoid this by gathering into scratch and copying back, or
# by giving threads columns instead of rows and walking the rows in increasing `i`
# (`ddtree_numba.kernels.compact_rows`).

# %% [markdown]
# ## 8 · The same build on a real drafter's distributions
#
# Everything above used made-up logits. The trained demo pair (`dd.demo_pair()`: a byte-level
# DeepSeek-V3-architecture target trained on the Python standard library, and its DFlash drafter,
# block size 16) gives real ones. We prefill a held-out module's text, let the drafter propose
# its 15 distributions in one pass, and build a 40-node tree. Tokens are bytes (`␣` is a space,
# `⏎` a newline).

# %%
from ddtree_numba.demo import byte_text, demo_metadata
from ddtree_numba.plots import byte_label

target_dir, drafter_dir = dd.demo_pair()
target = dd.load_target(target_dir, progress=False)                  # numpy backend
drafter = dd.load_drafter(drafter_dir, target)
prompt = np.asarray(demo_metadata()["prompts"][3]["ids"][:141], np.int32)   # gzip.py, held out
print(repr(byte_text(prompt[-60:])))

cache = target.new_cache(256)
pre = target.forward(prompt, np.arange(len(prompt), dtype=np.int32), cache,
                     hidden_layer_ids=drafter.target_layer_ids)      # hidden [P, 3, M]
bonus = int(pre.logits[-1].argmax())
real_logits = drafter.draft(pre.hidden, bonus, drafter.new_cache(256))   # [15, V]
real_lp, real_ids = ref.topk_logprobs(real_logits, 8)                # [15, 8]
print("drafter's top-1 probability per depth:", np.round(np.exp(real_lp[:, 0]), 2))
show_topk(real_lp[:6], real_ids[:6], labels=byte_label)
plt.gcf().set_size_inches(11, 4)
plt.show()

# %% [markdown]
# The first depths are near certain; further out the drafter hedges between a few bytes. The
# best-first build spends its budget accordingly: a single spine where the drafter is sure,
# branches where it is not. The target then verifies the tree in one forward and walks it.

# %%
real_lp, real_ids = ref.topk_logprobs(real_logits, 40)
real_tree = ref.build_tree(real_lp, real_ids, 40)
verify = target.forward(np.concatenate([[bonus], real_tree.tokens]).astype(np.int32),
                        len(prompt) + np.concatenate([[0], real_tree.depths]).astype(np.int32),
                        cache, parents=real_tree.parents)            # logits [41, V]
real_keep, next_bonus = ref.follow_tree(real_tree, ref.sample_post(verify.logits, 0.0, seed=0))
accepted = [bonus] + [int(real_tree.tokens[k - 1]) for k in real_keep[1:]]
print(f"{real_tree}: nodes per depth {np.bincount(real_tree.depths)[1:]}")
print(f"accepted path {real_keep.tolist()}, ranks {[int(real_tree.ranks[k - 1]) for k in real_keep[1:]]}: "
      f"{byte_text(accepted)!r}, then the bonus {byte_label(next_bonus)!r}")
ax = draw_tree(real_tree, accepted=real_keep, labels=byte_label, root_label=byte_label(bonus))
ax.figure.set_size_inches(13, 9)
plt.show()

# the accepted tokens are the target's own greedy continuation
ar = dd.generate(target, None, prompt, len(accepted) + 1, method="ar").tokens.tolist()
assert ar == accepted + [next_bonus]
