"""The GQA attention kernel against its numpy twin, and the enqueue API the drafter calls
(context rows of a cache then the block's own rows, sizes from a device meta, live rows below
the buffer's)."""

import numpy as np
import pytest

from conftest import REAL_GPU
from numba import cuda

from ddtree_numba import kernels as kn
from ddtree_numba import reference as ref
from ddtree_numba.kernels.gqa import GQAScratch, _tiles, enqueue_gqa_attention

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


def test_values_over_the_keys_buffer_give_the_same_bits(rng, monkeypatch):
    """Large heads stage a tile's values over the keys' buffer after the scores (``_early_v``
    False on a GPU's tiles past Dh 64), the rest in a buffer of their own, loaded with the keys:
    the same bits either way (the simulator's tiles always take the second, so force the first)."""
    import importlib
    gqa = importlib.import_module("ddtree_numba.kernels.gqa")
    q, k, v = qkv(rng, 3, 4, 2, 8, 19)
    mask = rng.random((3, 19)) < 0.7
    want = [kn.gqa_attention(q, k, v, 0.3), kn.gqa_attention(q, k, v, 0.3, mask)]
    monkeypatch.setattr(gqa, "_early_v", lambda dh, cfg: False)
    gqa._gqa_split_kernel.cache_clear()
    try:
        got = [kn.gqa_attention(q, k, v, 0.3), kn.gqa_attention(q, k, v, 0.3, mask)]
    finally:
        gqa._gqa_split_kernel.cache_clear()     # the next factory call takes the real rule
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))


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
    enqueue_gqa_attention(cuda.to_device(q.reshape(tq, -1)), cuda.to_device(kc.reshape(s_cap, w)),
                          cuda.to_device(vc.reshape(s_cap, w)), d_out, k_blk=cuda.to_device(kb.reshape(tq, w)),
                          v_blk=cuda.to_device(vb.reshape(tq, w)), meta=cuda.to_device(np.array([s, t], np.int32)),
                          scale=0.3, scratch=scratch)
    got = d_out.copy_to_host()
    k = np.concatenate([kc[:s], kb[:t]])
    v = np.concatenate([vc[:s], vb[:t]])
    want = ref.gqa_attention(q[:t], k, v, 0.3).reshape(t, hq * dh)
    assert_rel(got[:t], want)
    np.testing.assert_array_equal(got[t:], out0[t:])
    # a longer context crosses splits (the simulator's tiles; a GPU's splits are longer than
    # these shapes): the grid covers it and the combine merges them in order
    assert s_cap + tq > _tiles(dh).SPLIT or REAL_GPU


def _context_launch(rng, tq, hq, hkv, dh, s_cap):
    """Host q / block keys / block values [tq, ...] and context keys / values [s_cap, ...], their
    device arrays as ``enqueue_gqa_attention`` takes them (args: q, k_ctx, v_ctx; blk: the block's
    keys and values) and a scratch for them."""
    q, kb, vb = qkv(rng, tq, hq, hkv, dh, tq)
    _, kc, vc = qkv(rng, 1, hq, hkv, dh, s_cap)
    w = hkv * dh
    args = [cuda.to_device(a) for a in (q.reshape(tq, -1), kc.reshape(s_cap, w), vc.reshape(s_cap, w))]
    blk = dict(k_blk=cuda.to_device(kb.reshape(tq, w)), v_blk=cuda.to_device(vb.reshape(tq, w)))
    return (q, kb, vb, kc, vc), args, blk, GQAScratch(tq, hq, dh, s_cap + tq)


def test_fused_merge_gives_the_two_launch_bits_and_resets_its_counters(rng):
    """The splits merged by their last block (the default, one launch) == the merge's own launch
    (``fuse=False``), bit for bit, over several splits, groups and row blocks; launched twice (as
    a replayed graph), since the last block resets the arrival counters; and a context of no key
    gives NaN rows both ways, as the twin."""
    tq, t, hq, hkv, dh, s_cap = 6, 5, 6, 2, 8, 23
    _, args, blk, scratch = _context_launch(rng, tq, hq, hkv, dh, s_cap)

    def run(fuse, s, has_blk=True):
        d_out = cuda.to_device(np.full((tq, hq * dh), POISON, np.float32))
        enqueue_gqa_attention(*args, d_out, meta=cuda.to_device(np.array([s, t], np.int32)), scale=0.3,
                              scratch=scratch, fuse=fuse, **(blk if has_blk else {}))
        return d_out.copy_to_host()

    for s in (s_cap, 9):
        plain = run(False, s)
        for _ in range(2):
            fused = run(True, s)
            np.testing.assert_array_equal(fused.view(np.uint32), plain.view(np.uint32))
            assert not scratch.arrive.copy_to_host().any()
    assert s_cap + tq > 2 * _tiles(dh).SPLIT or REAL_GPU      # several splits a row (the simulator's)
    assert np.isnan(run(True, 0, has_blk=False)[:t]).all() and np.isnan(run(False, 0, has_blk=False)[:t]).all()
    # a context longer than the grid was sized for (device sizes are not checked): NaN rows and
    # no arrival counted, so the next launch is right again
    assert np.isnan(run(True, s_cap + 20 * _tiles(dh).SPLIT)[:t]).all()
    assert not scratch.arrive.copy_to_host().any()
    np.testing.assert_array_equal(run(True, 9).view(np.uint32), run(False, 9).view(np.uint32))


def test_fuse_merge_knob_picks_the_merge_launch_for_one_sequence(rng, monkeypatch):
    """``gqa.FUSE_MERGE`` = False: a launch that does not say ``fuse`` merges in a launch of its own
    (the merge kernel is launched; with the default True it is not), with the fused launch's bits."""
    from ddtree_numba.kernels import gqa
    tq, t, hq, hkv, dh, s_cap = 6, 5, 6, 2, 8, 23
    _, args, blk, scratch = _context_launch(rng, tq, hq, hkv, dh, s_cap)
    meta = cuda.to_device(np.array([s_cap, t], np.int32))
    merges = []
    real = gqa._gqa_combine_kernel

    class Spy:
        def __getitem__(self, config):
            merges.append(config)
            return real[config]

    monkeypatch.setattr(gqa, "_gqa_combine_kernel", Spy())
    got = {}
    for knob in (True, False):
        monkeypatch.setattr(gqa, "FUSE_MERGE", knob)
        d_out = cuda.to_device(np.full((tq, hq * dh), POISON, np.float32))
        enqueue_gqa_attention(*args, d_out, meta=meta, scale=0.3, scratch=scratch, **blk)
        got[knob] = d_out.copy_to_host()
        assert len(merges) == (0 if knob else 1)
    np.testing.assert_array_equal(got[True].view(np.uint32), got[False].view(np.uint32))


def test_fused_merge_over_many_splits(rng):
    """A context of many splits (more than the threads a row, on the simulator's tiles and a GPU's
    alike, ending inside a split): the fused merge gives the merge launch's bits, for a row block
    that ends inside a query's heads, and the twin's values within float32."""
    cfg = _tiles(8)
    tpr = cfg.NT // cfg.RM
    tq, t, hq, hkv, dh = 3, 3, 6, 2, 8
    s_cap = (2 * tpr + 1) * cfg.SPLIT + 5
    (q, kb, vb, kc, vc), args, blk, scratch = _context_launch(rng, tq, hq, hkv, dh, s_cap)
    meta = cuda.to_device(np.array([s_cap, t], np.int32))
    got = {}
    for fuse in (True, False):
        d_out = cuda.to_device(np.full((tq, hq * dh), POISON, np.float32))
        enqueue_gqa_attention(*args, d_out, meta=meta, scale=0.3, scratch=scratch, fuse=fuse, **blk)
        got[fuse] = d_out.copy_to_host()
    np.testing.assert_array_equal(got[True].view(np.uint32), got[False].view(np.uint32))
    assert not scratch.arrive.copy_to_host().any()
    want = ref.gqa_attention(q, np.concatenate([kc, kb]), np.concatenate([vc, vb]), 0.3).reshape(tq, hq * dh)
    assert_rel(got[True], want)


def test_a_batch_of_sequences_in_one_launch_gives_each_its_own_launchs_bits(rng):
    """k_ctx [S, S_cap, W] (a drafter cache pool's layer), meta [S, 2]: S sequences' queries (equal
    runs of rows, strided column views as the drafter passes them) in one launch, each run the
    bits of its own launch, the counters back at zero; the twin gives the same within float32."""
    S, tq, hq, hkv, dh, s_cap = 3, 5, 4, 2, 8, 14
    w = hkv * dh
    qkv = rng.standard_normal((S * tq, hq * dh + 2 * w)).astype(np.float32)     # q | k | v, one buffer
    kc = rng.standard_normal((S, s_cap, w)).astype(np.float32)
    vc = rng.standard_normal((S, s_cap, w)).astype(np.float32)
    meta = np.array([[9, tq], [0, tq], [s_cap, tq]], np.int32)                  # (s, t) a sequence
    scratch = GQAScratch(S * tq, hq, dh, s_cap + tq)
    d_qkv = cuda.to_device(qkv)
    q, kb, vb = d_qkv[:, :hq * dh], d_qkv[:, hq * dh:hq * dh + w], d_qkv[:, hq * dh + w:]
    d_out = cuda.to_device(np.full((S * tq, hq * dh), POISON, np.float32))
    enqueue_gqa_attention(q, cuda.to_device(kc), cuda.to_device(vc), d_out, k_blk=kb, v_blk=vb,
                          meta=cuda.to_device(meta), scale=0.3, scratch=scratch)
    got = d_out.copy_to_host()
    assert not scratch.arrive.copy_to_host().any()
    for z in range(S):
        rows = slice(z * tq, (z + 1) * tq)
        one = cuda.to_device(np.full((tq, hq * dh), POISON, np.float32))
        enqueue_gqa_attention(q[rows], cuda.to_device(kc[z]), cuda.to_device(vc[z]), one, k_blk=kb[rows],
                              v_blk=vb[rows], meta=cuda.to_device(meta[z]), scale=0.3, scratch=scratch)
        np.testing.assert_array_equal(got[rows].view(np.uint32), one.copy_to_host().view(np.uint32))
    want = np.zeros_like(got)
    ref.enqueue_gqa_attention(qkv[:, :hq * dh], kc, vc, want, k_blk=qkv[:, hq * dh:hq * dh + w],
                              v_blk=qkv[:, hq * dh + w:], meta=meta, scale=0.3, scratch=scratch)
    assert_rel(got, want)
    with pytest.raises(ValueError, match="no mask and the fused merge only"):
        enqueue_gqa_attention(q, cuda.to_device(kc), cuda.to_device(vc), d_out, meta=cuda.to_device(meta),
                              scale=0.3, scratch=scratch, fuse=False)


@pytest.mark.parametrize("s_cap, has_blk", [(45, True), (136, False), (0, False)])
def test_warp_kernel_gives_the_split_kernels_bits(rng, s_cap, has_blk):
    """``method="warp"`` (a block's warps over every split of its rows, the default without a
    mask) == the split kernel's fused launch bit for bit: one sequence and a batch of three, the
    default tiles, a warp over three rows (row blocks that end inside a query's heads) and three
    warps over one row, a context ending inside a split, more splits than a block has warps (136
    keys), and no key at all (NaN rows)."""
    from ddtree_numba.kernels.gqa import _WarpTiles, _warp_tiles
    S, tq, t, hq, hkv, dh = 3, 4, 3, 6, 2, 8
    w = hkv * dh
    qkv = (rng.standard_normal((S * tq, hq * dh + 2 * w)) * 2).astype(np.float32)
    kc = rng.standard_normal((S, max(s_cap, 1), w)).astype(np.float32)
    vc = rng.standard_normal((S, max(s_cap, 1), w)).astype(np.float32)
    meta = np.array([[s_cap, t], [s_cap // 2, t], [max(s_cap - 7, 0), t]], np.int32)
    scratch = GQAScratch(S * tq, hq, dh, kc.shape[1] + tq)
    d_qkv = cuda.to_device(qkv)
    q, kb, vb = d_qkv[:, :hq * dh], d_qkv[:, hq * dh:hq * dh + w], d_qkv[:, hq * dh + w:]
    blk = dict(k_blk=kb, v_blk=vb) if has_blk else {}
    for n_seq in (1, S):
        kcd, vcd = (cuda.to_device(kc), cuda.to_device(vc)) if n_seq > 1 else (cuda.to_device(kc[0]), cuda.to_device(vc[0]))
        md = cuda.to_device(meta if n_seq > 1 else meta[0])
        rows = slice(0, n_seq * tq)
        got = {}
        for method, wt in (("split", None), ("warp", None), ("warp", _WarpTiles(3, 1)), ("warp", _WarpTiles(1, 3))):
            d_out = cuda.to_device(np.full((n_seq * tq, hq * dh), POISON, np.float32))
            enqueue_gqa_attention(q[rows], kcd, vcd, d_out, meta=md, scale=0.3, scratch=scratch, method=method,
                                  warp_tiles=wt, **({k: v[rows] for k, v in blk.items()}))
            got[(method, wt)] = d_out.copy_to_host()
        want = got[("split", None)]
        for key, out in got.items():
            np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32), err_msg=str(key))
        live = np.concatenate([np.arange(z * tq, z * tq + t) for z in range(n_seq)])
        assert not (want[live] == POISON).any()
        assert (want[np.setdiff1d(np.arange(n_seq * tq), live)] == POISON).all()
        assert np.isnan(want[live]).all() == (s_cap == 0 and not has_blk)
    assert _warp_tiles(dh, 1).NW == 2 or REAL_GPU          # (so that 136 keys are more splits than warps)
    with pytest.raises(ValueError, match="method 'warp' takes no mask"):
        enqueue_gqa_attention(q, cuda.to_device(kc[0]), cuda.to_device(vc[0]), d_out, meta=cuda.to_device(meta[0]), scale=0.3,
                              scratch=scratch, method="warp", mask=cuda.to_device(np.ones((tq, s_cap + tq), bool)))
    with pytest.raises(ValueError, match="shared memory"):                     # (checked before any launch)
        enqueue_gqa_attention(q, cuda.to_device(kc[0]), cuda.to_device(vc[0]), d_out, meta=cuda.to_device(meta[0]),
                              scale=0.3, scratch=scratch, method="warp", warp_tiles=_WarpTiles(1000, 8))
    with pytest.raises(ValueError, match="RW, NW >= 1"):
        enqueue_gqa_attention(q[:0], cuda.to_device(kc[0]), cuda.to_device(vc[0]), d_out[:0],
                              meta=cuda.to_device(meta[0]), scale=0.3, scratch=scratch, method="warp",
                              warp_tiles=_WarpTiles(0, 2))
    with pytest.raises(ValueError, match="method must be None, 'warp' or 'split'"):
        enqueue_gqa_attention(q, cuda.to_device(kc[0]), cuda.to_device(vc[0]), d_out, meta=cuda.to_device(meta[0]),
                              scale=0.3, scratch=scratch, method="warps")
