"""Token embedding and the output head.

Shapes: T tokens, M hidden size, V vocab.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import from_storage


def embedding(ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Row gather: ``x[t] = table[ids[t]]``.

    ids [T] int32/int64 in [0, V), table [V, M] float32 -> x [T, M] float32 (a copy).
    """
    return np.ascontiguousarray(table[ids], dtype=np.float32)         # [T, M]


def enqueue_embedding(ids, table, out, n_rows, *, stream=0) -> None:
    """out[r] = table[ids[r]] as float32 for r < n_rows[0], a NaN row for an id outside [0, V);
    twin of ``kernels.embedding.enqueue_embedding`` (its signature, numpy arrays). ids [R] int32,
    table [V, M] stored (float32 / float16 / uint16 bfloat16 bits), out [R', M] float32."""
    n = int(n_rows[0])
    ids = np.asarray(ids[:n])
    ok = (ids >= 0) & (ids < table.shape[0])
    out[:n] = np.nan
    out[:n][ok] = embedding(ids[ok], from_storage(table))


def lm_head(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Logits from the final-normed hidden state.

    x [T, M] float32, weight [V, M] float32 (``lm_head.weight``, or the embedding table when
    ``tie_word_embeddings``) -> logits [T, V] float32.
    """
    return np.matmul(x, weight.T, dtype=np.float32)                  # [T, V]
