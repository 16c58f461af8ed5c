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


# -- the device tier's twins (kernels.rope's signatures, on numpy arrays) ------------------------

def dest_rows(n: int, row0) -> np.ndarray:
    """Where the device tier writes rows r < n: r (``row0`` None), r + row0[0] (a row0 array, e.g.
    the cache length), or, for a ``kernels.PoolRows`` (its ``seqs`` [S, 4] = (s0, t, row0, slot)
    a sequence), its sequence's row slot * slot_rows + layer_row0 + s0 + (r - row0) of a flattened
    pool, -1 for a row of no sequence (not written). -> [n] int64."""
    r = np.arange(n, dtype=np.int64)
    if row0 is None:
        return r
    if not hasattr(row0, "seqs"):
        return r + int(row0[0])
    out = np.full(n, -1, np.int64)
    for s0, t, first, slot in np.asarray(row0.seqs, np.int64):
        mine = (r >= first) & (r < first + t)
        out[mine] = slot * row0.slot_rows + row0.layer_row0 + s0 + (r[mine] - first)
    return out


def enqueue_rope(src, dst, positions, inv_freq, n_rows, *, rdim, interleave, groups=1, src_col0=0, src_stride=0,
                 dst_col0=0, dst_stride=0, attention_factor=1.0, dst_row0=None, second=None, stream=0) -> None:
    """Twin of ``kernels.rope.enqueue_rope`` (its signature and docstring; numpy arrays): for r < n =
    n_rows[0] and g < ``groups``, the ``rdim`` values src[r, src_col0 + g*src_stride :][:rdim]
    rotated by ``rope`` at the angles of ``rope_cos_sin(positions[:n], inv_freq, attention_factor)``
    go to dst[dest row of r, dst_col0 + g*dst_stride :][:rdim] (``dest_rows``); ``second`` (a dict of
    src, dst, groups, src_col0, src_stride, dst_col0, dst_stride, dst_row0) does the same for a
    second set of vectors of the same rows. Every source is read before anything is written."""
    n = int(n_rows[0])
    cos, sin = rope_cos_sin(np.asarray(positions[:n]), np.asarray(inv_freq), attention_factor)   # [n, rdim/2]
    jobs = [dict(src=src, dst=dst, groups=groups, src_col0=src_col0, src_stride=src_stride, dst_col0=dst_col0,
                 dst_stride=dst_stride, dst_row0=dst_row0)]
    if second is not None:
        jobs.append(dict(dict(groups=1, src_col0=0, src_stride=0, dst_col0=0, dst_stride=0, dst_row0=None), **second))
    rotated = [[rope(np.ascontiguousarray(j["src"][:n, j["src_col0"] + g * j["src_stride"]:][:, :rdim]), cos, sin,
                     interleave) for g in range(j["groups"])] for j in jobs]
    for j, values in zip(jobs, rotated):
        rows = dest_rows(n, j["dst_row0"])
        live = rows >= 0
        for g, v in enumerate(values):
            c0 = j["dst_col0"] + g * j["dst_stride"]
            j["dst"][rows[live], c0:c0 + rdim] = v[live]
