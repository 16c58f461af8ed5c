"""RMSNorm (used for the layer norms, the q / kv latent norms and the final norm).

Shapes: T rows, M features.
"""

from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """``weight * x / sqrt(mean(x^2) + eps)`` per row, in float32 (as DeepseekV3RMSNorm).

    x [T, M] float32, weight [M] float32 -> [T, M] float32.
    """
    x = x.astype(np.float32, copy=False)
    var = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)   # [T, 1]
    inv = (np.float32(1.0) / np.sqrt(var + np.float32(eps))).astype(np.float32)
    return weight.astype(np.float32, copy=False) * (x * inv)          # [T, M]
