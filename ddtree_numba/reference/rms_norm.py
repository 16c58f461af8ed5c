"""RMSNorm (used for the layer norms, the q / kv latent norms, the final norm, and a DFlash
drafter's per-head q / k norms).

Shapes: T rows, M features.
"""

from __future__ import annotations

import numpy as np

from .rope import dest_rows, rope, rope_cos_sin


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


def enqueue_rms_norm(x, weight, eps, out, n_rows, *, src_col0=0, out_row0=None, second=None, stream=0) -> None:
    """Twin of ``kernels.rms_norm.enqueue_rms_norm`` (its signature, numpy arrays): out[dest row of
    r, :M] = rms_norm(x[r, c0 : c0 + M]) for r < n_rows[0], M = weight.shape[0], c0 = ``src_col0``, the rows placed by
    ``rope.dest_rows`` (``out_row0``: None, a row0 array or a ``PoolRows``); ``second`` = (weight1,
    out1, src_col1, out_row1) norms x[r, src_col1 : src_col1 + M1] into out1 the same way."""
    n = int(n_rows[0])
    jobs = [(weight, out, int(src_col0), out_row0)] + ([tuple(second)] if second is not None else [])
    normed = [rms_norm(x[:n, col:col + w.shape[0]], w, eps) for w, _, col, _ in jobs]   # every read first
    for (w, dst, _, row0), y in zip(jobs, normed):
        rows = dest_rows(n, row0)
        live = rows >= 0
        dst[rows[live], :w.shape[0]] = y[live]


def enqueue_qkv_norm_rope(qkv, meta, q_norm, k_norm, eps, inv_freq, *, n_q_heads, n_kv_heads, interleave,
                          k_cache, v_cache, stream=0) -> None:
    """Twin of ``kernels.rms_norm.enqueue_qkv_norm_rope`` (its signature and docstring; numpy
    arrays): over a stacked q | k | v projection qkv [B + Nf, (Hq + 2 Hkv) * Dh], (s0, n, _, B) =
    meta[:4], ``head_norm_rope`` of the block rows' q and k heads in place (positions s0 + n + j;
    their v untouched), and of the new context rows' keys (positions s0 + c, c < n) into
    k_cache[s0 + c], their values copied into v_cache[s0 + c] (their queries ignored). A batch:
    meta [S, 4] = (s0, n, c0, B) a sequence, k_cache / v_cache [S, S_cap, Hkv*Dh]; sequence z's
    block at rows [z B, (z + 1) B), its context rows at S B + c0 + [0, n)."""
    meta = np.asarray(meta)
    if meta.ndim == 2:
        S, nb = meta.shape[0], int(meta[0, 3])
        for z, (s0, n, c0, _) in enumerate(meta):
            rows = np.concatenate([np.arange(z * nb, (z + 1) * nb), S * nb + c0 + np.arange(n)])
            part = qkv[rows]                                            # (a copy: written back below)
            enqueue_qkv_norm_rope(part, np.array([s0, n, 0, nb], np.int32), q_norm, k_norm, eps, inv_freq,
                                  n_q_heads=n_q_heads, n_kv_heads=n_kv_heads, interleave=interleave,
                                  k_cache=k_cache[z], v_cache=v_cache[z])
            qkv[rows] = part
        return
    s0, n, nb = int(meta[0]), int(meta[1]), int(meta[3])
    dh, hq, hkv = q_norm.shape[0], n_q_heads, n_kv_heads
    heads = qkv.reshape(qkv.shape[0], hq + 2 * hkv, dh)                # [B + Nf, H, Dh] (a view)
    blk_cos, blk_sin = rope_cos_sin(s0 + n + np.arange(nb), inv_freq)
    ctx_cos, ctx_sin = rope_cos_sin(s0 + np.arange(n), inv_freq)
    block, ctx = heads[:nb], heads[nb:nb + n]
    q = head_norm_rope(block[:, :hq], q_norm, eps, blk_cos, blk_sin, interleave)
    k = head_norm_rope(block[:, hq:hq + hkv], k_norm, eps, blk_cos, blk_sin, interleave)
    block[:, :hq], block[:, hq:hq + hkv] = q, k
    k_cache[s0:s0 + n] = head_norm_rope(ctx[:, hq:hq + hkv], k_norm, eps, ctx_cos, ctx_sin,
                                        interleave).reshape(n, hkv * dh)
    v_cache[s0:s0 + n] = ctx[:, hq + hkv:].reshape(n, hkv * dh)
