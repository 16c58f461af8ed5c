"""Top-K log-probabilities per draft depth (docs/DESIGN.md §1, step 2).

Shapes: L depths, V vocabulary, K kept tokens per depth.
"""

from __future__ import annotations

from math import comb

import numpy as np

from .._checks import check_array, check_int, check_logits_values


def topk_logprobs(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Log-softmax of each row and its ``k`` best tokens.

    logits [L, V] float32 -> (lp [L, K] float32, ids [L, K] int32), sorted by descending
    logit, ties to the lower token id. The log-sum-exp is accumulated in float64 as
    ``lse = m + log1p(rest)``, m the row's max and rest the sum of exp(x - m) over every entry but
    one that equals m (``lp = float32(float64(x) - lse)``), so the float32 result does not depend
    on the order of the reduction, except when the last-ulp difference of two orders (or of two
    exp / log implementations) crosses a float32 rounding midpoint: the kernels reproduce it bit
    for bit in every test. Why rest and not the whole sum s = 1 + rest: in a confident row rest is
    ~1e-7, and s's rounding at 1 (2^-53, different in each order) moved the top entry's lp, itself
    ~-1e-7, by a float32 ulp or two in about 1 % of such rows; rest's own rounding is relative to
    rest.
    """
    check_array("logits", logits, 2, np.float32)
    L, V = logits.shape
    k = check_int("k", k, 0, V)
    check_logits_values("logits", logits)
    x = logits.astype(np.float64)                                   # [L, V]
    m = x.max(axis=1, keepdims=True) if V else np.zeros((L, 1))     # [L, 1]
    with np.errstate(invalid="ignore"):                             # a row of -inf: NaN, as before
        terms = np.exp(x - m)                                       # [L, V], exactly 1 at each max
    if V:
        terms[np.arange(L), np.argmax(x, axis=1)] = 0.0             # one max: its 1 is log1p's
    lse = m + np.log1p(terms.sum(axis=1, keepdims=True))            # [L, 1]
    # stable sort on the negated logit: equal logits keep ascending token order
    order = np.argsort(-logits, axis=1, kind="stable")[:, :k]       # [L, K]
    ids = order.astype(np.int32)
    lp = (np.take_along_axis(x, order, axis=1) - lse).astype(np.float32)
    return lp, ids


def slice_of(ids, slices: int, run: int) -> np.ndarray:
    """The slice that holds each token id when a row is dealt out in runs of ``run`` consecutive
    ids to ``slices`` slices in turn (run r to slice r % slices), as the GPU's split top-K deals it
    (its run: min(``kernels.topk.SLICE_RUN`` = 32, its block's threads)). ids int array -> same shape."""
    return (np.asarray(ids) // run) % slices


def fallback_odds(k: int, slices: int, cap: int) -> float:
    """A union bound on how often ``capped_merge`` falls back for a row whose top k tokens fall on
    the slices at random: slices x P(Binomial(k - 1, 1 / slices) >= cap), each slice's share of the
    top k - 1 being that binomial (a full list's last token ranks inside the top k - 1 only when its
    slice holds cap of them). ``kernels.topk._split`` picks caps that keep this small."""
    p = 1 / slices
    return min(1.0, slices * sum(comb(k - 1, i) * p ** i * (1 - p) ** (k - 1 - i) for i in range(cap, k)))


def capped_merge(row: np.ndarray, k: int, slices: int, cap: int, run: int) -> tuple[np.ndarray, bool]:
    """How the GPU's split top-K finds one row's top k from capped slice lists (``kernels.topk``,
    issue 15), step by step: the row is dealt out in runs of ``run`` consecutive entries to
    ``slices`` slices in turn (run r to slice r % slices; the kernel's run is min(SLICE_RUN = 32,
    its block's threads)); each slice keeps its ``cap`` best tokens (larger logit, then the lower
    id); the merge takes the k best of their union. That is the row's top k unless a slice held
    more than cap of it, and the merge cannot see that directly, so it falls back to the whole row
    whenever a *full* list (cap tokens of a slice of more) has its last token ranked above k - 1 in
    the union: every token a list left out is below its last, so with no such list every left-out
    token ranks k or lower (``fallback_odds``: how often, for a row spread at random).

    row [V] float32 -> (ids [min(k, union)] int32: the union's k best, fallback: bool). When
    ``fallback`` is False, ids are ``topk_logprobs(row[None], k)[1][0]`` (tests/test_topk.py holds
    this to brute force); when True the kernel recomputes the row's top k from the whole row."""
    check_array("row", row, 1, np.float32)
    V = row.shape[0]
    k = check_int("k", k, 1, V)
    slices = check_int("slices", slices, 1)
    cap = check_int("cap", cap, 1, k)
    run = check_int("run", run, 1)
    order = np.lexsort((np.arange(V), -row.astype(np.float64)))      # the row's order, best first
    place = np.empty(V, np.int64)
    place[order] = np.arange(V)                                      # each token's rank in the row
    slice_ids = slice_of(np.arange(V), slices, run)
    union, lasts = [], []
    for b in range(slices):
        mine = np.flatnonzero(slice_ids == b)
        best = mine[np.argsort(place[mine], kind="stable")][:cap]    # the slice's list, best first
        union.append(best)
        if mine.shape[0] > cap:
            lasts.append(best[-1])                                   # a full list's last token
    union = np.concatenate(union)
    ranked = union[np.argsort(place[union], kind="stable")]          # the union, best first
    rank_in_union = {int(v): r for r, v in enumerate(ranked)}
    fallback = any(rank_in_union[int(v)] < k - 1 for v in lasts)
    return ranked[:k].astype(np.int32), bool(fallback)
