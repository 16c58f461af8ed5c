"""Mixture-of-experts: routing for every ``scoring_func`` x ``topk_method``, SwiGLU experts,
shared experts and the dense MLP of the first ``first_k_dense_replace`` layers.

Shapes: T tokens, M hidden size, E routed experts, G groups (``n_group``), K experts per token
(``num_experts_per_tok``), I expert intermediate size.

Routing (docs/MODEL.md; DeepSeek-V3 ``inference/model.py`` Gate, transformers' routers):
  scores  = softmax(logits) or sigmoid(logits)                        [T, E]
  choice  = scores + e_score_correction_bias   (noaux_tc only)        [T, E]
  greedy:               top-K of choice
  group_limited_greedy: keep the topk_group groups with the largest max(choice), then top-K
  noaux_tc:             keep the topk_group groups with the largest sum of their two best
                        choice values, then top-K
  weights = scores at the chosen experts (the bias only chooses), divided by their sum if
            norm_topk_prob, then times routed_scaling_factor.
Ties go to the lower expert / group id (a stable sort), so routing is deterministic.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import from_storage
from .linear import enqueue_linear, linear
from .rms_norm import rms_norm


def _top(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest per row, best first, ties to the lower index. [T, X] -> [T, k]."""
    return np.argsort(-values, axis=-1, kind="stable")[:, :k]


def moe_route(x, gate_weight, e_score_correction_bias, scoring_func, topk_method, n_group,
              topk_group, top_k, norm_topk_prob, routed_scaling_factor):
    """Pick each token's experts and their weights.

    x [T, M] float32, gate_weight [E, M] float32, e_score_correction_bias [E] float32 or None
    (used by noaux_tc only) -> topk_ids [T, K] int32 (best first), topk_weights [T, K] float32.
    """
    logits = np.matmul(x, gate_weight.T, dtype=np.float32)            # [T, E]
    if scoring_func == "softmax":
        z = np.exp(logits - logits.max(axis=-1, keepdims=True), dtype=np.float32)
        scores = z / z.sum(axis=-1, keepdims=True, dtype=np.float32)  # [T, E]
    elif scoring_func == "sigmoid":
        scores = (np.float32(1) / (np.float32(1) + np.exp(-logits))).astype(np.float32)  # [T, E]
    else:
        raise ValueError(f"scoring_func {scoring_func!r} is not softmax or sigmoid")

    t, e = scores.shape
    choice = scores
    if topk_method == "noaux_tc":
        if e_score_correction_bias is None:
            raise ValueError("noaux_tc routing needs e_score_correction_bias")
        choice = scores + e_score_correction_bias.astype(np.float32)[None, :]  # [T, E]
    if topk_method in ("group_limited_greedy", "noaux_tc"):
        grouped = choice.reshape(t, n_group, e // n_group)             # [T, G, E/G]
        if topk_method == "group_limited_greedy":
            group_scores = grouped.max(axis=-1)                        # [T, G]
        else:
            group_scores = -np.sort(-grouped, axis=-1)[:, :, :2].sum(axis=-1)  # [T, G]
        keep = np.zeros((t, n_group), dtype=bool)
        np.put_along_axis(keep, _top(group_scores, topk_group), True, axis=-1)
        choice = np.where(np.repeat(keep, e // n_group, axis=-1), choice, -np.inf)  # [T, E]
    elif topk_method != "greedy":
        raise ValueError(f"topk_method {topk_method!r} is not greedy, group_limited_greedy or noaux_tc")

    ids = _top(choice, top_k).astype(np.int32)                         # [T, K]
    weights = np.take_along_axis(scores, ids, axis=-1)                 # [T, K]
    if norm_topk_prob:
        weights = weights / (weights.sum(axis=-1, keepdims=True, dtype=np.float32) + np.float32(1e-20))
    return ids, (weights * np.float32(routed_scaling_factor)).astype(np.float32)


def swiglu_mlp(x, gate_weight, up_weight, down_weight):
    """``down(silu(gate(x)) * up(x))``: the dense MLP, a shared expert block, or one routed expert.

    x [T, M] float32, gate_weight / up_weight [I, M], down_weight [M, I] -> [T, M] float32.
    """
    g = np.matmul(x, gate_weight.T, dtype=np.float32)                 # [T, I]
    u = np.matmul(x, up_weight.T, dtype=np.float32)                   # [T, I]
    a = g / (np.float32(1) + np.exp(-g)) * u                           # [T, I] silu(g) * u
    return np.matmul(a, down_weight.T, dtype=np.float32)              # [T, M]


def enqueue_swiglu_mlp(x, gate_w, up_w, down_w, out, *, act, n_rows, precision, accumulate=False, tile=None,
                       norm=None, stream=0) -> None:
    """out[:n] (+)= down(silu(gate(x[:n])) * up(x[:n])) with the tensor-core GEMMs of ``precision``
    (``reference.linear.linear``), the activation left in act[:n]; twin of
    ``kernels.moe.enqueue_swiglu_mlp`` (its signature, numpy arrays). x [R, M] float32, gate_w /
    up_w [I, M] and down_w [M, I] stored (float32 / float16 / uint16 bfloat16 bits), act [R, I]
    and out [R, M] float32, n_rows [>= 1] int32. ``norm`` = (weight [M], eps, scratch): the MLP of
    ``rms_norm(x[:n], weight, eps)`` (scratch unused here; the kernel writes the normed rows there)."""
    n = int(n_rows[0])
    rows = x[:n] if norm is None else rms_norm(x[:n], norm[0], norm[1])
    act[:n] = _swiglu_act(rows, gate_w, up_w, precision)             # [n, I]
    enqueue_linear(act, down_w, out, n_rows, precision=precision, accumulate=accumulate)


def _swiglu_act(x, gate_w, up_w, precision):
    """silu(gate(x)) * up(x) with the GEMMs of ``precision``; stored weights. x [T, M] -> [T, I]."""
    g = linear(x, from_storage(gate_w), precision)                    # [T, I]
    u = linear(x, from_storage(up_w), precision)                      # [T, I]
    return g / (np.float32(1) + np.exp(-g)) * u                       # [T, I] silu(g) * u


def enqueue_moe_block(m, x, *, gate, bias, experts_gate, experts_up, experts_down, shared_gate=None, shared_up=None,
                      shared_down=None, route, bufs=None, n_rows, precision, tile=None, concurrent=None,
                      offsets=None, stream=0) -> None:
    """Twin of ``kernels.moe.enqueue_moe_block`` (its signature and docstring; numpy arrays): x[r] +=
    routed(m[r]) + shared(m[r]) for r < n_rows[0]. The route is ``moe_route`` of the ``MoERoute``
    ``route`` (in float32, as HF routes); each routed expert and the shared one a SwiGLU MLP with the
    GEMMs of ``precision``, the experts' outputs weighted by their routing weights. ``bufs`` (the
    kernels' buffers), ``tile``, ``concurrent`` and ``stream`` say how the GPU runs it, not what.
    m / x [>= n, M] float32, gate [E, M], experts_gate / up [E, I, M], experts_down [E, M, I],
    shared_* [Is, M] / [M, Is] or None, weights stored (float32 / float16 / uint16 bfloat16 bits).
    ``offsets`` [E + 1] int32 or None: the rows routed to each expert, as slot offsets
    (offsets[e + 1] - offsets[e] rows to expert e, offsets[0] = 0)."""
    n = int(n_rows[0])
    ids, w = moe_route(m[:n], from_storage(gate), bias, route.scoring_func, route.topk_method, route.n_group,
                       route.topk_group, route.top_k, route.norm_topk_prob, route.routed_scaling_factor)  # [n, K]
    if offsets is not None:
        counts = np.bincount(ids.ravel(), minlength=offsets.shape[0] - 1)         # [E] rows per expert
        offsets[0] = 0
        offsets[1:] = np.cumsum(counts)
    y = np.zeros((n, x.shape[1]), np.float32)                         # [n, M]
    for e in np.unique(ids):
        rows, k = np.nonzero(ids == e)
        a = _swiglu_act(m[rows], experts_gate[e], experts_up[e], precision)
        y[rows] += w[rows, k][:, None] * linear(a, from_storage(experts_down[e]), precision)
    if shared_gate is not None:
        y += linear(_swiglu_act(m[:n], shared_gate, shared_up, precision), from_storage(shared_down), precision)
    x[:n] += y


def work_item_capacity(n_experts, n_slots, item_rows):
    """How many work items ``expert_work_items`` can make at most: the experts holding any of
    the ``n_slots`` slots are at most min(E, n_slots), and past each one's first item every
    item holds ``item_rows`` slots of its own, so at most min(E, S) + S // item_rows."""
    return min(n_experts, n_slots) + n_slots // item_rows


def expert_work_items(offsets, item_rows, capacity):
    """The grouped expert GEMMs' work items (the twin of the counting sort's table): each
    expert's slots offsets[e] .. offsets[e+1] cut into runs of ``item_rows``, experts ascending,
    runs ascending. offsets [E+1] int -> int32 [3 * capacity], item y = (expert, first slot, end
    slot) at 3y .. 3y+2; the items past the last are (0, 0, 0), empty. A GPU block takes one item,
    so no block is launched for an expert without rows (``kernels.moe``)."""
    items = np.zeros(3 * capacity, np.int32)
    y = 0
    for e in range(len(offsets) - 1):
        for first in range(offsets[e], offsets[e + 1], item_rows):
            if y == capacity:
                raise ValueError(f"the work items of offsets {list(offsets)} at {item_rows} rows need more "
                                 f"than {capacity}")
            items[3 * y:3 * y + 3] = e, first, min(first + item_rows, offsets[e + 1])
            y += 1
    return items


def moe_experts(x, topk_ids, topk_weights, gate_weights, up_weights, down_weights):
    """Weighted sum of each token's routed experts, summed in increasing expert id.

    x [T, M] float32, topk_ids [T, K] int32, topk_weights [T, K] float32, gate_weights /
    up_weights [E, I, M], down_weights [E, M, I] -> [T, M] float32.
    """
    out = np.zeros_like(x, dtype=np.float32)                           # [T, M]
    for e in np.unique(topk_ids):
        rows, slot = np.nonzero(topk_ids == e)                         # tokens routed to e
        y = swiglu_mlp(x[rows], gate_weights[e], up_weights[e], down_weights[e])  # [n, M]
        out[rows] += y * topk_weights[rows, slot][:, None]
    return out
