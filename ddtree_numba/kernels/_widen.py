"""Widening stored weights to float32 inside kernels: the device side of ``ddtree_numba.dtypes``.

A weight matrix is stored as float32, float16, or bfloat16 carried as uint16 bit patterns;
kernels load it as stored (element by element, or four 16-bit / two 32-bit values per uint64
word) and widen in registers. Each storage dtype has a short *kind* ('f32', 'f16', 'bf16') that
keys the compiled kernel variants. The simulator runs kernels as Python, where libdevice bit casts
are stubs: it gets numpy stand-ins with the same meaning.
"""

from __future__ import annotations

import numpy as np
from numba import config, float32, int32, uint8, uint16, uint32, uint64
from numba.core.types import float16

from .._device import device_function
from ..dtypes import E4M3_TABLE, WEIGHT_DTYPES, BlockScaled, Int4Grouped

_SIM = bool(config.ENABLE_CUDASIM)
if not _SIM:
    from numba.cuda import libdevice as _libdevice

# storage dtype (``dtypes.WEIGHT_DTYPES``) -> the short kind that keys the compiled kernels
KINDS = {WEIGHT_DTYPES["float32"]: "f32", WEIGHT_DTYPES["float16"]: "f16", WEIGHT_DTYPES["bfloat16"]: "bf16"}


def _weight_kind(w, name: str = "weights") -> str:
    """'f32', 'f16' or 'bf16' (uint16 storage) for a weight array, 'e4m3' for a ``BlockScaled``
    one (float8 bytes + block scales); a ValueError naming ``name`` otherwise."""
    if isinstance(w, BlockScaled):
        return "e4m3"
    if isinstance(w, Int4Grouped):
        return "int4"
    kind = KINDS.get(np.dtype(w.dtype))
    if kind is None:
        raise ValueError(f"{name} must be float32, float16 or bfloat16 bits (uint16), got {np.dtype(w.dtype)}")
    return kind


ELEM = {"f32": float32, "f16": float16, "bf16": uint16, "e4m3": uint8, "int4": uint32}   # storage of one weight
PER_WORD = {"f32": 2, "f16": 4, "bf16": 4}                 # weights per uint64 word


@device_function
def _widen_f32(w):
    return w


@device_function
def _widen_f16(w):
    return float32(w)


if _SIM:
    import struct
    _BITS_F32 = struct.Struct("<I"), struct.Struct("<f")

    def bf16_to_f32(u):
        """bfloat16 bits (uint16) -> float32."""
        return np.float32(_BITS_F32[1].unpack(_BITS_F32[0].pack((int(u) & 0xFFFF) << 16))[0])
else:
    @device_function
    def bf16_to_f32(u):
        """bfloat16 bits (uint16) -> float32."""
        return _libdevice.int_as_float(int32(uint32(u) << uint32(16)))


if _SIM:
    def _e4m3_to_f32(b):
        """float8 e4m3fn bits (the low byte of an integer) -> float32, exactly."""
        return E4M3_TABLE[int(b) & 0xFF]
else:
    @device_function
    def _e4m3_to_f32(b):
        """float8 e4m3fn bits (the low byte of an integer) -> float32, exactly: the 7 exponent and
        mantissa bits placed at the top of a float32's exponent / mantissa fields give the value
        times 2^-120 (subnormals included: both formats' subnormals scale the same way), which one
        exact multiply restores. (0x7f / 0xff, e4m3fn's NaN, come out as 480: the loaders refuse
        them.)"""
        u = uint32(b)
        bits = ((u & uint32(0x80)) << uint32(24)) | ((u & uint32(0x7F)) << uint32(20))
        return _libdevice.int_as_float(int32(bits)) * float32(1.329227995784916e36)    # 2**120


@device_function
def _int4_to_f32(b):
    """int4 as compressed-tensors packs it (the low 4 bits of an integer hold q + 8) -> float32 q."""
    return float32(int32(uint32(b) & uint32(0xF)) - int32(8))


WIDEN = {"f32": _widen_f32, "f16": _widen_f16, "bf16": bf16_to_f32, "e4m3": _e4m3_to_f32, "int4": _int4_to_f32}

# Element e of a uint64 word of packed weights (little endian: element 0 in the low bits), and
# the two float32 halves of a word. The simulator has no libdevice bit casts: numpy views.
if _SIM:
    def _bits_f32(b):
        return np.array([b], np.uint32).view(np.float32)[0]

    def _word_f32(u, e):
        return _bits_f32((int(u) >> (32 * e)) & 0xFFFFFFFF)

    def _word_bf16(u, e):
        return _bits_f32(((int(u) >> (16 * e)) & 0xFFFF) << 16)

    def _word_f16(u, e):
        return np.float32(np.array([(int(u) >> (16 * e)) & 0xFFFF], np.uint16).view(np.float16)[0])

    def lo_f32(u):
        return _word_f32(u, 0)

    def hi_f32(u):
        return _word_f32(u, 1)
else:
    @device_function
    def lo_f32(u):
        return _libdevice.int_as_float(int32(uint32(u)))

    @device_function
    def hi_f32(u):
        return _libdevice.int_as_float(int32(uint32(u >> uint64(32))))

    @device_function
    def _word_f32(u, e):
        if e == 0:
            return lo_f32(u)
        return hi_f32(u)

    @device_function
    def _word_bf16(u, e):
        if e == 0:
            b = uint32(u) << uint32(16)
        elif e == 1:
            b = uint32(u) & uint32(0xFFFF0000)
        elif e == 2:
            b = uint32(u >> uint64(32)) << uint32(16)
        else:
            b = uint32(u >> uint64(32)) & uint32(0xFFFF0000)
        return _libdevice.int_as_float(int32(b))

    @device_function
    def _f16_bits_to_f32(h):
        """IEEE half bits (uint32 holding 16 bits) -> float32, exact (subnormals, inf, nan)."""
        s = (h & uint32(0x8000)) << uint32(16)
        ex = (h >> uint32(10)) & uint32(0x1F)
        m = h & uint32(0x3FF)
        if ex == uint32(0x1F):
            b = s | uint32(0x7F800000) | (m << uint32(13))
        elif ex != uint32(0):
            b = s | ((ex + uint32(112)) << uint32(23)) | (m << uint32(13))
        else:
            v = float32(m) * float32(5.9604644775390625e-08)     # m * 2**-24, exact
            return -v if s != uint32(0) else v
        return _libdevice.int_as_float(int32(b))

    @device_function
    def _word_f16(u, e):
        return _f16_bits_to_f32(uint32(u >> uint64(16 * e)) & uint32(0xFFFF))

WORD = {"f32": _word_f32, "f16": _word_f16, "bf16": _word_bf16}
