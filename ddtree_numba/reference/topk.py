"""Top-K log-probabilities per draft depth (docs/DESIGN.md §1, step 2).

Shapes: L depths, V vocabulary, K kept tokens per depth.
"""

from __future__ import annotations

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
