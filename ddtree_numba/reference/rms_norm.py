"""RMSNorm (used for the layer norms, the q / kv latent norms, the final norm, and a DFlash
drafter's per-head q / k norms).

Shapes: T rows, M features.
"""

from __future__ import annotations

import numpy as np

from .rope import dest_rows, rope


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """``weight * x / sqrt(mean(x^2) + eps)`` per row, in float32 (as DeepseekV3RMSNorm).

    x [T, M] float32, weight [M] float32 -> [T, M] float32.
    """
    x = x.astype(np.float32, copy=False)
    var = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)   # [T, 1]
    inv = (np.float32(1.0) / np.sqrt(var + np.float32(eps))).astype(np.float32)
    return weight.astype(np.float32, copy=False) * (x * inv)          # [T, M]


def head_norm_rope(x: np.ndarray, weight: np.ndarray, eps: float, cos: np.ndarray, sin: np.ndarray,
                   interleave: bool) -> np.ndarray:
    """Qwen3 attention's per-head query / key norm, then RoPE (a DFlash drafter layer):
    ``rope(rms_norm(x, weight, eps), cos, sin, interleave)`` over each head.

    x [T, H, Dh] float32, weight [Dh] float32, cos / sin [T, Dh/2] float32 -> [T, H, Dh] float32.
    """
    return rope(rms_norm(x, weight, eps), cos, sin, interleave=interleave)


def enqueue_rms_norm(x, weight, eps, out, n_rows, *, out_row0=None, second=None, stream=0) -> None:
    """Twin of ``kernels.rms_norm.enqueue_rms_norm`` (its signature, numpy arrays): out[dest row of
    r, :M] = rms_norm(x[r, :M]) for r < n_rows[0], M = weight.shape[0], the rows placed by
    ``rope.dest_rows`` (``out_row0``: None, a row0 array or a ``PoolRows``); ``second`` = (weight1,
    out1, src_col1, out_row1) norms x[r, src_col1 : src_col1 + M1] into out1 the same way."""
    n = int(n_rows[0])
    jobs = [(weight, out, 0, out_row0)] + ([tuple(second)] if second is not None else [])
    normed = [rms_norm(x[:n, col:col + w.shape[0]], w, eps) for w, _, col, _ in jobs]   # every read first
    for (w, dst, _, row0), y in zip(jobs, normed):
        rows = dest_rows(n, row0)
        live = rows >= 0
        dst[rows[live], :w.shape[0]] = y[live]
