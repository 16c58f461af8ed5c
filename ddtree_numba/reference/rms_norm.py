"""RMSNorm (used for the layer norms, the q / kv latent norms, the final norm, and a DFlash
drafter's per-head q / k norms).

Shapes: T rows, M features.
"""

from __future__ import annotations

import numpy as np

from .rope import rope


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
