"""Token embedding and the output head.

Shapes: T tokens, M hidden size, V vocab.
"""

from __future__ import annotations

import numpy as np


def embedding(ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Row gather: ``x[t] = table[ids[t]]``.

    ids [T] int32/int64 in [0, V), table [V, M] float32 -> x [T, M] float32 (a copy).
    """
    return np.ascontiguousarray(table[ids], dtype=np.float32)         # [T, M]


def lm_head(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Logits from the final-normed hidden state.

    x [T, M] float32, weight [V, M] float32 (``lm_head.weight``, or the embedding table when
    ``tie_word_embeddings``) -> logits [T, V] float32.
    """
    return np.matmul(x, weight.T, dtype=np.float32)                  # [T, V]
