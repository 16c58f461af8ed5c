"""kernels/linear.py: the tensor-core GEMM against its twin (``reference.linear.linear`` with the
same precision) within the accumulation bound its arithmetic allows, the precision modes against
float64, and batch invariance bit for bit (a row alone == the row in any batch, tile, or group).

In the simulator each mma is emulated (``kernels/_mma.py``: exact products and sums, rounded once);
on a GPU it is the tensor core's. The tolerances hold for both.
"""

import importlib

import numpy as np
import pytest
from numba import cuda

from conftest import REAL_GPU
from ddtree_numba import kernels as kn
from ddtree_numba import reference as ref
from ddtree_numba.dtypes import E4M3_TABLE, BlockScaled, Int4Grouped, fp8_block_supported, to_bf16_bits
from ddtree_numba.reference.linear import accumulation_bound, bf16_round, bf16_split, swiglu_bound
from ddtree_numba.reference.moe import expert_work_items, work_item_capacity

L = importlib.import_module("ddtree_numba.kernels.linear")
pytestmark = pytest.mark.kernels
KINDS = ("f32", "f16", "bf16")
STAGED = [name for name, tile in L.TILES.items() if isinstance(tile, L._Staged)]
PRECISIONS = ("bf16", "fp32")


def weights(rng, shape, kind):
    """(stored, widened f32) weights of one kind; bf16 travels as uint16 bits."""
    w = (rng.standard_normal(shape) * 0.5).astype(np.float32)
    if kind == "f32":
        return w, w
    if kind == "f16":
        h = w.astype(np.float16)
        return h, h.astype(np.float32)
    b = (w.view(np.uint32) >> 16).astype(np.uint16)
    return b, (b.astype(np.uint32) << 16).view(np.float32)


def xs(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def dev(a):
    if isinstance(a, BlockScaled):
        return BlockScaled(dev(a.data), dev(a.scale), a.block)
    if isinstance(a, Int4Grouped):
        return Int4Grouped(dev(a.data), dev(a.scale), a.group, a.in_features)
    return cuda.to_device(np.ascontiguousarray(a))


def fp8_weights(rng, shape, block):
    """A float8 e4m3 matrix (or stack) of random bytes with exponent fields 0..8 (|w| < 4 before
    scaling, subnormals included) and block scales in [0.25, 2)."""
    raw = (rng.integers(0, 2, shape) << 7 | rng.integers(0, 9, shape) << 3 | rng.integers(0, 8, shape)).astype(np.uint8)
    n, k = shape[-2:]
    scale = (rng.random(tuple(shape[:-2]) + (-(-n // block[0]), -(-k // block[1]))) * 1.75 + 0.25).astype(np.float32)
    return BlockScaled(raw, scale, block)


def rows_dev(n):
    return cuda.to_device(np.array([n], np.int32))


def assert_bits(got, want):
    np.testing.assert_array_equal(np.asarray(got, np.float32).view(np.uint32),
                                  np.asarray(want, np.float32).view(np.uint32))


def assert_twin(got, x, wf, precision, base=None):
    """got == twin (+ base) within the accumulation bound of ``precision``."""
    want = ref.linear(x, wf, precision).astype(np.float64)
    bound = accumulation_bound(x, wf, precision)
    if base is not None:
        want = want + base
        bound = bound + np.abs(want) * 2.0 ** -23
    err = np.abs(got.astype(np.float64) - want)
    assert np.all(err <= bound), f"max error {err.max():.3g} over bound {bound[np.argmax(err - bound)]:.3g}"


def run_linear(x, w, precision, n=None, tile=None, accumulate=False, out=None):
    """enqueue_linear with an optional explicit tile; returns out [R, N]."""
    R, N = x.shape[0], w.shape[0]
    d_out = dev(np.full((R, N), np.nan, np.float32) if out is None else out)
    L.enqueue_linear(dev(x), dev(w), d_out, rows_dev(R if n is None else n), precision=precision,
                     accumulate=accumulate, tile=tile)
    return d_out.copy_to_host()


# -- the twins themselves, against float64 (independent of any kernel) -------------------------
def test_fp32_twin_is_faithful_and_bf16_twin_rounds_the_inputs(rng):
    x, (_, wf) = xs(rng, (5, 300)), weights(rng, (7, 300), "f32")
    exact = x.astype(np.float64) @ wf.T.astype(np.float64)
    scale = np.abs(x).astype(np.float64) @ np.abs(wf).T.astype(np.float64)
    assert np.all(np.abs(ref.linear(x, wf, "fp32") - exact) <= 2 ** -15 * scale)     # ~1e-5 (the split's residual)
    rx, rw = bf16_round(x), bf16_round(wf)
    assert np.all(np.abs(rx - x) <= 2 ** -8 * np.abs(x)) and not np.array_equal(rx, x)   # 8 significant bits
    np.testing.assert_allclose(ref.linear(x, wf, "bf16"), rx.astype(np.float64) @ rw.T.astype(np.float64),
                               rtol=1e-6)
    hi, lo = bf16_split(x)
    assert np.array_equal(bf16_round(hi), hi) and np.array_equal(bf16_round(lo), lo)
    assert np.all(np.abs(hi.astype(np.float64) + lo - x) <= 2.0 ** -16 * np.abs(x))


# -- (a) against the twin ---------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("R,K,N", [(1, 200, 37), (9, 70, 19)])
def test_public_linear_matches_the_twin(rng, kind, precision, R, K, N):
    x = xs(rng, (R, K))
    w, wf = weights(rng, (N, K), kind)
    y = kn.linear(x, w, precision=precision)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (R, N)
    assert_twin(y, x, wf, precision)
    if precision == "fp32":               # the faithful mode keeps the float32 goldens' tolerance
        np.testing.assert_allclose(y, ref.linear(x, wf), rtol=1e-4, atol=1e-4 * np.abs(y).max())


def test_public_linear_device_in_device_out_and_out(rng):
    x = xs(rng, (2, 70))
    w, wf = weights(rng, (11, 70), "bf16")
    y = kn.linear(dev(x), dev(w))
    assert not isinstance(y, np.ndarray)
    assert_twin(y.copy_to_host(), x, wf, "fp32")
    out = dev(np.full((2, 11), np.nan, np.float32))
    assert kn.linear(x, w, out=out) is out
    assert_bits(out.copy_to_host(), y.copy_to_host())


def test_public_linear_rejects_bad_input(rng):
    x = xs(rng, (2, 8))
    with pytest.raises(ValueError, match="x must have dtype float32"):
        kn.linear(x.astype(np.float64), np.zeros((3, 8), np.float32))
    with pytest.raises(ValueError, match="input features"):
        kn.linear(x, np.zeros((3, 9), np.float32))
    with pytest.raises(ValueError, match="weight must be float32, float16 or bfloat16"):
        kn.linear(x, np.zeros((3, 8), np.int32))
    with pytest.raises(ValueError, match="weight must be 2-D"):
        kn.linear(x, np.zeros((1, 3, 8), np.float32))
    with pytest.raises(ValueError, match="out has shape"):
        kn.linear(x, np.zeros((3, 8), np.float32), out=dev(np.zeros((2, 4), np.float32)))
    with pytest.raises(ValueError, match="precision must be one of"):
        kn.linear(x, np.zeros((3, 8), np.float32), precision="tf32")


def test_empty_shapes(rng):
    assert kn.linear(np.zeros((0, 8), np.float32), np.zeros((3, 8), np.float32)).shape == (0, 3)
    y = kn.linear(xs(rng, (2, 0)), np.zeros((3, 0), np.uint16))     # an empty sum is 0
    assert_bits(y, np.zeros((2, 3), np.float32))


# -- (b) every enqueue variant against the twin -------------------------------------------------
@pytest.mark.parametrize("kind,precision", [("bf16", "bf16"), ("f32", "fp32")])
def test_accumulate_adds_into_out_with_live_rows_only(rng, kind, precision):
    """enqueue_linear(accumulate=True): out[:n] += x[:n] @ w.T; rows n.. untouched."""
    R, n, K, N = 6, 5, 80, 21
    x = xs(rng, (R, K))
    w, wf = weights(rng, (N, K), kind)
    base = xs(rng, (R, N))
    got = run_linear(x, w, precision, n=n, accumulate=True, out=base)
    assert_twin(got[:n], x[:n], wf, precision, base=base[:n])
    assert_bits(got[n:], base[n:])


@pytest.mark.parametrize("kind,precision", [("bf16", "fp32"), ("f32", "bf16")])
def test_heads_projection_per_group(rng, kind, precision):
    """enqueue_linear_heads: out[r, z*N:(z+1)*N] = x[r, z*s:z*s+K] @ w[z].T."""
    Z, K, N, s, R = 3, 40, 10, 48, 2
    x = xs(rng, (R, Z * s))
    w, wf = weights(rng, (Z, N, K), kind)
    d_out = dev(np.full((R, Z * N), np.nan, np.float32))
    L.enqueue_linear_heads(dev(x), s, dev(w), d_out, rows_dev(R), precision=precision)
    got = d_out.copy_to_host()
    for z in range(Z):
        assert_twin(got[:, z * N:(z + 1) * N], x[:, z * s:z * s + K], wf[z], precision)


@pytest.mark.parametrize("kind,R,precision", [("bf16", 1, "bf16"), ("f16", 3, "fp32"), ("bf16", 9, "fp32")])
def test_swiglu(rng, kind, R, precision):
    K, I = 70, 13
    x = xs(rng, (R, K))
    wg, wgf = weights(rng, (I, K), kind)
    wu, wuf = weights(rng, (I, K), kind)
    d_out = dev(np.full((R, I), np.nan, np.float32))
    L._enqueue_swiglu(dev(x), dev(wg), dev(wu), d_out, rows_dev(R), precision=precision)
    want, bound = swiglu_bound(x, wgf, wuf, precision)
    assert np.all(np.abs(d_out.copy_to_host() - want) <= bound)


def items_of(offsets, item_rows=8):
    """The grouped GEMMs' work items for ``offsets`` (the counting sort's twin), with room to spare."""
    return expert_work_items(offsets, item_rows, work_item_capacity(len(offsets) - 1, int(offsets[-1]), item_rows) + 2)


def _grouped_case(rng, kind, counts, K, N, gather):
    Z = len(counts)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    Ro = int(offsets[-1])
    x = xs(rng, (Ro + 3, K))
    row_index = rng.integers(0, Ro + 3, Ro).astype(np.int32) if gather else None
    w, wf = weights(rng, (Z, N, K), kind)
    wu, wuf = weights(rng, (Z, N, K), kind)
    return offsets, x, row_index, (w, wf), (wu, wuf)


@pytest.mark.parametrize("kind,swiglu,gather,counts,precision", [
    ("bf16", True, True, [2, 0, 3], "bf16"),       # an empty group
    ("f16", False, False, [1, 4, 2], "fp32"),
    ("bf16", False, True, [9, 1, 0], "fp32"),      # two row tiles of 8
])
def test_grouped_experts(rng, kind, swiglu, gather, counts, precision):
    K, N = 40, 22
    offsets, x, row_index, (w, wf), (wu, wuf) = _grouped_case(rng, kind, counts, K, N, gather)
    Ro = int(offsets[-1])
    d_out = dev(np.full((Ro, N), np.nan, np.float32))
    L._enqueue_grouped_linear(dev(x), dev(w), d_out, dev(items_of(offsets)), max(counts), precision=precision,
                              row_index=None if row_index is None else dev(row_index),
                              w_up=dev(wu) if swiglu else None)
    got = d_out.copy_to_host()
    for z in range(len(counts)):
        j = np.arange(offsets[z], offsets[z + 1])
        xz = x[row_index[j] if gather else j]
        if swiglu:
            want, bound = swiglu_bound(xz, wf[z], wuf[z], precision)
            assert np.all(np.abs(got[j] - want) <= bound)
        else:
            assert_twin(got[j], xz, wf[z], precision)


def test_element_loads_give_the_bits_of_word_loads(rng):
    """bf16 weights with K % 4 != 0 are read element by element; the same values stored as
    float32 (element loads, lo parts zero) give the bits of bf16 word loads, in both modes."""
    x = xs(rng, (3, 64))
    w, wf = weights(rng, (7, 64), "bf16")
    assert L._vec_ok(dev(w[None])) and not L._vec_ok(dev(weights(rng, (1, 7, 66), "bf16")[0]))
    for precision in PRECISIONS:
        assert_bits(run_linear(x, wf, precision), run_linear(x, w, precision))


# -- float8 block-scaled weights, multiplied as stored --------------------------------------------
def test_fp8_twin_takes_the_weights_exactly(rng):
    """The float8 twin's weight is e4m3 x scale in float64 (never rounded to bf16): 'bf16' rounds
    only x, 'fp32' splits only x."""
    x, w = xs(rng, (4, 96)), fp8_weights(rng, (6, 96), (16, 32))
    wd = w.dequantize(np.float64)
    assert np.array_equal(wd, E4M3_TABLE[w.data].astype(np.float64) * w.expanded_scale(np.float64))
    np.testing.assert_allclose(ref.linear(x, w, "bf16"), bf16_round(x).astype(np.float64) @ wd.T, rtol=1e-6)
    exact = x.astype(np.float64) @ wd.T
    assert np.all(np.abs(ref.linear(x, w, "fp32") - exact) <= 2 ** -15 * (np.abs(x) @ np.abs(wd).T))
    np.testing.assert_allclose(ref.linear(x, w), exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("R,K,N,block", [(3, 200, 37, (128, 128)),     # word loads, 64-k chunks, ragged blocks
                                         (9, 70, 19, (16, 16)),        # byte loads, 16-k chunks
                                         (2, 96, 24, (8, 32))])        # 32-k chunks, a scale per 8 rows
def test_fp8_linear_matches_the_twin(rng, precision, R, K, N, block):
    x, w = xs(rng, (R, K)), fp8_weights(rng, (N, K), block)
    y = kn.linear(x, w, precision=precision)
    assert_twin(y, x, w, precision)
    assert_twin(kn.linear(dev(x), dev(w), precision=precision).copy_to_host(), x, w, precision)


def test_every_e4m3_byte_enters_the_mma_exactly():
    """y = I @ w.T with w holding all 256 bytes (scale 1): each output is its byte's value, which
    checks the in-register decode (on a GPU a bit trick, subnormals included) against the table."""
    raw = np.arange(256, dtype=np.uint8).reshape(16, 16)
    raw[(raw & 0x7F) == 0x7F] = 0
    w = BlockScaled(raw, np.ones((1, 1), np.float32), (16, 16))
    y = kn.linear(np.eye(16, dtype=np.float32), w, precision="bf16")
    np.testing.assert_array_equal(y.T, E4M3_TABLE[raw])          # exact (-0 sums to +0 with the other zeros)


@pytest.mark.parametrize("swiglu,gather,counts,precision", [(True, True, [2, 0, 3], "bf16"),
                                                            (False, False, [1, 4, 2], "fp32")])
def test_fp8_grouped_experts_and_heads(rng, swiglu, gather, counts, precision):
    K, N, block = 64, 22, (16, 32)
    Z = len(counts)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    Ro = int(offsets[-1])
    x = xs(rng, (Ro + 3, K))
    row_index = rng.integers(0, Ro + 3, Ro).astype(np.int32) if gather else None
    w, wu = fp8_weights(rng, (Z, N, K), block), fp8_weights(rng, (Z, N, K), block)
    d_out = dev(np.full((Ro, N), np.nan, np.float32))
    L._enqueue_grouped_linear(dev(x), dev(w), d_out, dev(items_of(offsets)), max(counts), precision=precision,
                              row_index=None if row_index is None else dev(row_index),
                              w_up=dev(wu) if swiglu else None)
    got = d_out.copy_to_host()
    for z in range(Z):
        j = np.arange(offsets[z], offsets[z + 1])
        xz = x[row_index[j] if gather else j]
        wz, wuz = (BlockScaled(m.data[z], m.scale[z], block) for m in (w, wu))
        if swiglu:
            want, bound = swiglu_bound(xz, wz, wuz, precision)
            assert np.all(np.abs(got[j] - want) <= bound)
        else:
            assert_twin(got[j], xz, wz, precision)
    # the per-head projection of the same stack (as MLA's absorbed weights are)
    xh = xs(rng, (2, Z * K))
    d_out = dev(np.full((2, Z * N), np.nan, np.float32))
    L.enqueue_linear_heads(dev(xh), K, dev(w), d_out, rows_dev(2), precision=precision)
    got = d_out.copy_to_host()
    for z in range(Z):
        assert_twin(got[:, z * N:(z + 1) * N], xh[:, z * K:(z + 1) * K], BlockScaled(w.data[z], w.scale[z], block),
                    precision)


def test_fp8_rejects_blocks_the_mma_cannot_scale(rng):
    x = xs(rng, (2, 48))
    assert not fp8_block_supported((128, 8)) and fp8_block_supported((1, 48))
    with pytest.raises(ValueError, match="multiple of 16"):
        kn.linear(x, fp8_weights(rng, (3, 48), (16, 24)))
    with pytest.raises(ValueError, match="block scales have shape"):
        BlockScaled(np.zeros((3, 48), np.uint8), np.ones((1, 2), np.float32), (16, 16))
    with pytest.raises(ValueError, match="raw bytes"):
        BlockScaled(np.zeros((3, 48), np.int8), np.ones((1, 3), np.float32), (16, 16))


# -- int4 weights packed as compressed-tensors packs them ---------------------------------------
def int4_weights(rng, shape, group, bf16_scales=False):
    """An Int4Grouped matrix (or stack): random q in [-8, 7], group scales in [0.25, 2) (float32,
    or bf16 bits as the released checkpoints store them)."""
    n, k = shape[-2:]
    q = rng.integers(-8, 8, shape)
    scale = (rng.random(tuple(shape[:-1]) + (-(-k // group),)) * 1.75 + 0.25).astype(np.float32)
    if bf16_scales:
        scale = to_bf16_bits(scale)
    return Int4Grouped(Int4Grouped.pack(q), scale, group, k)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("R,K,N,group,bf16_scales", [(3, 64, 20, 32, False),     # two-step paired chunks
                                                     (3, 64, 20, 32, True),      # scales as released
                                                     (5, 96, 24, 16, False),     # one-step chunks
                                                     (9, 128, 37, 64, True)])    # four-step chunks
def test_int4_linear_matches_the_twin(rng, precision, R, K, N, group, bf16_scales):
    x, w = xs(rng, (R, K)), int4_weights(rng, (N, K), group, bf16_scales)
    assert_twin(kn.linear(x, w, precision=precision), x, w, precision)


def test_int4_bf16_scales_give_the_float32_scales_bits(rng):
    """bf16 scale bits widen exactly: the same matrix with its scales as float32 gives the same bits."""
    x, w = xs(rng, (4, 64)), int4_weights(rng, (24, 64), 32, bf16_scales=True)
    wide = Int4Grouped(w.data, w.scales_f32(), 32, 64)
    assert_bits(kn.linear(x, w, precision="bf16"), kn.linear(x, wide, precision="bf16"))


def test_every_int4_value_enters_the_mma_exactly(rng):
    q = np.tile(np.arange(-8, 8), (16, 2))                      # [16, 32]: every value at every slot
    q = np.stack([np.roll(r, i) for i, r in enumerate(q)])
    w = Int4Grouped(Int4Grouped.pack(q), np.ones((16, 1), np.float32), 32, 32)
    np.testing.assert_array_equal(kn.linear(np.eye(32, dtype=np.float32), w, precision="bf16").T, q)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_int4_grouped_experts_staged_and_register_kernels(rng, precision):
    """Grouped SwiGLU over gathered rows with int4 experts: the twin's values, and every tile
    (warps splitting the chunks, staged) gives the same bits."""
    K, N, Z, group = 64, 24, 3, 32
    counts = [4, 0, 7]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    x = xs(rng, (14, K)) * np.float32(0.05)             # SwiGLU's silu stays in range
    row_index = rng.integers(0, 14, 11).astype(np.int32)
    w, wu = int4_weights(rng, (Z, N, K), group, True), int4_weights(rng, (Z, N, K), group, True)

    def run(tile):
        d_out = dev(np.full((11, N), np.nan, np.float32))
        L._enqueue_grouped_linear(dev(x), dev(w), d_out, dev(items_of(offsets)), max(counts), precision=precision,
                                  row_index=dev(row_index), w_up=dev(wu), tile=tile)
        return d_out.copy_to_host()

    got = run(L.TILES["small"])
    for z in range(Z):
        j = np.arange(offsets[z], offsets[z + 1])
        wz, wuz = (Int4Grouped(m.data[z], m.scale[z], group, K) for m in (w, wu))
        want, bound = swiglu_bound(x[row_index[j]], wz, wuz, precision)
        assert np.all(np.abs(got[j] - want) <= bound)
    for name, tile in L.TILES.items():               # warps splitting the chunks hand over scales too
        assert_bits(run(tile), got), name


def test_quantized_bad_pairs_and_nan_bytes_are_refused(rng):
    """A SwiGLU pair of different formats or shapes would be read with the gate's layout; a float8
    NaN byte would compute as 480 on a GPU: both are named before any launch."""
    x = xs(rng, (2, 64))
    items = dev(items_of(np.array([0, 2], np.int32)))
    out = dev(np.zeros((2, 8), np.float32))
    gate = int4_weights(rng, (1, 8, 64), 32)
    for up in (int4_weights(rng, (1, 8, 32), 32), fp8_weights(rng, (1, 8, 64), (1, 32))):
        with pytest.raises(ValueError, match="SwiGLU pair must be two matrices of one format and shape"):
            L._enqueue_grouped_linear(dev(x), dev(gate), out, items, 2, precision="bf16", w_up=dev(up))
    w = fp8_weights(rng, (3, 64), (16, 32))
    w.data[1, 5] = 0xFF
    with pytest.raises(ValueError, match="NaN bytes"):
        kn.linear(x, w)


def test_staged_tiles_fit_static_shared_memory():
    """The staged tile chosen for a launch fits the 48 KiB of static shared memory in both
    precisions (a forced tile that does not is replaced by the chosen one in ``_launch``)."""
    for swiglu in (False, True):
        for precision in PRECISIONS:
            assert L._staged_smem(L._STAGED[swiglu], swiglu, precision) <= L._SMEM_MAX, (swiglu, precision)


def test_int4_needs_whole_words_a_row(rng):
    w = Int4Grouped(Int4Grouped.pack(np.zeros((3, 36), np.int64)), np.ones((3, 3), np.float32), 16, 36)
    with pytest.raises(ValueError, match="multiple of 8"):
        kn.linear(xs(rng, (2, 36)), w)
    with pytest.raises(ValueError, match="group scales have shape"):
        Int4Grouped(Int4Grouped.pack(np.zeros((3, 32), np.int64)), np.ones((3, 3), np.float32), 16, 32)


# -- (c) batch invariance -----------------------------------------------------------------------
@pytest.mark.parametrize("precision", PRECISIONS)
def test_a_row_alone_equals_the_row_in_any_batch_and_tile(rng, precision):
    """Row 0 with n_rows = 1, in a batch of 3, of 11 (two row tiles), at the end of a batch, and
    under every tile of ``TILES`` (warps splitting the chunks, several tiles a warp): identical
    bits."""
    K, N = 130, 20
    x = xs(rng, (11, K))
    w, _ = weights(rng, (N, K), "bf16")
    alone = run_linear(x[:1], w, precision)
    assert_bits(run_linear(x[:3], w, precision)[:1], alone)
    assert_bits(run_linear(x, w, precision)[:1], alone)
    assert_bits(run_linear(np.concatenate([x[1:], x[:1]]), w, precision)[-1:], alone)
    for name, tile in L.TILES.items():
        assert_bits(run_linear(x[:9], w, precision, tile=tile)[:1], alone), name


@pytest.mark.parametrize("precision", PRECISIONS)
def test_fp8_row_alone_equals_the_row_in_any_batch_and_tile(rng, precision):
    K, N = 192, 20
    x = xs(rng, (11, K))
    w = fp8_weights(rng, (N, K), (16, 128))
    alone = run_linear(x[:1], w, precision)
    assert_bits(run_linear(x, w, precision)[:1], alone)
    for name, tile in L.TILES.items():
        assert_bits(run_linear(x[:9], w, precision, tile=tile)[:1], alone), name


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("variant", ["plain", "accumulate", "heads", "swiglu", "grouped", "fp8 grouped swiglu gather"])
def test_staged_tiles_give_the_register_kernels_bits(rng, precision, variant):
    """The shared-memory (staged) kernel does the register kernel's arithmetic step for step: the
    same bits for every variant, in both precisions, bf16 or float8 weights."""
    R, K, N, Z = 11, 72, 24, 3
    x = xs(rng, (R, Z * K))
    if variant.startswith("fp8"):
        w, wu = fp8_weights(rng, (Z, N, K), (16, 64)), fp8_weights(rng, (Z, N, K), (16, 64))
    else:
        (w, wf), (wu, _) = weights(rng, (Z, N, K), "bf16"), weights(rng, (Z, N, K), "bf16")
    base = xs(rng, (R, N))
    counts = [4, 0, 7]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    row_index = rng.integers(0, R, R).astype(np.int32)

    def run(tile):
        if variant in ("plain", "accumulate"):
            return run_linear(x[:, :K], w[0], precision, tile=tile, accumulate=variant == "accumulate", out=base)
        d_out = dev(np.full((R, Z * N), np.nan, np.float32))
        if variant == "heads":
            L.enqueue_linear_heads(dev(x), K, dev(w), d_out, rows_dev(R), precision=precision, tile=tile)
        elif variant == "swiglu":
            L._enqueue_swiglu(dev(x[:, :K]), dev(w[0]), dev(wu[0]), d_out, rows_dev(R), precision=precision, tile=tile)
        else:
            L._enqueue_grouped_linear(dev(x[:, :K]), dev(w), d_out, dev(items_of(offsets)), max(counts), precision=precision,
                                      row_index=dev(row_index) if "gather" in variant else None,
                                      w_up=dev(wu) if "swiglu" in variant else None, tile=tile)
        return d_out.copy_to_host()

    want = run(L.TILES["small"])
    if variant == "plain":
        assert_twin(want, x[:, :K], wf[0], precision)
    for name in STAGED:
        assert_bits(run(L.TILES[name]), want), name


@pytest.mark.parametrize("slots,item_rows,xa", [(2, 32, 0), (3, 64, 0), (3, 32, 1)])
def test_weight_ring_gives_the_register_kernels_bits(rng, slots, item_rows, xa):
    """The staged kernel with its weights copied by cp.async into a ring of 2 or 3 slots (``NS``;
    in the simulator a copy lands only at its wait, so a slot read too early is NaN): five chunks
    (the ring wraps), a partial column block (pieces past N zero-filled), experts of 3, 0 and 45
    rows in work items of 32 (a warp whose row tiles are all past the item's rows skips them) or
    of 64 (a block walks two 32-row tiles: the ring restarts): the register kernel's bits, SwiGLU
    with gathered rows and the plain down. ``xa``: the activations copied into the ring too
    (float32 slots, poisoned until their wait; bf16 buffers by chunk parity), one warp of 16 rows
    walking each 32-row item in two tiles."""
    K, N, counts = 320, 40, [3, 0, 45]
    offsets, x, row_index, (w, _), (wu, _) = _grouped_case(rng, "bf16", counts, K, N, True)
    ring = L._Staged(1, 1 if xa else 2, 1, 2, slots, xa)     # (a block's float32 slots fit 48 KiB)
    assert L._plan(dev(x), 0, dev(w), dev(wu), 32, "bf16", ring).tile == ring

    def run(tile, swiglu):
        d_out = dev(np.full((int(offsets[-1]), N), np.nan, np.float32))
        L._enqueue_grouped_linear(dev(x), dev(w), d_out, dev(items_of(offsets, item_rows)), max(counts), precision="bf16",
                                  row_index=dev(row_index) if swiglu else None, w_up=dev(wu) if swiglu else None,
                                  tile=tile)
        return d_out.copy_to_host()

    for swiglu in (True, False):
        assert_bits(run(ring, swiglu), run(L.TILES["small"], swiglu))


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("slots,K,xa", [(2, 64, 0), (4, 72, 0), (4, 72, 1)])
def test_weight_ring_over_few_chunks_in_both_precisions(rng, precision, slots, K, xa):
    """Dense launches (plain and SwiGLU) on the ring: one chunk (K 64), and fewer chunks than the
    ring has slots (K 72, 4 slots: the prologue's groups past the last chunk are empty); fp32's
    activations in two shared planes; ``xa``: the activations in the ring (K 72: the pieces past
    K zero-filled). The register kernel's bits."""
    R, N = 13, 40
    x = xs(rng, (R, K))
    (w, _), (wu, _) = weights(rng, (N, K), "bf16"), weights(rng, (N, K), "bf16")
    ring = L._Staged(1, 1 if xa else 2, 1, 2, slots, xa)
    assert L._plan(dev(x), 0, dev(w.reshape(1, N, K)), None, R, precision, ring).tile == ring
    assert_bits(run_linear(x, w, precision, tile=ring), run_linear(x, w, precision, tile=L.TILES["small"]))

    def swiglu(tile):
        d_out = dev(np.full((R, N), np.nan, np.float32))
        L._enqueue_swiglu(dev(x), dev(w), dev(wu), d_out, rows_dev(R), precision=precision, tile=tile)
        return d_out.copy_to_host()

    assert_bits(swiglu(ring), swiglu(L.TILES["small"]))


@pytest.mark.parametrize("tile", [(1, 1, 1, 3, 2), (3, 1, 1, 1, 2), (3, 1, 1, 1, 2, 1)])
def test_ring_tiles_of_three_row_tiles_or_a_partial_staging_pass(rng, tile):
    """Ring tiles like the H200's 24-row ones (RT 3: ``_DENSE_RINGS``, ``_WIDE_RINGS``), and a
    block whose threads do not divide its activation quads (3 warps over 8 rows: 128 quads on 96
    threads, the guarded second pass that (8,1,1,3,2) takes on the H200): the register kernel's
    bits, plain and SwiGLU, over rows that end inside a row tile; with the activations in the ring
    too (their copies in the same guarded passes)."""
    R, N, K = 29, 56, 192
    x = xs(rng, (R, K))
    (w, _), (wu, _) = weights(rng, (N, K), "bf16"), weights(rng, (N, K), "bf16")
    ring = L._Staged(*tile)
    assert L._plan(dev(x), 0, dev(w.reshape(1, N, K)), None, R, "bf16", ring).tile == ring
    assert_bits(run_linear(x, w, "bf16", tile=ring), run_linear(x, w, "bf16", tile=L.TILES["small"]))

    def swiglu(t):
        d_out = dev(np.full((R, N), np.nan, np.float32))
        L._enqueue_swiglu(dev(x), dev(w), dev(wu), d_out, rows_dev(R), precision="bf16", tile=t)
        return d_out.copy_to_host()

    assert_bits(swiglu(ring), swiglu(L.TILES["small"]))


def test_activation_ring_only_beside_a_weight_ring_and_for_whole_pieces(rng):
    """``XA`` copies 16-byte pieces of float32 activation rows beside the weight ring: rows or
    group offsets of whole pieces only, a weight ring needed, and it is the first thing a tile too
    big for shared memory gives up. The kernel refuses it without a ring."""
    (w, _) = weights(rng, (1, 16, 72), "bf16")
    xa = L._Staged(1, 2, 1, 2, 3, 1)
    assert L._plan(dev(xs(rng, (4, 72))), 0, dev(w), None, 4, "bf16", xa).tile == xa
    assert L._plan(dev(xs(rng, (4, 72))), 2, dev(w), None, 4, "bf16", xa).tile == xa._replace(XA=0)
    assert L._plan(dev(xs(rng, (4, 74))), 0, dev(w), None, 4, "bf16", xa).tile == xa._replace(XA=0)
    (wf, _) = weights(rng, (1, 16, 72), "f16")
    assert getattr(L._plan(dev(xs(rng, (4, 72))), 0, dev(wf), None, 4, "bf16", xa).tile, "XA", 0) == 0
    big = L._Staged(2, 2, 1, 2, 2, 1)
    assert L._staged_smem(big, True, "fp32") > L._SMEM_MAX >= L._staged_smem(big._replace(XA=0), True, "fp32")
    w2 = dev(weights(rng, (1, 64, 64), "bf16")[0])
    assert L._plan(dev(xs(rng, (4, 64))), 0, w2, w2, 4, "fp32", big).tile == big._replace(XA=0)
    with pytest.raises(ValueError, match="beside a weight ring"):
        L._staged_kernel("bf16", False, False, False, False, "bf16", 1, 1, 1, 1, 0, 1)


def test_weight_ring_only_for_whole_bf16_pieces(rng):
    """cp.async copies 16-byte pieces of bf16 rows: other weights, or K not a multiple of 8, take
    the staged kernel's register path (NS 0); a ring too big for shared memory is shortened."""
    ring = L._Staged(1, 2, 1, 2, 3)
    x = dev(xs(rng, (4, 72)))
    for xk, (w, _) in ((x, weights(rng, (1, 16, 72), "f16")), (dev(xs(rng, (4, 68))), weights(rng, (1, 16, 68), "bf16"))):
        assert getattr(L._plan(xk, 0, dev(w), None, 4, "bf16", ring).tile, "NS", 0) == 0
    big = L._Staged(4, 2, 2, 2, 4)
    assert L._staged_smem(big, True, "fp32") > L._SMEM_MAX
    w = dev(weights(rng, (1, 128, 64), "bf16")[0])
    tile = L._plan(dev(xs(rng, (4, 64))), 0, w, w, 4, "fp32", big).tile
    assert L._staged_smem(tile, True, "fp32") <= L._SMEM_MAX and tile.NS < 4


class _GpuArray:
    """What ``_plan`` reads of a device array on a GPU: shape, dtype and an aligned address."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, np.dtype(dtype)
        self.strides = tuple(int(np.prod(shape[d + 1:])) * self.dtype.itemsize for d in range(len(shape)))
        self.__cuda_array_interface__ = {"data": (256, False)}


def test_a_chosen_activation_ring_gives_way_to_fp32_planes_or_unaligned_rows(monkeypatch):
    """On a GPU the dense rule past 128 rows puts the activations in the ring (XA); in fp32 their
    two bf16 planes beside the float32 slots do not fit 48 KiB, and rows that do not start on 16
    bytes cannot be copied: the same tile without XA, not the rule without a ring."""
    monkeypatch.setattr(L, "_SIM", False)
    x, w = _GpuArray((2048, 2048), np.float32), _GpuArray((1, 3072, 2048), np.uint16)
    tile = L._DENSE_RINGS[-1][1]
    assert tile.XA and L._plan(x, 0, w, None, 2048, "bf16").tile == tile
    assert L._plan(x, 0, w, None, 2048, "fp32").tile == tile._replace(XA=0)
    odd = _GpuArray((2048, 2048), np.float32)
    odd.__cuda_array_interface__ = {"data": (264, False)}       # 8-byte aligned: word loads still
    assert L._plan(odd, 0, w, None, 2048, "bf16").tile == tile._replace(XA=0)


def test_per_group_projections_take_the_ring_from_17_rows(monkeypatch):
    """On a GPU MLA's per-head absorptions (16 groups, x offset 192 floats a head) take the ring
    tiles from a 17-row workspace (16-row blocks, 32-row past 512 rows), in both precisions (they
    fit fp32's two planes); one row keeps the rule's other tile, and weights that cannot be copied
    in 16-byte pieces keep theirs."""
    monkeypatch.setattr(L, "_SIM", False)
    w = _GpuArray((16, 512, 128), np.uint16)
    rings = {tile for _, tile in L._HEADS_RINGS}
    for rows, want in ((32, L._HEADS_RINGS[0][1]), (512, L._HEADS_RINGS[0][1]), (2048, L._HEADS_RINGS[1][1])):
        x = _GpuArray((rows, 16 * 192), np.float32)
        for precision in PRECISIONS:
            assert L._plan(x, 192, w, None, rows, precision).tile == want
    assert L._plan(_GpuArray((1, 16 * 192), np.float32), 192, w, None, 1, "bf16").tile not in rings
    odd = _GpuArray((16, 512, 124), np.uint16)                  # rows of 248 bytes: no 16-byte pieces
    assert L._plan(_GpuArray((128, 16 * 192), np.float32), 192, odd, None, 128, "bf16").tile not in rings


def test_tall_expert_items_give_way_to_fp32s_planes(monkeypatch):
    """On a GPU experts past _TALL_EXPERT_ROWS typical rows take 32-row items; in fp32 that SwiGLU
    tile's two activation planes do not fit 48 KiB, and the 16-row ring does (not the rule
    without a ring)."""
    monkeypatch.setattr(L, "_SIM", False)
    x, w = _GpuArray((2048, 2048), np.float32), _GpuArray((64, 1408, 2048), np.uint16)
    rows = dict(tile_rows=L._TALL_EXPERT_ROWS + 1, live_groups=64, grouped=True)
    assert L._plan(x, 0, w, w, 2048, "bf16", **rows).tile == L._TALL_EXPERT_RING
    assert L._staged_smem(L._TALL_EXPERT_RING, True, "fp32") > L._SMEM_MAX
    assert L._plan(x, 0, w, w, 2048, "fp32", **rows).tile == L._EXPERT_RING


def test_a_chosen_ring_that_does_not_fit_gives_the_rule_without_it(monkeypatch):
    """On a GPU a dense SwiGLU of 33+ rows takes ``_DENSE_RING`` in bf16; in fp32 its two activation
    planes do not fit 48 KiB with the ring, and the launch takes the rule without a ring (not the
    ring tile stripped of its ring). A forced ring of 1 slot is none; of too many, the most."""
    monkeypatch.setattr(L, "_SIM", False)
    x, w = _GpuArray((64, 2048), np.float32), _GpuArray((1, 2816, 2048), np.uint16)
    assert L._plan(x, 0, w, w, 64, "bf16").tile == L._DENSE_RING
    assert L._staged_smem(L._DENSE_RING, True, "fp32") > L._SMEM_MAX
    fp32 = L._plan(x, 0, w, w, 64, "fp32").tile
    assert getattr(fp32, "NS", 0) == 0 and fp32 != L._DENSE_RING._replace(NS=0)
    assert L._plan(x, 0, w, w, 64, "bf16", L._Staged(2, 2, 1, 2, 1)).tile.NS == 0
    assert L._plan(x, 0, w, w, 64, "bf16", L._Staged(1, 1, 1, 1, 9)).tile.NS == L._NS_MAX


def test_staged_tile_is_chosen_for_many_rows_of_word_loads(rng):
    rows, cols = L._STAGED_ROWS, 16 * 8 * L._STAGED_BLOCKS
    assert L._choose_staged(rows, cols, False, 1) == L._STAGED[False]
    assert L._choose_staged(rows - 1, cols, True, 1) is None


def test_grouped_row_matches_the_plain_projection_of_that_row(rng):
    """A token routed to expert z gives the bits of linear(token, w[z]), whatever the group's
    size, its offset and the tile (picked from max_rows, or from ``tile_rows``)."""
    K, N = 96, 18
    offsets, x, row_index, (w, _), _ = _grouped_case(rng, "bf16", [1, 9, 2], K, N, True)
    alone = {j: run_linear(x[row_index[j]][None], w[int(np.searchsorted(offsets, j, side="right") - 1)],
                           "bf16")[0] for j in (0, 11)}
    for tile_rows, item_rows in ((None, 8), (2, 8), (2, 16)):   # items of 16 rows: two row tiles a block
        d_out = dev(np.full((12, N), np.nan, np.float32))
        L._enqueue_grouped_linear(dev(x), dev(w), d_out, dev(items_of(offsets, item_rows)), 9, precision="bf16",
                                  row_index=dev(row_index), tile_rows=tile_rows)
        got = d_out.copy_to_host()
        for j, want in alone.items():
            assert_bits(got[j], want)
        assert not np.isnan(got).any()


def test_choose_fills_the_gpu_with_warps_only_up_to_the_chunks(monkeypatch):
    """Few rows split the chunks over warps (bounded by the chunk count and shared memory); the
    row tile grows with the rows. On a real GPU a small launch (at most 128 rows over at most 2^20
    weights) takes one row tile and one m tile a warp instead; the simulator keeps the general
    rule (its tiles are exercised by the tests at small shapes). Both regimes are checked here,
    whichever backend runs the suite."""
    for sim in (True, False):
        monkeypatch.setattr(L, "_SIM", sim)
        L._choose.cache_clear()
        t = L._choose(1, 64, 64 * 3, False, 1)
        assert t.NW <= 3 and t.RT == 1
        assert L._choose(32, 4096, 512, False, 1).RT == 4          # 2^21 weights: not small
        small = L._choose(32, 128, 512, False, 1)
        assert (small.RT, small.MT) == ((4, 2) if sim else (1, 1))
        assert small.NW <= (L._NW_MAX if sim else 4)
        wide = L._choose(128, 128, 512, False, 1)                 # budget 64's verify workspace
        assert (wide.RT, wide.MT) == ((4, 2) if sim else (1, 1))
        assert L._choose(512, 128, 512, False, 1).RT == (4 if sim else 1)    # a batch of 16 trees of 17
        assert L._choose(1024, 128, 512, False, 1).RT == 4        # past _SMALL_ROWS: the general rule
        # narrow (the router, 64 outputs): one tile a warp, warps up to the chunks, at any rows
        for rows in (1, 512):
            assert L._choose(rows, 64, 2048, False, 1, "f32") == ((1, 1, L._NW_MAX) if not sim else
                                                                  L._choose(rows, 65, 2048, False, 1, "f32"))
        # expert groups of a few rows: four warps at least, two m tiles unless SwiGLU
        # (the simulator adds no warps; on a GPU its branch keeps the GPU's warp constants)
        few_down, few_up = L._choose(2, 2048, 1408, False, 6), L._choose(2, 1408, 2048, True, 6)
        assert (few_down.MT, few_down.RT, few_up.MT, few_up.RT) == (2, 1, 1, 1)
        if not sim:
            assert few_down.NW == few_up.NW == min(L._FEW_ROWS_WARPS, L._NW_MAX)
        elif not REAL_GPU:
            assert few_down.NW == few_up.NW == 1
        # SwiGLU at four row tiles: one m tile (two spill), two warps at least on a GPU
        tall = L._choose(128, 2816, 2048, True, 1)
        assert (tall.MT, tall.RT, tall.NW >= (1 if sim else 2)) == (1, 4, True)
        for rows in (1, 16, 64, 1024):
            tile = L._choose(rows, 7168, 7168, True, 1)
            assert L._smem(tile, True) <= L._SMEM_MAX
        # expert groups: one row tile a warp up to _GROUPED_ONE_ROW_TILE rows, the general rule past it
        assert (L._choose(24, 1408, 2048, True, 64).RT, L._choose(24, 1408, 2048, True, 64).MT) == (1, 2)
        assert L._choose(24, 1408, 2048, True, 1).RT == 4                 # one group: unchanged
        assert L._choose(L._GROUPED_ONE_ROW_TILE + 1, 1408, 2048, False, 64).RT == 4
        # ... except the experts' gate|up (SwiGLU groups): two m tiles of two row tiles, not staged
        # without a ring (with one, on a GPU: _EXPERT_RING, below)
        assert L._choose(L._GROUPED_ONE_ROW_TILE + 1, 1408, 2048, True, 64) == L._TALL_SWIGLU
        assert L._choose_staged(4 * L._STAGED_ROWS, 1408, True, 64) is None
        assert L._choose_staged(4 * L._STAGED_ROWS, 2048, False, 64) == L._STAGED[True]
        # the cp.async ring (bf16 weights in whole pieces), on a GPU only: expert work items (8-row
        # items up to _FEW_ROWS typical rows, 16-row past them), dense launches of _RING_ROWS rows
        # over more than _SMALL_WEIGHTS (the simulator keeps the rule above: its whole-forward tests
        # use small tiles)
        if not sim:
            ring = dict(ring=True)
            assert L._choose_staged(L._FEW_ROWS + 1, 1408, True, 64, 2048, grouped=True, **ring) == L._EXPERT_RING
            assert L._choose_staged(L._TALL_EXPERT_ROWS, 1408, False, 64, 1408, grouped=True, **ring) == L._EXPERT_RING
            tall = L._choose_staged(L._TALL_EXPERT_ROWS + 1, 1408, True, 64, 2048, grouped=True, **ring)
            assert tall == L._TALL_EXPERT_RING and L._rows_a_tile(tall) == 32
            assert L._choose_staged(L._FEW_ROWS, 1408, True, 64, 2048, grouped=True, **ring) == L._FEW_EXPERT_RING
            assert L._choose_staged(1, 1408, False, 64, 1408, grouped=True, **ring) == L._FEW_EXPERT_RING
            assert L._choose_staged(L._RING_ROWS, 2816, True, 1, 2048, **ring) == L._DENSE_RING
            # (the rule above decides these; with the simulator's constants it may stage them)
            assert L._choose_staged(L._RING_ROWS, 256, True, 1, 256, **ring) != L._DENSE_RING   # small
            assert L._choose_staged(L._RING_ROWS - 1, 2816, True, 1, 2048, **ring) != L._DENSE_RING
            assert L._choose_staged(L._FEW_ROWS + 1, 1408, True, 64, 2048, grouped=True) is None  # no ring
            # the other dense launches by their workspace's rows, lm_head-wide ones from 17 rows
            dense = [L._choose_staged(r, 3072, False, 1, 2048, **ring) for r in (33, 128, 129, 512, 513, 2048)]
            assert dense == [L._DENSE_RINGS[0][1]] * 2 + [L._DENSE_RINGS[1][1]] * 2 + [L._DENSE_RINGS[2][1]] * 2
            # (off the ring: None, or the rule above, which with the simulator's constants may stage)
            def no_ring(r, n_cols, swiglu=False, n_groups=1):
                return getattr(L._choose_staged(r, n_cols, swiglu, n_groups, 2048, **ring), "NS", 0) == 0

            assert no_ring(32, 3072)                                    # below _RING_ROWS
            wide = [L._choose_staged(r, L._WIDE_COLS, False, 1, 2048, **ring) for r in (17, 32, 33, 2048)]
            assert wide == [L._WIDE_RINGS[0][1]] * 2 + [L._WIDE_RINGS[1][1]] * 2
            assert no_ring(16, L._WIDE_COLS)                            # below _WIDE_RING_ROWS
            assert no_ring(32, L._WIDE_COLS, swiglu=True)              # not wide
            # per-group projections (MLA's absorptions) by their workspace's rows, from 17
            heads = [L._choose_staged(r, 512, False, 16, 128, **ring) for r in (17, 512, 513, 2048)]
            assert heads == [L._HEADS_RINGS[0][1]] * 2 + [L._HEADS_RINGS[1][1]] * 2
            assert no_ring(16, 512, n_groups=16) and no_ring(32, 512, swiglu=True, n_groups=16)
        for tile, swiglu in ((L._EXPERT_RING, True), (L._EXPERT_RING, False), (L._FEW_EXPERT_RING, True),
                             (L._FEW_EXPERT_RING, False), (L._TALL_EXPERT_RING, True), (L._TALL_EXPERT_RING, False),
                             (L._DENSE_RING, True),
                             *((t, False) for _, t in L._DENSE_RINGS + L._WIDE_RINGS + L._HEADS_RINGS)):
            assert L._staged_smem(tile, swiglu, "bf16") <= L._SMEM_MAX
        for _, tile in L._DENSE_RINGS + L._WIDE_RINGS + L._HEADS_RINGS:   # fp32 activations: two planes (no XA)
            assert L._staged_smem(tile._replace(XA=0), False, "fp32") <= L._SMEM_MAX
    L._choose.cache_clear()


@pytest.mark.skipif(REAL_GPU, reason="the simulator's emulation of mma.sync")
def test_simulated_mma_leaves_no_lane_waiting_when_a_lane_raises():
    """The emulation's per-warp barrier: a lane that raises aborts the block, and the lanes that
    wait for it leave too (a thread left waiting would hold the kernel module's simulated
    ``cuda`` swapped in for every later launch)."""
    import threading
    import time

    from ddtree_numba.kernels._mma import mma_bf16

    @cuda.jit
    def kernel(out):
        lane = cuda.threadIdx.x
        if lane == 5:
            raise IndexError("lane 5")
        d = mma_bf16(0, 0, 0, 0, 0, 0, 1.0, 1.0, 1.0, 1.0)
        out[lane] = d[0]

    with pytest.raises(IndexError, match="lane 5"):
        kernel[1, 32](np.zeros(32, np.float32))
    time.sleep(0.3)
    assert not [t for t in threading.enumerate() if type(t).__name__ == "BlockThread" and t.is_alive()]


@pytest.mark.skipif(REAL_GPU, reason="the simulator's emulation of mma.sync")
def test_simulated_mma_is_the_fragment_layout_of_the_ptx_isa(rng):
    """A 16x16 @ 16x8 product through the fragments as the PTX ISA lays them out (the
    module docstring of kernels/_mma.py), against numpy on the bf16-rounded operands."""
    from ddtree_numba.kernels._mma import mma_bf16, pack_bf16x2

    A = rng.standard_normal((16, 16)).astype(np.float32)
    B = rng.standard_normal((16, 8)).astype(np.float32)
    C = rng.standard_normal((16, 8)).astype(np.float32)

    @cuda.jit
    def kernel(A, B, C, D):
        lane = cuda.threadIdx.x
        g, t = lane // 4, lane % 4
        d = mma_bf16(pack_bf16x2(A[g, 2 * t], A[g, 2 * t + 1]), pack_bf16x2(A[g + 8, 2 * t], A[g + 8, 2 * t + 1]),
                     pack_bf16x2(A[g, 2 * t + 8], A[g, 2 * t + 9]),
                     pack_bf16x2(A[g + 8, 2 * t + 8], A[g + 8, 2 * t + 9]),
                     pack_bf16x2(B[2 * t, g], B[2 * t + 1, g]), pack_bf16x2(B[2 * t + 8, g], B[2 * t + 9, g]),
                     C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1])
        D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1] = d[0], d[1], d[2], d[3]

    D = np.full((16, 8), np.nan, np.float32)
    kernel[1, 32](A, B, C, D)
    want = bf16_round(A).astype(np.float64) @ bf16_round(B).astype(np.float64) + C
    np.testing.assert_allclose(D, want, rtol=2 ** -23, atol=1e-6)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_activations_kept_raw_until_the_mma_give_the_same_bits(rng, monkeypatch, precision):
    """``_X_RAW`` (on by default: the register kernel converts each chunk's activations at its mma
    step, and reads a tile's gathered row numbers once) gives the same bits with it as without
    it, for gathered SwiGLU experts and a plain projection, at a tile of two row tiles and one of
    warps splitting the chunks; in both precisions (fp32 splits each activation into hi + lo there)."""
    K, N = 96, 22
    offsets, x, row_index, (w, wf), (wu, _) = _grouped_case(rng, "bf16", [3, 0, 9], K, N, True)
    Ro = int(offsets[-1])

    def run(xraw, tile):
        monkeypatch.setattr(L, "_X_RAW", xraw)
        d_out = dev(np.full((Ro, N), np.nan, np.float32))
        L._enqueue_grouped_linear(dev(x), dev(w), d_out, dev(items_of(offsets)), 9, precision=precision,
                                  row_index=dev(row_index), w_up=dev(wu), tile=tile)
        return d_out.copy_to_host(), run_linear(x, w[0], precision, tile=tile)

    for name, tile in (("split", L._Tile(1, 1, 2)), ("wide", L._Tile(2, 2, 1))):  # warps splitting the
        raw, plain = run(True, tile), run(False, tile)                            # chunks; two row tiles
        assert_bits(raw[0], plain[0]), name
        assert_bits(raw[1], plain[1]), name
        assert not np.isnan(raw[0]).any()
