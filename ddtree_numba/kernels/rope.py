"""Rotary position embedding on the GPU; twins: ``reference.rope.rope_cos_sin`` and ``rope``.

Shapes: T tokens (R buffer rows, n = n_rows[0] live), Rd rope dim, R2 = Rd / 2 frequencies,
G groups (heads) per row.

The frequencies themselves (default, YaRN) and the softmax scale are host-side float64 math
(``reference.rope``); only the angles and the rotation run here. Angles follow the twin:
``positions[t] * inv_freq[i]`` in float64, cos / sin in float64, times ``attention_factor``,
rounded to float32 (``_cos_sin``, shared by every kernel below, so a rotation from positions
equals ``rope(x, *rope_cos_sin(...))``). Each thread owns whole pairs, so rotating in place is
safe, and every row is computed alone: the result does not depend on the row count.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import config, cuda, float32, float64

from .._checks import check_array, is_real_number
from .._device import (cached, ceil_div, device_function, float32_out, fma, grid_dependency_after, is_device,
                       launcher_result, to_device)

# Threads per block. A row of queries holds H * R2 pairs (16 * 32 = 512 for DeepSeek-V3); the
# simulator runs every thread as a Python thread, so it gets a small block.
THREADS = 8 if config.ENABLE_CUDASIM else 128
MAX_PAIRS = 256            # rope dims up to 512 (cos / sin of one row staged in shared memory)


@device_function
def _cos_sin(pos, inv_freq_i, attention_factor):
    """(cos, sin) of ``pos * inv_freq_i`` as the twin rounds them: float64, scaled, float32."""
    angle = float64(pos) * inv_freq_i
    return (float32(math.cos(angle) * attention_factor),
            float32(math.sin(angle) * attention_factor))


@device_function
def _rotate(src, sr, sc, dst, dr, dc, i, r2, interleave, c, s):
    """Rotate pair i of the rope vector at src[sr, sc:] into dst[dr, dc:]: the twin's formula
    (a c - b s, b c + a s) with its multiply-adds fused explicitly, fma(a, c, -(b s)) and
    fma(b, c, a s). Written as ``a * c - b * s``, the PTX leaves the subtraction's fusing to ptxas,
    free to pick either product, per kernel: the likely cause of a rope kernel 1 ulp off the
    table kernel on 13-17 % of outputs (forty-eighth session, H100; the local ptxas fused both
    alike, the GPU's did not). Every kernel that rotates goes through here, so they all round the
    same way."""
    if interleave:
        ia = 2 * i
        ib = ia + 1
    else:
        ia = i
        ib = i + r2
    a = src[sr, sc + ia]
    b = src[sr, sc + ib]          # both read before either write: in place is safe
    dst[dr, dc + ia] = fma(a, c, -(b * s))
    dst[dr, dc + ib] = fma(b, c, a * s)


class PoolRows(NamedTuple):
    """A destination row per source row in a cache pool, for the cache writes of a batched forward
    (``CudaTarget.forward_batch``): row r of the batch belongs to the sequence z with row0_z <= r
    < row0_z + t_z in ``seqs`` [S, 4] int32 device = (s0, t, row0, slot) a sequence, and goes to
    row slot_z * ``slot_rows`` + ``layer_row0`` + s0_z + (r - row0_z) of the pool's rows flattened
    to two dimensions ([slots * L * S_cap, W]: ``slot_rows`` = L * S_cap, ``layer_row0`` = layer *
    S_cap). Given where a launcher takes a ``dst_row0`` / ``out_row0``."""

    seqs: object
    slot_rows: int
    layer_row0: int


@device_function
def _pool_row(seqs, r, slot_rows, layer_row0):
    """Row r's destination in a flattened pool (``PoolRows``), -1 if r is in no sequence."""
    for z in range(seqs.shape[0]):
        row0 = seqs[z, 2]
        if row0 <= r and r < row0 + seqs[z, 1]:
            return seqs[z, 3] * slot_rows + layer_row0 + seqs[z, 0] + (r - row0)
    return -1


@device_function
def _dest_row(r, mode, row0, seqs, slot_rows, layer_row0):
    """Where row r is written: r (mode 0), r + row0[0] (mode 1: after the cache's rows) or its
    sequence's row in a pool (mode 2, ``PoolRows``; -1 if in none)."""
    if mode == 1:
        return r + row0[0]
    if mode == 2:
        return _pool_row(seqs, r, slot_rows, layer_row0)
    return r


def _dest_rows_args(row0, fallback):
    """The kernel arguments (mode, row0 array, seqs, slot_rows, layer_row0) for a launcher's
    ``dst_row0`` / ``out_row0``: None, a device int32 [1] array, or a ``PoolRows``; ``fallback`` is
    a 1-D int32 device array standing in for an unused row0."""
    if row0 is None:
        return 0, fallback, _no_seqs(), 0, 0
    if isinstance(row0, PoolRows):
        return 2, fallback, row0.seqs, int(row0.slot_rows), int(row0.layer_row0)
    return 1, row0, _no_seqs(), 0, 0


_NO_SEQS = []


def _no_seqs():
    """An empty [0, 4] int32 device array (the type of a real ``seqs``) standing in for an unused
    sequence table: made once (zero bytes, so no context owns memory behind it)."""
    if not _NO_SEQS:
        _NO_SEQS.append(cuda.device_array((0, 4), np.int32))
    return _NO_SEQS[0]


@cached
@cuda.jit
def _rope_cos_sin_kernel(positions, inv_freq, attention_factor, cos, sin):
    grid_dependency_after((positions, inv_freq, attention_factor, cos, sin))   # PDL (_device.py)
    j = cuda.grid(1)
    r2 = inv_freq.shape[0]
    if j < positions.shape[0] * r2:
        t = j // r2
        i = j - t * r2
        c, s = _cos_sin(positions[t], inv_freq[i], attention_factor)
        cos[t, i] = c
        sin[t, i] = s


@cached
@cuda.jit
def _rope_table_kernel(x, cos, sin, interleave, out):
    """x, out [T, G * Rd] (G rope vectors a row), cos / sin [T, R2]; one block per row."""
    grid_dependency_after((x, cos, sin, interleave, out))   # PDL: nothing before it touches global memory (_device.py)
    r = cuda.blockIdx.x
    r2 = cos.shape[1]
    rdim = 2 * r2
    pairs = (x.shape[1] // rdim) * r2
    for p in range(cuda.threadIdx.x, pairs, cuda.blockDim.x):
        g = p // r2
        i = p - g * r2
        _rotate(x, r, g * rdim, out, r, g * rdim, i, r2, interleave, cos[r, i], sin[r, i])


@cached
@cuda.jit
def _rope_kernel(src, src_col0, src_gs, dst, dst_col0, dst_gs, groups, rdim, positions, inv_freq,
                 attention_factor, interleave, n_rows, mode0, row0_0, seqs0, slot_rows0, layer_row0_0,
                 src1, src1_col0, src1_gs, dst1, dst1_col0, dst1_gs, groups1,
                 mode1, row0_1, seqs1, slot_rows1, layer_row0_1):
    """Row r = blockIdx.x of job blockIdx.y: job 0 rotates (src, dst, ...), job 1 (src1, dst1,
    ...): two sets of rope vectors of the same rows, at the same positions, in one launch."""
    grid_dependency_after((src, src_col0, src_gs, dst, dst_col0, dst_gs, groups, rdim, positions, inv_freq,
                           attention_factor, interleave, n_rows, mode0, row0_0, seqs0, slot_rows0, layer_row0_0, src1,
                           src1_col0, src1_gs, dst1, dst1_col0, dst1_gs, groups1, mode1, row0_1, seqs1, slot_rows1,
                           layer_row0_1))
    r = cuda.blockIdx.x
    if r >= n_rows[0]:
        return  # the whole block leaves together: no thread is left at the barrier
    t = cuda.threadIdx.x
    T = cuda.blockDim.x
    r2 = rdim // 2
    cs = cuda.shared.array(MAX_PAIRS, float32)
    sn = cuda.shared.array(MAX_PAIRS, float32)
    pos = positions[r]
    for i in range(t, r2, T):  # the row's angles once, shared by every group (head)
        c, s = _cos_sin(pos, inv_freq[i], attention_factor)
        cs[i] = c
        sn[i] = s
    cuda.syncthreads()  # the row's cos / sin are staged
    x, xc, xs, y, yc, ys, n_groups = src, src_col0, src_gs, dst, dst_col0, dst_gs, groups
    ro = _dest_row(r, mode0, row0_0, seqs0, slot_rows0, layer_row0_0)
    if cuda.blockIdx.y == 1:
        x, xc, xs, y, yc, ys, n_groups = src1, src1_col0, src1_gs, dst1, dst1_col0, dst1_gs, groups1
        ro = _dest_row(r, mode1, row0_1, seqs1, slot_rows1, layer_row0_1)
    if ro < 0:
        return              # a row of no sequence (past the barrier: every thread leaves)
    for p in range(t, n_groups * r2, T):
        g = p // r2
        i = p - g * r2
        _rotate(x, r, xc + g * xs, y, ro, yc + g * ys, i, r2, interleave, cs[i], sn[i])


# -- the device tier (device arrays only, no checks, no allocation; docs/DESIGN.md §3) ----------

def _rope_job(n_rows, src, dst, groups=1, src_col0=0, src_stride=0, dst_col0=0, dst_stride=0, dst_row0=None):
    """One job's arguments of ``_rope_kernel`` (the defaults of ``enqueue_rope``'s own)."""
    return (src, int(src_col0), int(src_stride), dst, int(dst_col0), int(dst_stride), int(groups),
            *_dest_rows_args(dst_row0, n_rows))


def enqueue_rope(src, dst, positions, inv_freq, n_rows, *, rdim, interleave, groups=1, src_col0=0,
                 src_stride=0, dst_col0=0, dst_stride=0, attention_factor=1.0, dst_row0=None, second=None,
                 stream=0):
    """Rotate rope vectors from a strided source into a strided destination, the angles computed
    from the positions; twin: ``reference.rope.enqueue_rope`` (over ``reference.rope.rope`` and
    ``rope_cos_sin``).

    For r < n = n_rows[0] and g < ``groups``: the ``rdim`` values
    src[r, src_col0 + g*src_stride : ... + rdim] rotated by the angles positions[r] * inv_freq[i]
    (pairs (2i, 2i+1) if ``interleave`` else (i, i + rdim/2)) are written to
    dst[row0 + r, dst_col0 + g*dst_stride : ... + rdim], row0 = dst_row0[0] or 0; with ``dst_row0``
    a ``PoolRows``, row r goes to its sequence's row of a flattened cache pool instead (dst then
    the pool's [slots * L * S_cap, Wd] rows).
    src [R, Ws] float32, dst [>= row0 + n, Wd] float32, positions [>= n] int32, inv_freq
    [rdim/2] float64 (rdim/2 <= MAX_PAIRS), n_rows / dst_row0 [>= 1] int32 device. src may be
    dst when the source and destination positions coincide (in place). The grid is R blocks.
    E.g. q_pe of every head: src q [T, H*(D+Rd)], src_col0 D, src_stride D+Rd -> dst [T, H*Rd],
    dst_stride Rd; k_pe: src kv [T, C+Rd], src_col0 C -> the cache rows, dst_row0 = cache length.
    ``second`` = dict(src=, dst=, groups=, src_col0=, src_stride=, dst_col0=, dst_stride=,
    dst_row0=) (the same defaults): a second set of rope vectors of the same rows (src with at
    least R rows), the same positions and angles, in the same launch (each vector's bits as if
    alone; MLA's k_pe and q_pe). The two jobs run in different blocks, so neither's source may
    overlap the other's destination (in place holds within a job). The grid is R blocks (x 2
    with ``second``).
    """
    if src.shape[0] == 0:
        return
    job = _rope_job(n_rows, src, dst, groups, src_col0, src_stride, dst_col0, dst_stride, dst_row0)
    if second is None:
        job1 = job
    else:
        try:
            job1 = _rope_job(n_rows, **second)
        except TypeError as exc:
            raise ValueError("second takes src, dst, groups, src_col0, src_stride, dst_col0, dst_stride and "
                             f"dst_row0: {exc}") from None
    _rope_kernel[(src.shape[0], 1 if second is None else 2), THREADS, stream](
        *job[:7], int(rdim), positions, inv_freq, float(attention_factor), bool(interleave), n_rows,
        *job[7:], *job1)


# -- the public launchers -----------------------------------------------------------------------

def _check_factor(name, value):
    if not is_real_number(value) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def rope_cos_sin(positions, inv_freq, attention_factor=1.0, *, out=None, stream=0):
    """Per-token ``cos`` and ``sin`` of ``positions[t] * inv_freq[i]`` (float64), times
    ``attention_factor``, rounded to float32; on the GPU.

    positions [T] int32 / int64, inv_freq [R2] float64 (numpy float32 is widened) -> cos [T, R2]
    float32, sin [T, R2] float32. ``out`` = (cos, sin) preallocated, filled and returned.
    """
    check_array("positions", positions, 1, (np.int32, np.int64))
    check_array("inv_freq", inv_freq, 1, (np.float64,) if is_device(inv_freq) else (np.float64, np.float32))
    if not is_device(inv_freq):
        inv_freq = inv_freq.astype(np.float64, copy=False)
    af = _check_factor("attention_factor", attention_factor)
    t, r2 = positions.shape[0], inv_freq.shape[0]
    if out is None:
        cos = cuda.device_array((t, r2), np.float32, stream=stream)
        sin = cuda.device_array((t, r2), np.float32, stream=stream)
    else:
        if not isinstance(out, tuple) or len(out) != 2:
            raise ValueError("out must be a (cos, sin) pair of arrays")
        cos, sin = out
        check_array("out[0] (cos)", cos, 2, np.float32, shape=(t, r2))
        check_array("out[1] (sin)", sin, 2, np.float32, shape=(t, r2))
    if t and r2:
        _rope_cos_sin_kernel[ceil_div(t * r2, THREADS), THREADS, stream](
            to_device(positions, stream), to_device(inv_freq, stream), af, cos, sin)
    if out is None and not is_device(positions):
        return cos.copy_to_host(stream=stream), sin.copy_to_host(stream=stream)
    return cos, sin


def rope(x, cos, sin, interleave, *, out=None, stream=0):
    """Rotate each pair of the last axis by its token's angle, keeping the layout; on the GPU.

    x [T, ..., Rd] float32 (e.g. [T, H, Rd] queries or [T, Rd] keys), cos / sin [T, Rd/2]
    float32 -> [T, ..., Rd] float32. ``interleave``: pairs (x[2i], x[2i+1]); else
    (x[i], x[i + Rd/2]). ``out`` may be ``x`` (in place).
    """
    if not hasattr(x, "shape") or len(x.shape) < 2:
        raise ValueError(f"x must be at least 2-D [T, ..., Rd], got shape {tuple(getattr(x, 'shape', ()))}")
    check_array("x", x, len(x.shape), np.float32)
    if not isinstance(interleave, (bool, np.bool_)):
        raise ValueError(f"interleave must be a bool, got {interleave!r}")
    shape = tuple(x.shape)          # (the simulator's shapes take no negative index)
    t, rdim = shape[0], shape[-1]
    if rdim % 2:
        raise ValueError(f"the rope dim (last axis of x) must be even, got {rdim}")
    check_array("cos", cos, 2, np.float32, shape=(t, rdim // 2))
    check_array("sin", sin, 2, np.float32, shape=(t, rdim // 2))
    y = float32_out(out, shape, stream)
    width = int(np.prod(shape[1:]))
    if t and width:
        d_x = to_device(x, stream)
        _rope_table_kernel[t, THREADS, stream](
            d_x.reshape(t, width), to_device(cos, stream), to_device(sin, stream), bool(interleave),
            y.reshape(t, width))
    return launcher_result(y, out, x, stream)
