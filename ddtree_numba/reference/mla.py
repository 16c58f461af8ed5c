"""Multi-head latent attention (DeepSeek-V2 paper, arXiv:2405.04434, section 2.1) in its two forms.

Shapes: T new tokens, S key rows (cached + new), H heads, C ``kv_lora_rank``, R
``qk_rope_head_dim``, D ``qk_nope_head_dim``, Dv ``v_head_dim``, M hidden size.

Every token writes one latent row ``c_kv [C]`` (RMS-normed) and one shared rope key ``k_pe [R]``
(rotated) to the cache; nothing per head. ``kv_b_proj.weight`` viewed as ``[H, D + Dv, C]`` holds
``W_uk [H, D, C]`` (latent -> per-head nope key) and ``W_uv [H, Dv, C]`` (latent -> per-head value).

Naive:     k[s,h] = (W_uk[h] c_kv[s], k_pe[s]),  v[s,h] = W_uv[h] c_kv[s],  ordinary attention.
Absorbed:  q_nope[t,h] . (W_uk[h] c_kv[s]) = (W_uk[h]^T q_nope[t,h]) . c_kv[s], so map the query
           into the latent space once and attend over the cached c_kv directly; the weighted sum
           of latents goes through W_uv[h] afterwards. Same numbers, no per-head K or V.
See docs/MODEL.md for the algebra.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import BlockScaled
from .linear import U32, accumulation_bound, bf16_round, linear
from .rms_norm import rms_norm
from .visibility import visibility


def mla_kv_latent(x: np.ndarray, kv_a_weight: np.ndarray, kv_a_norm_weight: np.ndarray, eps: float):
    """The per-token cache row before rope: ``kv_a_proj_with_mqa`` split into the normed latent and
    the (not yet rotated) rope key.

    x [T, M] float32, kv_a_weight [C + R, M], kv_a_norm_weight [C] -> c_kv [T, C] float32,
    k_pe [T, R] float32.
    """
    c = kv_a_norm_weight.shape[0]
    kv = np.matmul(x, kv_a_weight.T, dtype=np.float32)               # [T, C + R]
    c_kv = rms_norm(kv[:, :c], kv_a_norm_weight, eps)                 # [T, C]
    k_pe = np.ascontiguousarray(kv[:, c:])                            # [T, R]
    return c_kv, k_pe


def mla_mask(n_cached: int, n_new: int, parents: np.ndarray | None = None) -> np.ndarray:
    """Which key rows each new token sees: every cached row, plus causal (``parents`` None) or
    ``visibility(parents)`` among the new rows (docs/DESIGN.md §1, step 4).

    -> mask [T, S] bool with T = n_new, S = n_cached + n_new.
    """
    mask = np.ones((n_new, n_cached + n_new), dtype=bool)             # [T, S]
    if parents is None:
        mask[:, n_cached:] = np.tril(np.ones((n_new, n_new), dtype=bool))
    else:
        mask[:, n_cached:] = visibility(parents)                      # [T, T]
    return mask


def _masked_softmax(scores: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Softmax over the last axis of scores [T, H, S] where mask [T, S] is true (float32)."""
    scores = np.where(mask[:, None, :], scores, np.float32(-np.inf))  # [T, H, S]
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = np.exp(scores, dtype=np.float32)
    return p / p.sum(axis=-1, keepdims=True, dtype=np.float32)        # [T, H, S]


def split_kv_b(kv_b_weight: np.ndarray, num_heads: int, nope_dim: int):
    """``kv_b_proj.weight [H * (D + Dv), C]`` -> W_uk [H, D, C], W_uv [H, Dv, C] (views)."""
    w = kv_b_weight.reshape(num_heads, -1, kv_b_weight.shape[-1])     # [H, D + Dv, C]
    return w[:, :nope_dim, :], w[:, nope_dim:, :]


def absorption_weights(kv_b_weight, num_heads: int, nope_dim: int):
    """``kv_b_proj.weight [H * (D + Dv), C]`` -> w_uk_t [H, C, D], w_uv [H, Dv, C], C-contiguous in
    the weight's dtype: the per-head ``[Z, N, K]`` weights of the two absorption GEMMs (q_lat =
    q_nope @ W_uk as ``q_nope @ w_uk_t[h].T``; out = o_lat @ W_uv^T), the layout
    ``kernels.enqueue_linear_heads`` takes.

    A ``dtypes.BlockScaled`` (fp8) weight stays block-scaled when its blocks (bo, bi) do not
    straddle heads or the nope / value split (D and D + Dv multiples of bo): the transposed w_uk_t
    then has (bi, bo) blocks. Otherwise it is dequantized to float32 first."""
    if isinstance(kv_b_weight, BlockScaled):
        bo, bi = kv_b_weight.block
        n, c = kv_b_weight.shape
        per_head = n // num_heads
        if nope_dim % bo or per_head % bo:
            return absorption_weights(kv_b_weight.dequantize(), num_heads, nope_dim)
        data = np.asarray(kv_b_weight.data).reshape(num_heads, per_head, c)
        scale = np.asarray(kv_b_weight.scale).reshape(num_heads, per_head // bo, -1)
        db = nope_dim // bo
        return (BlockScaled(np.ascontiguousarray(data[:, :nope_dim].transpose(0, 2, 1)),
                            np.ascontiguousarray(scale[:, :db].transpose(0, 2, 1)), (bi, bo)),
                BlockScaled(np.ascontiguousarray(data[:, nope_dim:]), np.ascontiguousarray(scale[:, db:]), (bo, bi)))
    w_uk, w_uv = split_kv_b(np.asarray(kv_b_weight), num_heads, nope_dim)  # [H, D, C], [H, Dv, C]
    return (np.ascontiguousarray(w_uk.transpose(0, 2, 1)),                  # [H, C, D]
            np.ascontiguousarray(w_uv))                                     # [H, Dv, C]


def mla_attention_naive(q_nope, q_pe, c_kv, k_pe, kv_b_weight, mask, scale):
    """MLA with the latents expanded into per-head keys and values, as in the paper.

    q_nope [T, H, D], q_pe [T, H, R] (rotated), c_kv [S, C], k_pe [S, R] (rotated),
    kv_b_weight [H * (D + Dv), C], mask [T, S] bool, scale float -> out [T, H, Dv] float32.
    """
    t, h, d = q_nope.shape
    w_uk, w_uv = split_kv_b(kv_b_weight, h, d)                       # [H, D, C], [H, Dv, C]
    k_nope = np.einsum("hdc,sc->shd", w_uk, c_kv, dtype=np.float32)   # [S, H, D]
    v = np.einsum("hvc,sc->shv", w_uv, c_kv, dtype=np.float32)        # [S, H, Dv]
    scores = (np.einsum("thd,shd->ths", q_nope, k_nope, dtype=np.float32)
              + np.einsum("thr,sr->ths", q_pe, k_pe, dtype=np.float32)) * np.float32(scale)  # [T, H, S]
    p = _masked_softmax(scores, mask)                                 # [T, H, S]
    return np.einsum("ths,shv->thv", p, v, dtype=np.float32)          # [T, H, Dv]


def mla_attention_absorbed(q_nope, q_pe, c_kv, k_pe, kv_b_weight, mask, scale, key_chunk=None):
    """MLA over the cached latents directly: queries absorbed into the latent space through
    W_uk, output taken out of it through W_uv. Same arguments and result as the naive form.

    q_nope [T, H, D], q_pe [T, H, R], c_kv [S, C], k_pe [S, R], kv_b_weight [H * (D + Dv), C],
    mask [T, S] bool, scale float -> out [T, H, Dv] float32. ``key_chunk``: None takes the softmax
    over all visible keys at once; an int takes it the GPU's way (``chunked_attention``).
    """
    t, h, d = q_nope.shape
    w_uk, w_uv = split_kv_b(kv_b_weight, h, d)                       # [H, D, C], [H, Dv, C]
    q_lat = np.einsum("thd,hdc->thc", q_nope, w_uk, dtype=np.float32) # [T, H, C]
    scores = (np.einsum("thc,sc->ths", q_lat, c_kv, dtype=np.float32)
              + np.einsum("thr,sr->ths", q_pe, k_pe, dtype=np.float32)) * np.float32(scale)  # [T, H, S]
    if key_chunk is None:
        p = _masked_softmax(scores, mask)                             # [T, H, S]
        o_lat = np.einsum("ths,sc->thc", p, c_kv, dtype=np.float32)   # [T, H, C]
    else:
        o_lat = chunked_attention(scores, mask, c_kv, key_chunk)      # [T, H, C]
    return np.einsum("thc,hvc->thv", o_lat, w_uv, dtype=np.float32)   # [T, H, Dv]


def mma_scores(q_lat, q_pe, c_kv, k_pe, scale):
    """The absorbed attention's scores on tensor cores (``kernels.mla.MMA_SCORES``): queries and
    keys rounded to bf16, their products summed exactly, times ``scale``; and the bound on the
    kernel's distance from it (its float32 accumulation in 16-channel mma steps and 64-channel
    chunks, ``reference.linear.accumulation_bound``, plus the scale's rounding).

    q_lat [T, H, C], q_pe [T, H, R], c_kv [S, C], k_pe [S, R] float32 -> (scores, bound), each
    [T, H, S] float64. Each score is a function of its own query row and key row only (what batch
    invariance needs)."""
    t, h, c = q_lat.shape
    q = np.concatenate([q_lat, q_pe], axis=2).reshape(t * h, -1).astype(np.float32)   # [T*H, C+R]
    k = np.concatenate([c_kv, k_pe], axis=1).astype(np.float32)                       # [S, C+R]
    raw = linear(q, k, "bf16").astype(np.float64)          # exact sums, rounded once to float32
    bound = accumulation_bound(q, k, "bf16")
    sc = float(np.float32(scale))
    scores = raw * sc
    return scores.reshape(t, h, -1), ((bound * abs(sc)) + 2.0 ** -23 * np.abs(scores)).reshape(t, h, -1)


def mma_pv(p, values):
    """One key chunk's p @ values on tensor cores (``kernels.mla.MMA_PV``): p and the values
    rounded to bf16, their products summed exactly; l the exact sum of the bf16 p (the same mma
    steps against a row of ones). With the bounds on the kernel's distance: its float32
    accumulation, ceil(n / 16) mma steps of at most two roundings each, plus the twin's own.

    p [rows, n] float32 (the chunk's keys by visible index), values [n, C] float32 (their latents)
    -> (o [rows, C], l [rows], o_bound [rows, C], l_bound [rows]), float64."""
    pb = bf16_round(np.asarray(p, np.float32)).astype(np.float64)
    vb = bf16_round(np.asarray(values, np.float32)).astype(np.float64)
    o, l = pb @ vb, pb.sum(axis=1)
    roundings = 2 * -(-p.shape[1] // 16) + 2
    return o, l, roundings * U32 * (np.abs(pb) @ np.abs(vb)) + 1e-30, roundings * U32 * np.abs(pb).sum(axis=1) + 1e-30


def chunked_attention(scores: np.ndarray, mask: np.ndarray, values: np.ndarray, key_chunk: int) -> np.ndarray:
    """softmax(scores) @ values over each query's visible keys, split as the GPU splits it.

    scores [T, H, S] float32, mask [T, S] bool, values [S, C] float32 -> [T, H, C] float32.

    A query's visible keys, in cache order, are cut into chunks of ``key_chunk`` by their *visible
    index* (the j-th key the query sees), not by cache position. Chunk k gets its own max m_k,
    p = exp(score - m_k), l_k = sum p and o_k = p @ values; then, with M = max_k m_k and
    w_k = exp(m_k - M), out = (sum_k w_k o_k) / (sum_k w_k l_k), the sums in ascending k.
    Mathematically the plain softmax. The point of the visible index: a tree node and the same
    token decoded alone see the same key sequence at different positions, so they cut it at the
    same places and combine the same partials in the same order (docs/DESIGN.md §4).
    """
    t, h, _ = scores.shape
    out = np.zeros((t, h, values.shape[1]), np.float32)              # [T, H, C]
    for i in range(t):
        vis = np.flatnonzero(mask[i])                                 # visible keys, ascending
        ms, ls, os_ = [], [], []
        for k0 in range(0, len(vis), key_chunk):
            keys = vis[k0:k0 + key_chunk]
            sc = scores[i][:, keys]                                   # [H, chunk]
            m = sc.max(axis=1)                                        # [H]
            p = np.exp(sc - m[:, None], dtype=np.float32)             # [H, chunk]
            ms.append(m)
            ls.append(p.sum(axis=1, dtype=np.float32))
            os_.append(np.matmul(p, values[keys], dtype=np.float32))  # [H, C]
        big = np.max(ms, axis=0)                                      # [H]
        o = np.zeros((h, values.shape[1]), np.float32)
        l_sum = np.zeros(h, np.float32)
        for m, l_k, o_k in zip(ms, ls, os_):
            w = np.exp(m - big, dtype=np.float32)                     # [H]
            o = o + w[:, None] * o_k
            l_sum = l_sum + w * l_k
        out[i] = o / l_sum[:, None]
    return out


def enqueue_mla_attention(q_lat, q_pe, c_kv, k_pe, out_lat, *, vis_bits, meta, scale, scratch=None, tiles=None,
                          seqs=None, max_rows=None, precision=None, stream=0) -> None:
    """Twin of ``kernels.mla.enqueue_mla_attention`` (its signature and docstring; numpy arrays):
    the absorbed attention between its two absorptions, in float64, rounded once. For query i < t,
    (s0, t) = meta[:2]: out_lat[i, h*C:(h+1)*C] = softmax_s(scale * (q_lat[i, h] . c_kv[s] +
    q_pe[i, h] . k_pe[s])) @ c_kv over the keys it sees: every cached key s < s0, and new key s0 + j
    when bit j of vis_bits[i] is set. With ``seqs`` [S, 4] = (s0, t, row0, slot) a sequence, each
    sequence's queries are rows row0 .. row0 + t (its vis_bits rows over its own new rows) and its
    keys c_kv[slot] / k_pe[slot] ([slots, S_cap, C] / [slots, S_cap, R]); ``meta`` is not read.
    Rows of no query are not written. ``scratch``, ``tiles``, ``max_rows``, ``precision`` and
    ``stream`` say how the GPU computes it (float32 chains or bf16 tensor cores: within
    ``mma_scores`` / ``mma_pv``'s bounds of this), not what."""
    c, r = c_kv.shape[-1], k_pe.shape[-1]
    h = q_lat.shape[1] // c
    layout = ([(int(meta[0]), int(meta[1]), 0, None)] if seqs is None
              else [tuple(int(v) for v in row) for row in np.asarray(seqs)])
    for s0, t, row0, slot in layout:
        keys, pes = (c_kv, k_pe) if slot is None else (c_kv[slot], k_pe[slot])
        keys, pes = keys[:s0 + t].astype(np.float64), pes[:s0 + t].astype(np.float64)   # [s0 + t, C], [.., R]
        rows = slice(row0, row0 + t)
        q = q_lat[rows].reshape(t, h, c).astype(np.float64)                            # [t, H, C]
        qp = q_pe[rows].reshape(t, h, r).astype(np.float64)                            # [t, H, R]
        new = (np.asarray(vis_bits[rows])[:, np.arange(t) // 32] >> (np.arange(t) % 32).astype(np.uint32)) & 1
        mask = np.concatenate([np.ones((t, s0), bool), new.astype(bool)], axis=1)        # [t, s0 + t]
        sc = (np.einsum("thc,sc->ths", q, keys) + np.einsum("thr,sr->ths", qp, pes)) * float(scale)
        sc = np.where(mask[:, None, :], sc, -np.inf)
        p = np.exp(sc - sc.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out_lat[rows] = np.einsum("ths,sc->thc", p, keys).reshape(t, h * c)
