"""Grouped-query attention without a mask, as the DFlash drafter uses it: every block query
sees every context key and the whole block (non-causal).

Shapes: T queries, S keys, Hq query heads, Hkv key/value heads (Hq a multiple of Hkv),
Dh head dim.
"""

from __future__ import annotations

import numpy as np


def gqa_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float,
                  mask: np.ndarray | None = None) -> np.ndarray:
    """``softmax(q k^T * scale) v`` per head; query head h reads key/value head ``h // (Hq / Hkv)``
    (transformers' ``repeat_kv``). Scores and softmax in float32, max subtracted first.

    q [T, Hq, Dh], k [S, Hkv, Dh], v [S, Hkv, Dh] float32, mask [T, S] bool or None (all visible)
    -> [T, Hq, Dh] float32.
    """
    t, hq, dh = q.shape
    s, hkv, _ = k.shape
    if hq % hkv:
        raise ValueError(f"{hq} query heads are not a multiple of {hkv} key/value heads")
    g = hq // hkv
    qg = q.reshape(t, hkv, g, dh)                                      # [T, Hkv, G, Dh]
    scores = np.einsum("tkgd,skd->kgts", qg, k, dtype=np.float32) * np.float32(scale)  # [Hkv, G, T, S]
    if mask is not None:
        scores = np.where(mask[None, None], scores, np.float32(-np.inf))
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = np.exp(scores, dtype=np.float32)
    p = p / p.sum(axis=-1, keepdims=True, dtype=np.float32)            # [Hkv, G, T, S]
    o = np.einsum("kgts,skd->tkgd", p, v, dtype=np.float32)            # [T, Hkv, G, Dh]
    return np.ascontiguousarray(o.reshape(t, hq, dh))                  # [T, Hq, Dh]


def enqueue_gqa_attention(q, k_ctx, v_ctx, out, *, meta, scale, scratch, k_blk=None, v_blk=None, mask=None,
                          tiles=None, fuse=None, method=None, warp_tiles=None, stream=0) -> None:
    """Twin of ``kernels.gqa.enqueue_gqa_attention`` (its signature and docstring; numpy arrays, and
    the kernel's ``GQAScratch`` of which only the head dim, scratch.o.shape[2], is read, as the
    kernel reads it): out[:t] = ``gqa_attention`` of q[:t] over the keys context rows [0, s) of
    k_ctx / v_ctx, then block rows [0, t) of k_blk / v_blk (if given), (s, t) = meta[:2], under
    mask[:t, :keys] (or none). q [Tq, Hq*Dh], k_ctx / v_ctx [S_cap, Hkv*Dh], out [Tq, Hq*Dh].
    A batch of sequences: k_ctx / v_ctx [S, S_cap, Hkv*Dh], meta [S, 2] = (s, t) a sequence, and
    q / k_blk / v_blk / out in S equal runs of rows, run z sequence z's (no mask). ``tiles``,
    ``fuse``, ``method``, ``warp_tiles`` and ``stream`` say how the GPU computes it, not what."""
    if np.asarray(k_ctx).ndim == 3:
        S = k_ctx.shape[0]
        per = q.shape[0] // S
        for z in range(S):
            rows = slice(z * per, (z + 1) * per)
            enqueue_gqa_attention(q[rows], k_ctx[z], v_ctx[z], out[rows], meta=np.asarray(meta)[z], scale=scale,
                                  scratch=scratch, k_blk=None if k_blk is None else k_blk[rows],
                                  v_blk=None if v_blk is None else v_blk[rows])
        return
    s, t = int(meta[0]), int(meta[1])
    if t == 0:
        return
    dh = scratch.o.shape[2]
    hq, hkv = q.shape[1] // dh, k_ctx.shape[1] // dh
    k, v = k_ctx[:s], v_ctx[:s]
    if k_blk is not None:
        k, v = np.concatenate([k, k_blk[:t]]), np.concatenate([v, v_blk[:t]])   # [s + t, Hkv*Dh]
    m = None if mask is None else np.asarray(mask)[:t, :k.shape[0]]
    o = gqa_attention(q[:t].reshape(t, hq, dh), k.reshape(-1, hkv, dh), v.reshape(-1, hkv, dh), scale, m)
    out[:t] = o.reshape(t, hq * dh)
