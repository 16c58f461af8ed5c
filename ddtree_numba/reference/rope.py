"""Rotary position embedding: inverse frequencies (default and YaRN), cos/sin, the rotation in
both layouts, and YaRN's correction of the softmax scale.

Shapes: T tokens, R rope dim (``qk_rope_head_dim``), R2 = R / 2 frequencies, H heads.

Layouts. DeepSeek releases rotate *interleaved pairs* ``(x0, x1), (x2, x3), ...`` with frequency
``i`` on pair ``i`` (``rope_interleave: true``; DeepSeek-V2's complex-number form is the same).
NeoX ``rotate_half`` pairs ``x[i]`` with ``x[i + R2]``. Because q and k are rotated the same way,
attention scores do not depend on how the pairs are laid out in memory, only on which elements
form a pair. YaRN: Peng et al. 2023, arXiv:2309.00071; the formulas follow transformers'
``_compute_yarn_parameters`` and DeepSeek-V3's ``yarn_get_mscale``.
"""

from __future__ import annotations

import math

import numpy as np


def rope_inv_freq(dim: int, theta: float) -> np.ndarray:
    """Default frequencies ``theta ** (-2i / dim)``. -> inv_freq [R2] float64."""
    return 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)  # [R2]


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction ``0.1 * mscale * ln(scale) + 1`` (1 when ``scale <= 1``)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_inv_freq(dim: int, theta: float, factor: float, original_max_position_embeddings: int,
                  beta_fast: float = 32.0, beta_slow: float = 1.0, truncate: bool = True) -> np.ndarray:
    """YaRN "NTK-by-parts" frequencies: high frequencies kept, low ones divided by ``factor``,
    a linear ramp between the dims where ``beta_fast`` and ``beta_slow`` rotations fit in the
    original context. -> inv_freq [R2] float64.
    """
    def correction_dim(rotations):
        return dim * math.log(original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001                                                  # avoid 0 / 0 in the ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)  # [R2]
    extrapolation = rope_inv_freq(dim, theta)                          # [R2] original
    interpolation = extrapolation / factor                             # [R2] stretched
    keep = 1.0 - ramp                                                  # 1 = keep original
    return interpolation * (1.0 - keep) + extrapolation * keep         # [R2]


def yarn_attention_factor(factor: float, mscale: float | None, mscale_all_dim: float | None,
                          attention_factor: float | None = None) -> float:
    """Scale YaRN puts on cos and sin (transformers' rule): explicit ``attention_factor``, else
    ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)`` when both are set, else
    ``mscale(factor)``."""
    if attention_factor is not None:
        return float(attention_factor)
    if mscale and mscale_all_dim:
        return yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
    return yarn_get_mscale(factor)


def softmax_scale(qk_head_dim: int, factor: float | None = None, mscale_all_dim: float | None = None) -> float:
    """``1 / sqrt(qk_head_dim)``, times ``mscale(factor, mscale_all_dim) ** 2`` under YaRN with a
    nonzero ``mscale_all_dim`` (DeepSeek-V3 folds the YaRN magnitude into the softmax scale)."""
    scale = qk_head_dim ** -0.5
    if factor is not None and mscale_all_dim:
        m = yarn_get_mscale(factor, mscale_all_dim)
        scale = scale * m * m
    return scale


def rope_cos_sin(positions: np.ndarray, inv_freq: np.ndarray, attention_factor: float = 1.0):
    """Per-token angles ``positions[t] * inv_freq[i]`` (float64), returned as float32 cos and sin
    already multiplied by ``attention_factor``.

    positions [T] int, inv_freq [R2] float -> cos [T, R2] float32, sin [T, R2] float32.
    """
    angles = positions.astype(np.float64)[:, None] * inv_freq[None, :].astype(np.float64)  # [T, R2]
    cos = (np.cos(angles) * attention_factor).astype(np.float32)       # [T, R2]
    sin = (np.sin(angles) * attention_factor).astype(np.float32)       # [T, R2]
    return cos, sin


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleave: bool) -> np.ndarray:
    """Rotate each pair by its token's angle, keeping the input layout.

    x [T, ..., R] float32 (e.g. [T, H, R] queries or [T, R] keys), cos/sin [T, R2] float32
    -> [T, ..., R] float32. ``interleave``: pairs are ``(x[2i], x[2i+1])``; else ``(x[i], x[i+R2])``.
    """
    r2 = x.shape[-1] // 2
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (r2,)
    c, s = cos.reshape(shape), sin.reshape(shape)                      # [T, 1.., R2]
    if interleave:
        a, b = x[..., 0::2], x[..., 1::2]                              # [T, .., R2] each
    else:
        a, b = x[..., :r2], x[..., r2:]                                # [T, .., R2] each
    out = np.empty_like(x, dtype=np.float32)
    ra, rb = a * c - b * s, b * c + a * s
    if interleave:
        out[..., 0::2], out[..., 1::2] = ra, rb
    else:
        out[..., :r2], out[..., r2:] = ra, rb
    return out                                                         # [T, .., R]
