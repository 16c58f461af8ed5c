"""KV-cache compaction after acceptance (docs/DESIGN.md §1, step 7).

Shapes: S cache rows, W row width, n accepted nodes.

The twin is the plain gather ``rows[start + i] = rows[start + keep[i]]``. Doing it in
place with one thread per row races, because ``keep[i] >= i``: thread i reads row
``start + keep[i]``, which thread ``keep[i]`` may already have overwritten.
``naive_row_hazards`` lists those read/write pairs and ``naive_gather_in_order`` replays
the per-row copies in any thread order, so a test or notebook can watch it go wrong.
"""

from __future__ import annotations

import numpy as np

from .._checks import check_compact_inputs


def compact_rows(rows: np.ndarray, start: int, keep: np.ndarray) -> None:
    """In place: ``rows[start + i] = rows[start + keep[i]]`` for every i.

    rows [S, W], start int, keep [n] int32 (keep[0] = 0, strictly increasing). Rows
    before ``start`` and from ``start + n`` on are left as they were.
    """
    start = check_compact_inputs(rows, start, keep)
    rows[start:start + keep.shape[0]] = rows[start + keep]  # fancy index copies first


def enqueue_compact_rows(rows, start_n, keep, *, n_max, method="columns", scratch=None, second=None,
                         stream=0) -> None:
    """``compact_rows(rows, start, keep[:n])`` for (start, n) = start_n[0:2], of every layer of a
    [layers, S, W] ``rows`` alike, and of ``second`` (another such array) if given; twin of
    ``kernels.compact.enqueue_compact_rows`` (its signature, numpy arrays: ``n_max``, ``method``,
    ``scratch`` and ``stream`` choose how the GPU moves the rows, not where they go). Groups: start_n
    [G, 2] and keep [G, >= n_g] move the G equal runs of layers each by its own (start, n) and keep."""
    start_n, keep = np.asarray(start_n), np.asarray(keep)
    if start_n.ndim == 1:
        start_n, keep = start_n[None], keep[None]
    G = start_n.shape[0]
    for a in (rows,) if second is None else (rows, second):
        layers = a if a.ndim == 3 else a[None]
        per = layers.shape[0] // G
        for g in range(G):
            start, n = int(start_n[g, 0]), int(start_n[g, 1])
            if n:
                for layer in layers[g * per:(g + 1) * per]:
                    compact_rows(layer, start, keep[g, :n])


def naive_row_hazards(keep: np.ndarray) -> list[tuple[int, int]]:
    """Pairs (reader i, writer j) where thread i reads the row thread j writes (i != j)."""
    return [(i, int(k)) for i, k in enumerate(keep) if k != i and k < len(keep)]


def naive_gather_in_order(rows: np.ndarray, start: int, keep: np.ndarray, order) -> np.ndarray:
    """One-thread-per-row in-place gather with the threads run one by one in ``order``.

    Returns a new array; any order is a schedule a GPU may pick. Increasing order is safe
    (each row is read before a later write can reach it); decreasing order is not.
    """
    out = rows.copy()
    for i in order:
        out[start + i] = out[start + keep[i]]
    return out
