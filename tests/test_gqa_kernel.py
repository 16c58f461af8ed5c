"""The GQA attention kernel against its numpy twin, and the enqueue API the drafter calls
(context rows of a cache then the block's own rows, sizes from a device meta, live rows below
the buffer's)."""

import numpy as np
import pytest

from conftest import REAL_GPU
from numba import cuda

from ddtree_numba import kernels as kn
from ddtree_numba import reference as ref
from ddtree_numba.kernels.gqa import GQAScratch, _enqueue_draft_meta, _enqueue_gqa_attention, _tiles

pytestmark = pytest.mark.kernels

POISON = np.float32(-12345.0)


def assert_rel(got, want, tol=1e-5):
    """max |got - want| <= tol * max |want| (a relative error over the whole array)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    scale = max(float(np.abs(want).max(initial=0.0)), 1e-30)
    err = float(np.abs(got.astype(np.float64) - want).max(initial=0.0))
    assert err <= tol * scale, f"relative error {err / scale:.3g} > {tol}"


def qkv(rng, t, hq, hkv, dh, s, spread=2.0):
    q = (rng.standard_normal((t, hq, dh)) * spread).astype(np.float32)   # peaked softmax rows too
    k = rng.standard_normal((s, hkv, dh)).astype(np.float32)
    v = rng.standard_normal((s, hkv, dh)).astype(np.float32)
    return q, k, v


# (T, Hq, Hkv, Dh, S): groups of 1, 2, 3 and 5 heads, one key, keys across several tiles and
# splits with a partial last tile, row blocks that end inside a query's heads
@pytest.mark.parametrize("t, hq, hkv, dh, s", [(3, 6, 2, 8, 11), (5, 4, 4, 6, 1), (2, 3, 1, 10, 19),
                                               (1, 5, 1, 4, 9), (4, 4, 2, 2, 16)])
def test_gqa_attention_matches_twin(rng, t, hq, hkv, dh, s):
    q, k, v = qkv(rng, t, hq, hkv, dh, s)
    got = kn.gqa_attention(q, k, v, dh ** -0.5)
    assert isinstance(got, np.ndarray)
    assert_rel(got, ref.gqa_attention(q, k, v, dh ** -0.5))
    d = kn.gqa_attention(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v), dh ** -0.5)
    assert not isinstance(d, np.ndarray)                               # device in, device out
    np.testing.assert_array_equal(d.copy_to_host(), got)


def test_gqa_attention_mask_matches_twin(rng):
    q, k, v = qkv(rng, 4, 6, 3, 8, 13)
    mask = rng.random((4, 13)) < 0.5
    mask[:, 12] = True
    mask[1] = False                                                    # a row seeing one key only
    mask[1, 5] = True
    mask[2, :9] = False                                                # nothing in the first splits
    assert_rel(kn.gqa_attention(q, k, v, 0.4, mask), ref.gqa_attention(q, k, v, 0.4, mask))
    mask[3] = False                                                    # a row seeing nothing: NaN,
    with np.errstate(invalid="ignore"):                                # as the twin gives
        assert np.isnan(ref.gqa_attention(q, k, v, 0.4, mask)[3]).all()
    assert np.isnan(kn.gqa_attention(q, k, v, 0.4, mask)[3]).all()


def test_gqa_attention_is_batch_invariant(rng):
    """A query's output is the same bits alone or among other queries (row blocks differ)."""
    q, k, v = qkv(rng, 5, 4, 2, 8, 21)
    full = kn.gqa_attention(q, k, v, 0.35)
    for i in (0, 3):
        np.testing.assert_array_equal(kn.gqa_attention(q[i:i + 1], k, v, 0.35)[0], full[i])


def test_gqa_attention_bad_input(rng):
    q, k, v = qkv(rng, 2, 6, 2, 4, 5)
    with pytest.raises(ValueError, match="not a multiple"):
        kn.gqa_attention(q[:, :5], k, v, 0.5)
    with pytest.raises(ValueError, match="q must have dtype float32"):
        kn.gqa_attention(q.astype(np.float64), k, v, 0.5)
    with pytest.raises(ValueError, match="v has shape"):
        kn.gqa_attention(q, k, v[:4], 0.5)
    with pytest.raises(ValueError, match="k has shape"):
        kn.gqa_attention(q, k[..., :3], v[..., :3], 0.5)
    with pytest.raises(ValueError, match="mask has shape"):
        kn.gqa_attention(q, k, v, 0.5, np.ones((2, 4), bool))
    with pytest.raises(ValueError, match="mask must have dtype bool"):
        kn.gqa_attention(q, k, v, 0.5, np.ones((2, 5), np.int32))
    with pytest.raises(ValueError, match="no keys"):
        kn.gqa_attention(q, k[:0], v[:0], 0.5)
    with pytest.raises(ValueError, match="scale must be a finite number"):
        kn.gqa_attention(q, k, v, float("nan"))


@pytest.mark.parametrize("s", [0, 1, 10])
def test_enqueue_context_then_block(rng, s):
    """The drafter's launch: keys = cache rows [0, s) then the block's rows [0, t), t live rows of
    a larger buffer; cache rows past s are NaN (never read) and out rows past t stay untouched."""
    tq, t, hq, hkv, dh, s_cap = 6, 5, 6, 2, 8, 13
    q, kb, vb = qkv(rng, tq, hq, hkv, dh, tq)
    _, kc, vc = qkv(rng, 1, hq, hkv, dh, s_cap)
    kc[s:], vc[s:] = np.nan, np.nan
    w = hkv * dh
    out0 = np.full((tq, hq * dh), POISON, np.float32)
    d_out = cuda.to_device(out0)
    scratch = GQAScratch(tq, hq, dh, s_cap + tq)
    _enqueue_gqa_attention(cuda.to_device(q.reshape(tq, -1)), cuda.to_device(kc.reshape(s_cap, w)),
                           cuda.to_device(vc.reshape(s_cap, w)), cuda.to_device(kb.reshape(tq, w)),
                           cuda.to_device(vb.reshape(tq, w)), cuda.to_device(np.array([s, t], np.int32)),
                           0.3, d_out, scratch)
    got = d_out.copy_to_host()
    k = np.concatenate([kc[:s], kb[:t]])
    v = np.concatenate([vc[:s], vb[:t]])
    want = ref.gqa_attention(q[:t], k, v, 0.3).reshape(t, hq * dh)
    assert_rel(got[:t], want)
    np.testing.assert_array_equal(got[t:], out0[t:])
    # a longer context crosses splits (the simulator's tiles; a GPU's splits are longer than
    # these shapes): the grid covers it and the combine merges them in order
    assert s_cap + tq > _tiles(dh).SPLIT or REAL_GPU


def test_draft_meta_from_device_sizes():
    """The drafter's per-draft sizes: positions, block ids, live counts and the cache length,
    all from device values; too many rows append nothing and raise the overflow flag."""
    status = cuda.to_device(np.array([5, 0], np.int32))
    n, bonus = cuda.to_device(np.array([3], np.int32)), cuda.to_device(np.array([42], np.int32))
    ids, pos_ctx, pos_blk, meta = (cuda.to_device(np.full(k, -7, np.int32)) for k in (4, 6, 4, 8))
    args = (ids, pos_ctx, pos_blk, meta)
    _enqueue_draft_meta(status, n, bonus, 12, 6, 6, 2, 95, *args)        # capacity 12, n_cap 6
    np.testing.assert_array_equal(status.copy_to_host(), [8, 0])
    np.testing.assert_array_equal(meta.copy_to_host(), [5, 3, 8, 4, 6, 8, 24, 3])
    np.testing.assert_array_equal(ids.copy_to_host(), [42, 95, 95, 95])
    np.testing.assert_array_equal(pos_ctx.copy_to_host(), np.arange(5, 11))
    np.testing.assert_array_equal(pos_blk.copy_to_host(), np.arange(8, 12))
    _enqueue_draft_meta(status, n, bonus, 12, 6, 6, 2, 95, *args, write_block=False)
    np.testing.assert_array_equal(status.copy_to_host(), [11, 0])
    for bad_n, cap in ((2, 12), (7, 40), (-1, 40)):                      # past capacity, past n_cap
        ids.copy_to_device(np.arange(4, dtype=np.int32))
        n.copy_to_device(np.array([bad_n], np.int32))
        _enqueue_draft_meta(status, n, bonus, cap, 6, 6, 2, 95, *args, write_block=False)
        np.testing.assert_array_equal(status.copy_to_host(), [11, 1])
        np.testing.assert_array_equal(meta.copy_to_host()[:3], [11, 0, 11])
        np.testing.assert_array_equal(ids.copy_to_host(), np.arange(4))  # ids left as written
        status.copy_to_device(np.array([11, 0], np.int32))
