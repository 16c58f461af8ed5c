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
FLOAT8 = "float8"      # load_target's weight_dtype that keeps an fp8 checkpoint's matrices as stored (BlockScaled)


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


def from_storage(a: np.ndarray) -> np.ndarray:
    """A stored weight (float32, float16, or bfloat16 as uint16 bits) as float32, exactly: the
    inverse of ``to_storage`` (the kernels widen it so in registers, ``kernels/_widen.py``)."""
    return bf16_to_float32(a) if a.dtype == np.uint16 else np.asarray(a, np.float32)


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
    dtype strings of the matrices: 'bfloat16' or 'float16' when all are, else 'float32'.
    (fp8 matrices that the GPU keeps as stored, ``BlockScaled``, are left out by the caller.)"""
    if not stored or stored == {"BF16"}:
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


class BlockScaled:
    """A float8 e4m3 matrix (or a stack of them) kept as stored, with its block scales:

        w[..., n, k] = e4m3(data[..., n, k]) * scale[..., n // bo, k // bi],  block = (bo, bi).

    data [..., N, K] uint8 (raw e4m3fn bytes), scale [..., ceil(N/bo), ceil(K/bi)] float32;
    numpy arrays on the host, device arrays on the GPU (``to_device``). DeepSeek-V3's fp8
    checkpoints store their matrices this way (``weight_scale_inv``, 128 x 128 blocks); the
    cuda backend multiplies them as they are (``kernels.linear``: every e4m3 value is exact in
    bf16, and the scale multiplies each block's partial sum), so they occupy a byte a weight.
    """

    dtype_name = "float8_e4m3"

    def __init__(self, data, scale, block):
        bo, bi = (int(b) for b in block)
        if bo < 1 or bi < 1:
            raise ValueError(f"block sizes must be positive, got {tuple(block)}")
        if np.dtype(data.dtype) != np.uint8:
            raise ValueError(f"float8 data must be raw bytes (uint8), got {np.dtype(data.dtype)}")
        if np.dtype(scale.dtype) != np.float32:
            raise ValueError(f"block scales must be float32, got {np.dtype(scale.dtype)}")
        if data.ndim < 2:
            raise ValueError(f"float8 data must be a matrix or a stack of them, got shape {tuple(data.shape)}")
        n, k = tuple(data.shape)[-2:]
        want = tuple(data.shape)[:-2] + (-(-n // bo), -(-k // bi))
        if tuple(scale.shape) != want:
            raise ValueError(f"block scales have shape {list(scale.shape)}; a {list(data.shape)} weight in "
                             f"{bo}x{bi} blocks needs {list(want)}")
        self.data, self.scale, self.block = data, scale, (bo, bi)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def ndim(self) -> int:
        return len(self.data.shape)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes + self.scale.nbytes)

    def __repr__(self) -> str:
        return f"BlockScaled(float8_e4m3 {list(self.shape)}, {self.block[0]}x{self.block[1]} blocks)"

    def expanded_scale(self, dtype=np.float32) -> np.ndarray:
        """The scale of every weight, [..., N, K] (host arrays only)."""
        bo, bi = self.block
        n, k = self.shape[-2:]
        s = np.asarray(self.scale, dtype)
        return np.repeat(np.repeat(s, bo, axis=-2), bi, axis=-1)[..., :n, :k]

    def dequantize(self, dtype=np.float32) -> np.ndarray:
        """w as ``dtype`` (host arrays only): float32 rounds each product once; float64 is exact."""
        return e4m3_to_float32(np.asarray(self.data)).astype(dtype) * self.expanded_scale(dtype)

    def with_arrays(self, data, scale) -> "BlockScaled":
        """The same format over other arrays (the device's copies, a reshape)."""
        return BlockScaled(data, scale, self.block)

    def reshape(self, *shape) -> "BlockScaled":
        """The same matrices with leading axes reshaped (the last two stay)."""
        return _reshape_leading(self, shape)

    @staticmethod
    def stack(mats: list["BlockScaled"]) -> "BlockScaled":
        """Host matrices of one shape and block, stacked on a new first axis (the experts)."""
        blocks = {m.block for m in mats}
        if len(blocks) != 1:
            raise ValueError(f"cannot stack float8 matrices of different blocks {sorted(blocks)}")
        return BlockScaled(np.stack([m.data for m in mats]), np.stack([m.scale for m in mats]), blocks.pop())


class Int4Grouped:
    """An INT4 matrix (or a stack) kept as compressed-tensors packs it ("pack-quantized",
    symmetric, one scale per group of ``group`` inputs):

        w[..., n, k] = (nibble k % 8 of data[..., n, k // 8], least significant first, minus 8)
                       * scale[..., n, k // group]

    data [..., N, ceil(K/8)] int32 (eight 4-bit values q + 8 a word), scale [..., N, ceil(K/group)]
    float32, or bfloat16 bits (uint16) as the released checkpoints store them (the GPU keeps them
    so: a group of 32 then costs 2 bytes of scale beside its 16 of nibbles), K = ``in_features``; numpy arrays on the host, device arrays on the GPU. Kimi K2
    Thinking / K2.5 / K2.6 store their routed experts this way (group 32). Every q is an integer
    in [-8, 7], exact in bf16, so the GEMM multiplies the nibbles as they are and each group's
    partial sum by its scale (``kernels.linear``), like a ``BlockScaled`` matrix with (1, group)
    blocks.
    """

    dtype_name = "int4"

    def __init__(self, data, scale, group: int, in_features: int):
        group, k = int(group), int(in_features)
        if group < 8 or group % 8:
            raise ValueError(f"int4 group size must be a positive multiple of 8, got {group}")
        if np.dtype(data.dtype) != np.int32:
            raise ValueError(f"int4 data must be packed int32 words, got {np.dtype(data.dtype)}")
        if np.dtype(scale.dtype) not in (np.dtype(np.float32), np.dtype(np.uint16)):
            raise ValueError(f"int4 group scales must be float32 or bfloat16 bits (uint16), got {np.dtype(scale.dtype)}")
        dshape = tuple(data.shape)
        if len(dshape) < 2 or dshape[-1] != -(-k // 8):
            raise ValueError(f"int4 data has shape {list(dshape)}; {k} inputs pack into {-(-k // 8)} words a row")
        want = dshape[:-1] + (-(-k // group),)
        if tuple(scale.shape) != want:
            raise ValueError(f"int4 group scales have shape {list(scale.shape)}; {list(data.shape[:-1]) + [k]} "
                             f"in groups of {group} needs {list(want)}")
        self.data, self.scale, self.group, self.in_features = data, scale, group, k

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)[:-1] + (self.in_features,)

    @property
    def ndim(self) -> int:
        return len(self.data.shape)

    @property
    def block(self) -> tuple[int, int]:
        """The scale blocks, as ``BlockScaled`` calls them: one row x one group."""
        return (1, self.group)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes + self.scale.nbytes)

    def __repr__(self) -> str:
        scales = "bf16" if np.dtype(self.scale.dtype) == np.uint16 else "float32"
        return f"Int4Grouped(int4 {list(self.shape)}, groups of {self.group}, {scales} scales)"

    def values(self) -> np.ndarray:
        """The int4 values q [..., N, K] as int8 (host arrays only)."""
        words = np.asarray(self.data).view(np.uint32)
        nib = (words[..., None] >> (4 * np.arange(8, dtype=np.uint32))) & np.uint32(0xF)   # [..., N, K/8, 8]
        q = nib.reshape(*words.shape[:-1], -1)[..., :self.in_features].astype(np.int8) - np.int8(8)
        return q

    def dequantize(self, dtype=np.float32) -> np.ndarray:
        """w as ``dtype`` (host arrays only); exact in float32 too (a 4-bit integer times a float32)."""
        scale = np.repeat(self.scales_f32().astype(dtype), self.group, axis=-1)[..., :self.in_features]
        return self.values().astype(dtype) * scale

    def scales_f32(self) -> np.ndarray:
        """The group scales as float32 (exactly; host arrays only)."""
        sc = np.asarray(self.scale)
        return bf16_to_float32(sc) if sc.dtype == np.uint16 else sc

    @staticmethod
    def pack(q: np.ndarray) -> np.ndarray:
        """int4 values q [..., N, K] (integers in [-8, 7]) -> packed int32 words [..., N, ceil(K/8)]."""
        q = np.asarray(q)
        if q.size and (q.min() < -8 or q.max() > 7):
            raise ValueError(f"int4 values must lie in [-8, 7], got [{q.min()}, {q.max()}]")
        k = q.shape[-1]
        u = np.zeros(q.shape[:-1] + (-(-k // 8) * 8,), np.uint32)
        u[..., :k] = (q.astype(np.int64) + 8).astype(np.uint32)
        u = u.reshape(*q.shape[:-1], -1, 8) << (4 * np.arange(8, dtype=np.uint32))
        return np.bitwise_or.reduce(u, axis=-1).view(np.int32)

    def with_arrays(self, data, scale) -> "Int4Grouped":
        """The same format over other arrays (the device's copies, a reshape)."""
        return Int4Grouped(data, scale, self.group, self.in_features)

    def reshape(self, *shape) -> "Int4Grouped":
        """The same matrices with leading axes reshaped (the last two stay)."""
        return _reshape_leading(self, shape)

    @staticmethod
    def stack(mats: list["Int4Grouped"]) -> "Int4Grouped":
        """Host matrices of one shape and group, stacked on a new first axis (the experts)."""
        kinds = {(m.group, m.in_features) for m in mats}
        if len(kinds) != 1:
            raise ValueError(f"cannot stack int4 matrices of different groups / inputs {sorted(kinds)}")
        group, k = kinds.pop()
        return Int4Grouped(np.stack([m.data for m in mats]), np.stack([m.scale for m in mats]), group, k)


QUANTIZED = (BlockScaled, Int4Grouped)     # weights kept as stored, dequantized on the numpy backend


def _reshape_leading(w, shape):
    """A quantized stack with its leading axes reshaped; its matrices' own shape stays."""
    if tuple(shape[-2:]) != w.shape[-2:]:
        raise ValueError(f"reshape keeps the matrices' own shape {list(w.shape[-2:])}, got {list(shape)}")
    lead = tuple(shape[:-2])
    return w.with_arrays(w.data.reshape(*lead, *tuple(w.data.shape)[-2:]),
                         w.scale.reshape(*lead, *tuple(w.scale.shape)[-2:]))


def fp8_block_supported(block) -> bool:
    """Whether the GPU GEMMs (``kernels.linear``) take float8 weights in blocks ``(bo, bi)`` as
    stored: the input side a multiple of 16, the tensor-core k step, so that no chunk of the
    reduction straddles two scales."""
    return block is not None and block[0] >= 1 and block[1] >= 16 and block[1] % 16 == 0


def stack_weights(mats: list):
    """Stacked matrices: float32 arrays with ``np.stack``, quantized ones (all ``BlockScaled`` or
    all ``Int4Grouped``) kept as stored."""
    for cls in QUANTIZED:
        if mats and all(isinstance(m, cls) for m in mats):
            return cls.stack(mats)
    return np.stack([widened(m) for m in mats])


def widened(w):
    """A weight as float32 numpy: quantized ones dequantized, anything else as it is."""
    return w.dequantize() if isinstance(w, QUANTIZED) else w
