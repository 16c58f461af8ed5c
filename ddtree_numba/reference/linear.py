"""Dense projection, the matmul every other stage is built from.

Shapes: T tokens, I input features, O output features.

``precision`` None is float32 arithmetic (``torch.nn.Linear`` in float32; what the numpy target
runs). 'bf16' and 'fp32' are the twins of the GPU's tensor-core GEMMs (``kernels.linear``):
the same bf16 operands rounded at the same points, their products summed exactly, so the
kernel differs from the twin only by its float32 accumulation (``accumulation_bound``).

A quantized weight (``dtypes.BlockScaled`` float8, ``dtypes.Int4Grouped`` int4) enters the
tensor-core GEMM as its values, which bf16 holds exactly, and its block scales multiply the chunk
partials: the twin's weight is the exact (float64) product of value and scale, never rounded to
bf16.
"""

from __future__ import annotations

import numpy as np

from .._checks import check_precision
from ..dtypes import QUANTIZED, bf16_to_float32, from_storage, to_bf16_bits
from .rms_norm import rms_norm

U32 = 2.0 ** -23           # one float32 rounding, relative, allowing truncation as well as nearest


def bf16_round(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), as float32."""
    return bf16_to_float32(to_bf16_bits(a))


def bf16_split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo), both bf16 values as float32: hi = bf16(a), lo = bf16(a - hi); hi + lo is a to
    within 2^-16 of |a| (a bf16 value splits as (a, 0))."""
    hi = bf16_round(a)
    return hi, bf16_round(np.asarray(a, np.float32) - hi)


def gemm_terms(x: np.ndarray, weight: np.ndarray, precision: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (activation, weight) operand pairs whose products a tensor-core GEMM of ``precision``
    adds, in the order it adds them within a k step: 'bf16': (bf16(x), bf16(w)); 'fp32': (xh, wh),
    (xl, wh), (xh, wl) of the bf16 splits (wl = 0 for bf16 weights, so the kernels skip it). A
    ``BlockScaled`` weight is taken exactly (float64 e4m3 x scale): (bf16(x), w), or (xh, w), (xl, w)."""
    if isinstance(weight, QUANTIZED):
        w = weight.dequantize(np.float64)
        if precision == "bf16":
            return [(bf16_round(x), w)]
        check_precision(precision)
        xh, xl = bf16_split(x)
        return [(xh, w), (xl, w)]
    if precision == "bf16":
        return [(bf16_round(x), bf16_round(weight))]
    check_precision(precision)
    (xh, xl), (wh, wl) = bf16_split(x), bf16_split(weight)
    return [(xh, wh), (xl, wh), (xh, wl)]


def linear(x: np.ndarray, weight, precision: str | None = None) -> np.ndarray:
    """``y = x @ weight.T`` as ``torch.nn.Linear`` without bias.

    x [T, I] float32, weight [O, I] float32 (HF layout: out features first) or a ``BlockScaled``
    float8 matrix -> y [T, O] float32.
    ``precision``: None (float32 arithmetic), or 'bf16' / 'fp32' (the tensor-core GEMM's operands,
    their products summed exactly in float64 and rounded once; module docstring).
    """
    if precision is None:
        if isinstance(weight, QUANTIZED):
            weight = weight.dequantize()
        return np.matmul(x, weight.T, dtype=np.float32)              # [T, O]
    y = sum(np.matmul(a.astype(np.float64), b.T.astype(np.float64)) for a, b in gemm_terms(x, weight, precision))
    return np.asarray(y, np.float32)


def accumulation_bound(x: np.ndarray, weight, precision: str, chunk: int = 64) -> np.ndarray:
    """[T, O] bound on |kernel - twin| for a tensor-core GEMM of ``precision`` (``linear``): the
    kernel adds the same exact products in float32, ceil(I/16) mma steps of each term, then the
    ceil(I/chunk) chunk partials, each at most two roundings (an mma aligns its products to the
    largest and rounds the sum) or one (a chunk add; two with a float8 block scale, whose chunks
    are gcd(chunk, bi) wide) of ``U32`` relative to the running sum of magnitudes; plus the
    twin's own final rounding."""
    terms = gemm_terms(x, weight, precision)
    k = x.shape[-1]
    per_chunk = 1
    if isinstance(weight, QUANTIZED):
        chunk, per_chunk = np.gcd(chunk, weight.block[1]), 2
    roundings = 2 * len(terms) * -(-k // 16) + per_chunk * -(-k // chunk) + 2    # 2: an mma may round twice
    mag = sum(np.abs(a).astype(np.float64) @ np.abs(b).T.astype(np.float64) for a, b in terms)
    return roundings * U32 * mag + 1e-30


def swiglu_bound(x: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, precision: str) -> tuple[np.ndarray, np.ndarray]:
    """(twin, bound) [T, O] float64 for ``silu(x @ w_gate.T) * (x @ w_up.T)`` by tensor-core GEMMs of
    ``precision``: the accumulation bounds of both GEMMs carried through silu (|silu'| <= 1.1)
    and the product, plus a few float32 roundings of the activation itself."""
    g = linear(x, w_gate, precision).astype(np.float64)
    u = linear(x, w_up, precision).astype(np.float64)
    bg, bu = accumulation_bound(x, w_gate, precision), accumulation_bound(x, w_up, precision)
    silu = g / (1 + np.exp(-g))
    want = silu * u
    return want, 1.1 * bg * (np.abs(u) + bu) + np.abs(silu) * bu + 8 * 2.0 ** -24 * np.abs(want) + 1e-30


# -- the device tier's twins: kernels.linear's ``enqueue_*`` signatures, on numpy arrays ----------
# (``tile`` and ``stream`` are the kernels'; here they change nothing, as on the GPU they change no
# bit.) The kernels match these within ``accumulation_bound``: the twin sums each output exactly.

def enqueue_linear(x, w, out, n_rows, *, precision, accumulate=False, tile=None, norm=None, norm_head=None,
                   stream=0) -> None:
    """out[:n] (+)= linear(x[:n], w, precision) for n = n_rows[0]; twin of
    ``kernels.linear.enqueue_linear``. x [R, K] float32, w [N, K] stored (float32 / float16 /
    uint16 bfloat16 bits), out [R, N] float32 (rows from n on untouched), n_rows [>= 1] int32.
    ``norm`` = (weight [K], eps, scratch): the product of ``rms_norm(x[:n], weight, eps)`` instead
    (scratch unused here; the kernel writes the normed rows there). ``norm_head`` [H, K] (with
    ``norm``): the product of [rms_norm(norm_head); x[H:n]] (x[:H] unused here; the kernel
    writes norm_head's norms there)."""
    n = int(n_rows[0])
    if norm is None:
        rows = x[:n]
    elif norm_head is None:
        rows = rms_norm(x[:n], norm[0], norm[1])
    else:
        head = norm_head.shape[0]
        rows = np.concatenate([rms_norm(norm_head, norm[0], norm[1]), x[head:n]])[:n]
    y = linear(rows, from_storage(w), precision)                     # [n, N]
    out[:n] = out[:n] + y if accumulate else y


def enqueue_linear_heads(x, x_group_stride, w, out, n_rows, *, precision, tile=None, stream=0) -> None:
    """out[r, z*N : (z+1)*N] = linear(x[r, z*s : z*s + K], w[z], precision) for r < n_rows[0] and
    each group z of w [Z, N, K], s = ``x_group_stride``; twin of ``kernels.linear.enqueue_linear_heads``.
    x [R, >= Z*s] float32, out [R, Z*N] float32."""
    n = int(n_rows[0])
    Z, N, K = w.shape
    for z in range(Z):
        xz = x[:n, z * x_group_stride:z * x_group_stride + K]           # [n, K]
        out[:n, z * N:(z + 1) * N] = linear(xz, from_storage(w[z]), precision)
