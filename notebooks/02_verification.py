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
# # 02 · Verifying a draft tree with one target forward
#
# docs/DESIGN.md §1, steps 4–6, on the trained demo pair (`dd.demo_pair()`): a byte-level
# DeepSeek-V3-architecture target (MLA with a q latent, a dense first layer, then sigmoid /
# `noaux_tc` MoE layers with a shared expert) trained on the Python standard library, and its
# DFlash drafter; on the numpy backend, so everything runs on the CPU. Tokens are bytes.
#
# | step | what we look at | code |
# |---|---|---|
# | 4 | the ancestor-only mask | `ref.visibility`, `ref.mla_mask` |
# | 5 | the verify forward | `target.forward(parents=)` |
# | 5 | layer 0's absorbed-MLA scores of one head | `ref.mla_attention_absorbed` |
# | 5 | absorbed MLA == naive MLA | `ref.mla_attention_naive` |
# | 6 | the target's choice at every node and the walk down the tree | `ref.sample_post`, `ref.follow_tree` |
# | — | node i's verify logits == a causal forward over its root-to-node path | `target.forward` |

# %%
import matplotlib.pyplot as plt
import numpy as np

import ddtree_numba as dd
from ddtree_numba import reference as ref
from ddtree_numba.demo import byte_text, demo_metadata
from ddtree_numba.plots import byte_label, draw_tree, show_visibility, tree_layout

np.set_printoptions(linewidth=110, precision=4, suppress=True)

target_dir, drafter_dir = dd.demo_pair()
target = dd.load_target(target_dir, backend="numpy", progress=False)
drafter = dd.load_drafter(drafter_dir, target)
cfg = target.config
print(f"target: {cfg.num_hidden_layers} layers, H={cfg.num_attention_heads} heads, "
      f"C={cfg.kv_lora_rank} (kv_lora_rank), R={cfg.qk_rope_head_dim}, D={cfg.qk_nope_head_dim}, "
      f"V={cfg.vocab_size}")
print(f"drafter: block size B={drafter.block_size}, reads target layers {drafter.target_layer_ids}")

# %% [markdown]
# ## 1 · Prefill, draft, build the tree
#
# Prefill 32 bytes from a module held out of training (`gzip.py`), cut in the middle of a line;
# the target's argmax after them is the bonus token `b`, node 0 of the tree. The drafter then runs once on
# `[b, MASK x 15]` over the prompt's hidden features and gives logits for `L = 15` depths; the
# best-first build keeps the `BUDGET` most likely paths.

# %%
held_out = demo_metadata()["prompts"][3]                             # from gzip.py
PROMPT = np.asarray(held_out["ids"][114 - 32:114], np.int32)
P = len(PROMPT)
BUDGET = 20
tok = byte_label                                                     # token id -> label
print(repr(byte_text(PROMPT)))

cache = target.new_cache(64)
pre = target.forward(PROMPT, np.arange(P, dtype=np.int32), cache,
                     hidden_layer_ids=drafter.target_layer_ids)      # logits [P, V], hidden [P, 3, M]
b = int(pre.logits[-1].argmax())
logits = drafter.draft(pre.hidden, b, drafter.new_cache(64))         # [L, V]
L = logits.shape[0]

# the target's greedy continuation after b (autoregressive), to check the walk against below
greedy = [b] + dd.generate(target, None, np.append(PROMPT, b), L + 1, method="ar").tokens.tolist()
print("bonus b =", repr(tok(b)), " greedy continuation:", repr(byte_text(greedy[1:])))

lp, ids = ref.topk_logprobs(logits, min(BUDGET, cfg.vocab_size))    # [L, K]
tree = ref.build_tree(lp, ids, BUDGET)
N = tree.num_nodes
print(tree, "depths per level:", np.bincount(tree.depths)[1:])
print("drafter's top-1 p per depth:", np.round(np.exp(lp[:, 0]), 2))
draw_tree(tree, labels=tok, root_label=f"b={tok(b)}")
plt.gcf().set_size_inches(12, 6)
plt.show()

# %% [markdown]
# ## 2 · The visibility mask
#
# Node `i` sees node `j` iff `j` is `i` or an ancestor of `i`. In the verify forward the mask
# has one more block in front: every node sees all `P` prompt rows. `ref.mla_mask(P, N+1,
# parents)` is that `[N+1, P+N+1]` mask; its tree block is `ref.visibility(parents)`.

# %%
vis = ref.visibility(tree.parents)                                   # [N+1, N+1]
mask = ref.mla_mask(P, N + 1, tree.parents)                          # [N+1, P+N+1]
assert mask[:, :P].all() and np.array_equal(mask[:, P:], vis)
print("vis", vis.shape, " mask", mask.shape, " node 20 sees tree nodes", np.flatnonzero(vis[20]),
      "= path", tree.path(20))
show_visibility(vis)
plt.show()

# %% [markdown]
# ## 3 · The verify forward
#
# One forward over `[b, tokens…]` at positions `P + [0, depths…]` (a node's position is its
# depth after the prefix, so siblings share one) with `parents=`: it appends `N + 1` latent rows
# to the cache and returns logits for every node.

# %%
ids_tree = np.concatenate([[b], tree.tokens]).astype(np.int32)       # [N+1]
pos_tree = (P + np.concatenate([[0], tree.depths])).astype(np.int32)  # [N+1]
verify = target.forward(ids_tree, pos_tree, cache, parents=tree.parents,
                        hidden_layer_ids=drafter.target_layer_ids)    # logits [N+1, V]
S = len(cache)
print("cache rows:", S, "=", P, "prompt +", N + 1, "tree;  logits", verify.logits.shape)

# %% [markdown]
# ## 4 · Absorbed-MLA scores of one head in layer 0
#
# MLA caches one latent `c [C]` and one rope key `k_pe [R]` per token, nothing per head
# (docs/MODEL.md). The absorbed form folds `W_uk` into the query, `q_lat = W_uk[h]^T q_nope`,
# and scores the latents directly:
#
# `score[t, s] = (q_lat[t] · c[s] + q_pe[t] · k_pe[s]) * scale`, then `-inf` where the mask is
# false.
#
# We redo layer 0's query side by hand with the reference functions (the same calls the
# forward makes) and read `c` and `k_pe` from the cache the verify forward just wrote.

# %%
LAYER, HEAD = 0, 1
lw = target.layers[LAYER]
eps, H = cfg.rms_norm_eps, cfg.num_attention_heads
D, R = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
cos, sin = ref.rope_cos_sin(pos_tree, target.rope.inv_freq, target.rope.attention_factor)

x = ref.embedding(ids_tree, target.embed_tokens)                     # [N+1, M] layer 0's input
a = ref.rms_norm(x, lw.input_layernorm, eps)                         # [N+1, M]
q = ref.linear(ref.rms_norm(ref.linear(a, lw.q_a_proj), lw.q_a_layernorm, eps), lw.q_b_proj)
q = q.reshape(N + 1, H, D + R)                                       # [N+1, H, D+R]
q_nope = q[:, :, :D]                                                 # [N+1, H, D]
q_pe = ref.rope(q[:, :, D:], cos, sin, cfg.rope_interleave)          # [N+1, H, R]
c_kv, k_pe = cache.c_kv[LAYER, :S], cache.k_pe[LAYER, :S]            # [S, C], [S, R]

# the tree rows in the cache are what layer 0 computes from the same input
c_new, kpe_new = ref.mla_kv_latent(a, lw.kv_a_proj_with_mqa, lw.kv_a_layernorm, eps)
assert np.array_equal(c_kv[P:], c_new)
assert np.array_equal(k_pe[P:], ref.rope(kpe_new, cos, sin, cfg.rope_interleave))

w_uk, w_uv = ref.split_kv_b(lw.kv_b_proj, H, D)                      # [H, D, C], [H, Dv, C]
q_lat = q_nope[:, HEAD] @ w_uk[HEAD]                                 # [N+1, C]
scores = (q_lat @ c_kv.T + q_pe[:, HEAD] @ k_pe.T) * np.float32(target.rope.scale)  # [N+1, S]
masked = np.where(mask, scores, -np.inf)                             # [N+1, S]
print("q_nope", q_nope[:, HEAD].shape, "-> q_lat", q_lat.shape, "; scores", scores.shape)

fig, ax = plt.subplots(figsize=(11, 6.5))
im = ax.imshow(np.ma.masked_invalid(masked), cmap="coolwarm", aspect="auto",
               interpolation="nearest")
ax.imshow(np.where(mask, np.nan, 1.0), cmap="Greys", vmin=0, vmax=3, aspect="auto",
          interpolation="nearest")                                   # masked cells in grey
ax.axvline(P - 0.5, color="black", lw=1.5)
ax.set_xticks(range(S), [tok(t) for t in PROMPT] + [str(j) for j in range(N + 1)], fontsize=7)
ax.set_yticks(range(N + 1), [str(i) for i in range(N + 1)], fontsize=7)
ax.set_xlabel("key row: prompt bytes | tree node j")
ax.set_ylabel("query: tree node i")
ax.set_title(f"layer {LAYER}, head {HEAD}: absorbed-MLA scores (grey = masked, -inf)")
fig.colorbar(im, ax=ax, label="score", fraction=0.03, pad=0.02)
plt.show()

# %% [markdown]
# Each row is a softmax over its coloured cells only: the whole prompt plus the node's own
# root-to-node path, the same cells as row `i` of the visibility mask.
#
# ## 5 · Absorbed == naive
#
# The naive form (what HF transformers computes) first expands every cached latent into a
# per-head key `k_nope[s] = W_uk[h] c[s]` and value `v[s] = W_uv[h] c[s]`. Same scores, same
# outputs, up to float32 rounding — for this head's scores, and for layer 0's whole attention
# output over all heads.

# %%
k_nope = c_kv @ w_uk[HEAD].T                                         # [S, D] per-head keys
scores_naive = (q_nope[:, HEAD] @ k_nope.T + q_pe[:, HEAD] @ k_pe.T) * np.float32(target.rope.scale)
print("head scores: max |absorbed - naive| =", np.abs(scores - scores_naive).max(),
      " (max |score| =", np.abs(scores).max(), ")")
assert np.allclose(scores, scores_naive, rtol=1e-5, atol=1e-5)

args = (q_nope, q_pe, c_kv, k_pe, lw.kv_b_proj, mask, target.rope.scale)
o_abs = ref.mla_attention_absorbed(*args)                            # [N+1, H, Dv]
o_naive = ref.mla_attention_naive(*args)                             # [N+1, H, Dv]
print("attention output", o_abs.shape, ": max |absorbed - naive| =", np.abs(o_abs - o_naive).max())
assert np.allclose(o_abs, o_naive, rtol=1e-5, atol=1e-6)
print(f"per cached token and layer: absorbed reads C + R = {cfg.kv_lora_rank + R} floats, "
      f"naive would hold H (D + R + Dv) = {H * (D + R + cfg.v_head_dim)}")

# %% [markdown]
# ## 6 · The target's choice at every node, and the walk
#
# `post[i]` is the target's next token after node `i`'s path (argmax at T = 0). From the root,
# move to the child holding `post[current]` while one exists. Below, the small label right of
# each node is `post[i]`: green where a child holds it (the walk could continue there), grey
# where none does.

# %%
post = ref.sample_post(verify.logits, 0.0, seed=0)                   # [N+1] int32
keep, bonus = ref.follow_tree(tree, post)                            # [n] int32, int
print("node  token  parent  post  child holding post")
for i in range(N + 1):
    kids = [j for j in range(1, N + 1) if tree.parents[j] == i]
    hit = [j for j in kids if tree.tokens[j - 1] == post[i]]
    print(f"{i:4d}  {tok(ids_tree[i]):>5s}  {tree.parents[i]:6d}  {tok(post[i]):>4s}  "
          f"{('node ' + str(hit[0])) if hit else '-':>8s}{'   <- on the path' if i in keep else ''}")
print("keep:", keep, " emitted:", repr(byte_text([b] + [int(tree.tokens[j - 1]) for j in keep[1:]])),
      " new bonus:", repr(tok(bonus)))
assert [b] + [int(tree.tokens[j - 1]) for j in keep[1:]] + [bonus] == greedy[:len(keep) + 1]

fig, ax = plt.subplots(figsize=(12, 6))
draw_tree(tree, accepted=keep, ax=ax, labels=tok, root_label=f"b={tok(b)}")
xy = tree_layout(tree)
for i in range(N + 1):
    has = any(tree.parents[j] == i and tree.tokens[j - 1] == post[i] for j in range(1, N + 1))
    ax.annotate(f"post {tok(post[i])}", xy[i], xytext=(15, 4), textcoords="offset points", fontsize=7,
                color="#2a9d3a" if has else "#888888", fontweight="bold" if has else "normal",
                zorder=4, bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.8))
ax.set_title(f"accepted path {keep.tolist()}: b and {len(keep) - 1} drafted tokens emitted, "
             f"next bonus {tok(bonus)!r}")
plt.show()

# %% [markdown]
# The emitted tokens are exactly the target's greedy continuation: DDTree at T = 0 changes how
# many forwards it takes, never what is written.
#
# ## 7 · Node i's logits are a causal forward over its path
#
# What makes the tree forward correct: for every node, its logits equal those of an ordinary
# causal forward over prompt + its root-to-node path (each node at position `P + depth`). We
# check all `N + 1` nodes, one fresh cache each.

# %%
worst = []
for i in range(N + 1):
    path = tree.path(i)                                              # [0, ..., i]
    c = target.new_cache(64)
    target.forward(PROMPT, np.arange(P, dtype=np.int32), c)
    out = target.forward(ids_tree[path], (P + np.arange(len(path))).astype(np.int32), c)  # causal
    assert np.allclose(out.logits[-1], verify.logits[i], rtol=1e-4, atol=1e-5), f"node {i}"
    assert out.logits[-1].argmax() == post[i]
    worst.append(np.abs(out.logits[-1] - verify.logits[i]).max())
print(f"all {N + 1} nodes agree; max |tree - causal| over all nodes: {max(worst):.3g}")

# %% [markdown]
# `allclose` is the contract for the numpy forward; on most machines the difference is exactly
# 0, since numpy computes every row the same way whatever the rows around it. The GPU kernels
# make it bit for bit by design: they are batch invariant (docs/DESIGN.md §4), which is what
# lets greedy DDTree output equal greedy autoregressive output token for token.

#
# ## 8 · The GPU's GEMM precision
#
# On the cuda backend every projection runs on tensor cores, in a precision chosen at load time
# (`load_target(..., precision=...)`, docs/DESIGN.md §4). `"bf16"`, the default, rounds the
# activations to bf16 at each GEMM input, as bf16 inference does. `"fp32"` splits each operand into
# two bf16 and stays within ~1e-5 of float32. Their numpy twins are
# `reference.linear.linear(x, w, precision)`. Here is the verify forward's last projection, lm_head
# over every node's final hidden state, in the three arithmetics, against float64:

# %%
L = target.config.num_hidden_layers
c = target.new_cache(64)
target.forward(PROMPT, np.arange(P, dtype=np.int32), c)
h = target.forward(ids_tree, pos_tree, c, parents=tree.parents, hidden_layer_ids=(L - 1,)).hidden[:, 0]  # [N+1, M]
w_head = target.embed_tokens if target.config.tie_word_embeddings else target.lm_head      # [V, M]
exact = h.astype(np.float64) @ w_head.T.astype(np.float64)
for precision in (None, "fp32", "bf16"):
    y = ref.linear(h, w_head, precision)
    err = np.abs(y - exact).max() / np.abs(exact).max()
    same = (y.argmax(-1) == exact.argmax(-1)).mean()
    print(f"{precision or 'float32':>8}: max error {err:.1e} of the largest logit; "
          f"argmax equal to float64's at {same:.0%} of the {N + 1} nodes")

# %% [markdown]
# The precision decides how close the GPU's logits are to float32. It does not decide whether
# DDTree equals autoregressive decoding: batch invariance does. A node's logits are the bits of
# the same token decoded alone, in either precision, so the greedy tokens are the same.

# %% [markdown]
# DeepSeek-V3's released checkpoints store their matrices as float8 e4m3 with a float32 scale per
# 128 x 128 block. The GPU keeps them that way (`dtypes.BlockScaled`, a byte a weight): every e4m3
# value is exactly a bf16 value, so the tensor cores take the bytes as they are and the GEMM
# multiplies each block's partial sum by its scale. The twin takes the weight exactly too (value x
# scale in float64), so the fp8 path adds no weight rounding of its own. Here lm_head is quantized
# to fp8 as a DeepSeek-V3 checkpoint would be (per-block scale = max |w| / 448), then multiplied:

# %%
from ddtree_numba.dtypes import E4M3_TABLE, BlockScaled

def to_fp8(w, block=(128, 128)):
    """w [N, K] float32 -> BlockScaled: per-block scale max|w| / 448, bytes the nearest e4m3 value."""
    n, k = w.shape
    nb, kb = -(-n // block[0]), -(-k // block[1])
    scale = np.zeros((nb, kb), np.float32)
    for i in range(nb):
        for j in range(kb):
            scale[i, j] = max(np.abs(w[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]]).max() / 448, 1e-30)
    scaled = w / np.repeat(np.repeat(scale, block[0], 0), block[1], 1)[:n, :k]
    finite = np.where(np.isfinite(E4M3_TABLE), E4M3_TABLE, np.inf)
    order = np.argsort(finite[:256])
    nearest = order[np.abs(finite[order][None, :] - scaled.reshape(-1, 1)).argmin(1)]
    return BlockScaled(nearest.astype(np.uint8).reshape(n, k), scale, block)

w8 = to_fp8(w_head)
print(w8, f"- {w8.nbytes / 2 ** 10:.0f} KiB against {w_head.size * 2 / 2 ** 10:.0f} KiB in bf16")
for precision in ("fp32", "bf16"):
    y = ref.linear(h, w8, precision)
    exact8 = h.astype(np.float64) @ w8.dequantize(np.float64).T
    print(f"fp8 weights, {precision}: max error {np.abs(y - exact8).max() / np.abs(exact8).max():.1e} against the "
          f"fp8 model in float64; argmax equal to the float32 model's at {(y.argmax(-1) == exact.argmax(-1)).mean():.0%}")

# %% [markdown]
# Kimi K2 Thinking / K2.5 / K2.6 ship their routed experts as INT4 instead: symmetric 4-bit integers
# with a bf16 scale per group of 32 inputs, eight values packed into each int32 word
# (compressed-tensors' "pack-quantized" format; `dtypes.Int4Grouped`). The GPU keeps the words and
# decodes the nibbles inside the GEMM, half a byte a weight. The same lm_head in INT4:

# %%
from ddtree_numba.dtypes import Int4Grouped

group = 32
amax = np.abs(w_head).reshape(w_head.shape[0], -1, group).max(-1)                  # [V, M / 32]
scale4 = np.maximum(amax / 7.5, 1e-30).astype(np.float32)
q4 = np.clip(np.rint(w_head / np.repeat(scale4, group, axis=1)), -8, 7).astype(np.int64)
w4 = Int4Grouped(Int4Grouped.pack(q4), scale4, group, w_head.shape[1])
y4 = ref.linear(h, w4, "bf16")
print(w4, f"- {w4.data.nbytes / 2 ** 10:.0f} KiB of words; argmax equal to the float32 model's at "
      f"{(y4.argmax(-1) == exact.argmax(-1)).mean():.0%} of the nodes "
      f"(max logit change {np.abs(y4 - exact).max() / np.abs(exact).max():.1e}: 4 bits is coarse)")
