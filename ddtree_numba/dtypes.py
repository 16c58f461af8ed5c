"""Weight storage dtypes: the one table of the package, and the bit helpers numpy lacks.

numpy has no bfloat16 or float8 dtype. A bfloat16 word travels as its uint16 bit pattern (the
top half of a float32, so widening is a 16-bit shift), a float8 e4m3 byte as uint8. Arithmetic is
always float32 (docs/DESIGN.md §4): the numpy backend widens weights when it loads them;
the cuda backend keeps matrices in their storage dtype and widens them in registers
(``kernels/_widen.py``, the device side of this table).
"""

from __future__ import annotations

import numpy as np

# The weight dtypes a matrix may be stored in on the device, by the name users pass
# (``load_target(..., weight_dtype=name)``), to the numpy dtype that holds it.
WEIGHT_DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
                 "bfloat16": np.dtype(np.uint16)}
STORAGE_DTYPES = tuple(WEIGHT_DTYPES.values())      # for shape/dtype checks of stored weights


def check_weight_dtype(name) -> str:
    """``name`` if it is a key of ``WEIGHT_DTYPES``, else a ``ValueError`` listing them."""
    if name not in WEIGHT_DTYPES:
        raise ValueError(f"weight_dtype must be one of {sorted(WEIGHT_DTYPES)}, got {name!r}")
    return name


def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even (exact for values that
    came from bf16)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def bf16_to_float32(words: np.ndarray) -> np.ndarray:
    """Raw bfloat16 words (uint16) -> float32, exactly (bf16 is a truncated float32)."""
    return (words.astype(np.uint32) << 16).view(np.float32)


def to_storage(a: np.ndarray, name: str) -> np.ndarray:
    """A float32 matrix stored as weight dtype ``name`` (C-contiguous; bfloat16 as uint16 bits)."""
    if name == "bfloat16":
        return to_bf16_bits(a)
    if name == "float16" and a.size and np.abs(a).max() > np.finfo(np.float16).max:
        raise ValueError(f"a weight of shape {list(a.shape)} holds {float(np.abs(a).max()):.4g}, beyond float16's "
                         "range (65504): store it as bfloat16 or float32")
    return np.ascontiguousarray(a, dtype=WEIGHT_DTYPES[check_weight_dtype(name)])


def lossless_weight_dtype(stored: set[str]) -> str:
    """The narrowest weight dtype that holds every stored matrix exactly, from the safetensors
    dtype strings of the matrices: 'bfloat16' or 'float16' when all are, else 'float32' (fp8 is
    dequantized with its block scales, so float32)."""
    if stored == {"BF16"}:
        return "bfloat16"
    if stored == {"F16"}:
        return "float16"
    return "float32"


def _e4m3_table() -> np.ndarray:
    """float32 value of every float8 e4m3fn byte: 1 sign, 4 exponent (bias 7), 3 mantissa bits,
    no infinities, 0x7f / 0xff are NaN."""
    b = np.arange(256, dtype=np.uint32)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = (b & 0x7).astype(np.float64)
    normal = (1.0 + man / 8.0) * np.exp2(exp.astype(np.float64) - 7.0)
    subnormal = (man / 8.0) * 2.0 ** -6
    v = sign * np.where(exp == 0, subnormal, normal)
    v[(b & 0x7F) == 0x7F] = np.nan
    return v.astype(np.float32)


E4M3_TABLE = _e4m3_table()


def e4m3_to_float32(raw: np.ndarray) -> np.ndarray:
    """Raw float8 e4m3fn bytes (uint8) -> float32."""
    return E4M3_TABLE[raw]
