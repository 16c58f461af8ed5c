"""The DFlash drafter on the GPU (``CudaDrafter``) against its numpy twin (``NumpyDrafter``) and the
HF Qwen3 golden, and its device API (device features / n / bonus, device cache length)."""

import os

import numpy as np
import pytest
from numba import cuda

import ddtree_numba as dd
from ddtree_numba.model import NumpyDrafter, cuda_drafter, random_drafter
from ddtree_numba.model.cuda_drafter import CudaDrafter, DeviceDrafterCache
from ddtree_numba.model.protocols import DeviceCache, DeviceDrafter, DeviceTarget, Drafter, Target

pytestmark = pytest.mark.kernels

DATA = os.path.join(os.path.dirname(__file__), "data")
GOLDEN = os.path.join(DATA, "drafters", "dflash_v3_noaux_tc")


def assert_rel(got, want, tol, what):
    """max |got - want| <= tol * max |want| (a relative error over the whole array)."""
    assert got.shape == want.shape and got.dtype == np.float32, what
    scale = max(float(np.abs(want).max()), 1e-30)
    err = float(np.abs(got.astype(np.float64) - want).max())
    assert err <= tol * scale, f"{what}: relative error {err / scale:.3g} > {tol}"


@pytest.fixture(scope="module")
def targets():
    path = os.path.join(DATA, "v3_noaux_tc")
    return dd.load_target(path), dd.load_target(path, backend="cuda", precision="fp32")


def test_golden_two_drafts_match_the_twin_and_hf(targets):
    """tests/data/drafters: two drafts with the context growing between them (bf16 drafter
    weights kept as bf16 on the device); logits against the numpy twin and the HF goldens, the
    final hidden against the goldens."""
    host_t, dev_t = targets
    g = np.load(os.path.join(GOLDEN, "expected.npz"))
    host, dev = dd.load_drafter(GOLDEN, host_t), dd.load_drafter(GOLDEN, dev_t)
    assert isinstance(host, NumpyDrafter) and isinstance(dev, CudaDrafter)
    # both backends implement the protocols the decode loops use; the cuda ones the device ones too
    assert isinstance(host_t, Target) and isinstance(host, Drafter) and not isinstance(host, DeviceDrafter)
    assert isinstance(dev_t, DeviceTarget) and isinstance(dev, DeviceDrafter)
    assert isinstance(dev_t.new_cache(2), DeviceCache) and dev_t.backend == dev.backend == "cuda"
    assert dev.weight_dtype == "bfloat16" and dev.layers[0].q_proj.dtype == np.uint16
    assert (dev.block_size, dev.target_layer_ids, dev.mask_token_id) == (6, (0, 2), 95)
    split, feats = int(g["split"]), g["features"]
    hc, dc, fc = host.new_cache(32), dev.new_cache(32), dev.new_cache(32)
    for call, (lo, hi) in enumerate([(0, split), (split, feats.shape[0])]):
        bonus = int(g[f"block{call}"][0])
        assert (g[f"block{call}"][1:] == dev.mask_token_id).all()
        want = host.draft(feats[lo:hi], bonus, hc)
        got = dev.draft(feats[lo:hi], bonus, dc)
        assert isinstance(got, np.ndarray)
        assert_rel(got, want, 1e-4, f"draft {call} vs twin")
        assert_rel(got, g[f"logits{call}"], 1e-4, f"draft {call} vs HF")
        # the final-normed block (a draft folds the final norm into lm_head: forward returns it)
        hidden = dev.forward(feats[lo:hi], g[f"block{call}"], fc)
        np.testing.assert_allclose(hidden, g[f"hidden{call}"], rtol=1e-4, atol=1e-5)
        assert dc.length == hc.length == fc.length == hi
    assert not dc.overflowed


def test_draft_device_matches_twin_and_advances_the_device_length():
    """A bf16 target (device embedding and lm_head as bf16 bits), a GQA drafter: draft_device
    from a padded device feature buffer (rows past n poisoned) gives the twin's logits; n and
    the bonus are read on the device, the cache grows on the device. (The overflow path of the
    sizes kernel: tests/test_gqa_kernel.py.)"""
    path = os.path.join(DATA, "v3_released")
    host_t, dev_t = dd.load_target(path), dd.load_target(path, backend="cuda", precision="fp32")
    assert dev_t.lm_head.dtype == np.uint16
    kw = dict(num_hidden_layers=1, block_size=4, num_attention_heads=6, num_key_value_heads=2,
              head_dim=4, intermediate_size=24, seed=7)
    host, dev = random_drafter(host_t, **kw), random_drafter(dev_t, **kw)
    assert isinstance(dev, CudaDrafter)
    rng = np.random.default_rng(1)
    y, m = len(dev.target_layer_ids), dev.config.hidden_size
    feats = rng.standard_normal((9, y, m)).astype(np.float32)
    buf = np.full((8, y * m), np.nan, np.float32)                         # the decode loop's buffer
    d_buf, d_n, d_bonus = cuda.to_device(buf), cuda.to_device(np.zeros(1, np.int32)), \
        cuda.to_device(np.zeros(1, np.int32))
    hc, dc = host.new_cache(16), dev.new_cache(16)
    ws = dev.prepare(8, dc)                                               # buffers made up front
    for lo, hi, bonus in [(0, 6, 3), (6, 9, 50)]:
        d_buf[:hi - lo].copy_to_device(feats[lo:hi].reshape(hi - lo, -1))
        d_n.copy_to_device(np.array([hi - lo], np.int32))
        d_bonus.copy_to_device(np.array([bonus], np.int32))
        logits = dev.draft_device(d_buf, d_n, d_bonus, dc)
        assert logits is ws.logits and logits.shape == (3, 96)             # nothing allocated
        got = logits.copy_to_host()
        assert_rel(got, host.draft(feats[lo:hi], bonus, hc), 1e-4, "draft_device vs twin")
        assert dc.length == hi and not dc.overflowed


def test_forward_any_block_matches_twin_and_truncate(targets):
    host_t, dev_t = targets
    kw = dict(num_hidden_layers=1, block_size=5, num_attention_heads=4, num_key_value_heads=4,
              head_dim=6, intermediate_size=20, target_layer_ids=(1,), seed=3)
    host, dev = random_drafter(host_t, **kw), random_drafter(dev_t, **kw)
    rng = np.random.default_rng(2)
    feats = rng.standard_normal((5, 1, 32)).astype(np.float32)
    hc, dc = host.new_cache(8), dev.new_cache(8)
    ids = np.array([7, 95, 3])                                            # a block of 3, not B
    assert_rel(dev.forward(feats, ids, dc), host.forward(feats, ids, hc), 1e-4, "forward")
    dc.truncate(2)
    hc.truncate(2)
    assert dc.length == 2
    ids = np.array([1])
    assert_rel(dev.forward(feats[:0], ids, dc), host.forward(feats[:0], ids, hc), 1e-4,
               "forward after truncate, no new rows")
    with pytest.raises(ValueError, match="length must be <= 2"):
        dc.truncate(3)


def test_input_checks(targets):
    _, dev_t = targets
    d = random_drafter(dev_t)
    cache = d.new_cache(4)
    assert isinstance(cache, DeviceDrafterCache) and cache.capacity == 4
    with pytest.raises(ValueError, match="features"):
        d.forward(np.zeros((2, 1, 32), np.float32), np.array([1]), cache)
    with pytest.raises(ValueError, match="block token id out of range"):
        d.forward(np.zeros((2, 2, 32), np.float32), np.array([96]), cache)
    with pytest.raises(ValueError, match="drafter cache overflow"):
        d.forward(np.zeros((5, 2, 32), np.float32), np.array([1]), cache)
    with pytest.raises(ValueError, match="bonus"):
        d.draft(np.zeros((1, 2, 32), np.float32), -1, cache)
    with pytest.raises(ValueError, match="cache must be a DeviceDrafterCache"):
        d.draft(np.zeros((1, 2, 32), np.float32), 1, random_drafter(targets[0]).new_cache(4))
    n = cuda.to_device(np.ones(1, np.int32))
    with pytest.raises(ValueError, match="features"):
        d.draft_device(cuda.to_device(np.zeros((2, 32), np.float32)), n, n, cache)
    with pytest.raises(ValueError, match="device arrays"):
        d.draft_device(np.zeros((2, 64), np.float32), n, n, cache)
    with pytest.raises(ValueError, match="n must have dtype int32"):
        d.draft_device(cuda.to_device(np.zeros((2, 64), np.float32)),
                       cuda.to_device(np.ones(1, np.int64)), n, cache)
    with pytest.raises(ValueError, match="cuda-backend target"):
        CudaDrafter(d.config, {}, targets[0])
    assert cache.length == 0


def test_draft_meta_from_device_sizes():
    """The drafter's glue kernel, the per-draft sizes: block ids, live counts and the cache
    length, all from device values; too many rows append nothing and raise the overflow flag."""
    status = cuda.to_device(np.array([5, 0], np.int32))
    n, bonus = cuda.to_device(np.array([3], np.int32)), cuda.to_device(np.array([42], np.int32))
    ids, meta = (cuda.to_device(np.full(k, -7, np.int32)) for k in (4, 6))

    def draft_meta(status, n, bonus, capacity, n_cap, mask_id, write_block=True, depths=3):
        cuda_drafter._draft_meta_kernel[1, cuda_drafter.META_THREADS](
            status, n, bonus, capacity, n_cap, mask_id, write_block, depths, ids, meta)
    draft_meta(status, n, bonus, 12, 6, 95)        # capacity 12, n_cap 6
    np.testing.assert_array_equal(status.copy_to_host(), [8, 0])
    np.testing.assert_array_equal(meta.copy_to_host(), [5, 3, 8, 4, 3, 7])   # (s0, n, s0+n, B, D, B+n)
    np.testing.assert_array_equal(ids.copy_to_host(), [42, 95, 95, 95])
    draft_meta(status, n, bonus, 12, 6, 95, write_block=False, depths=2)
    np.testing.assert_array_equal(status.copy_to_host(), [11, 0])
    np.testing.assert_array_equal(meta.copy_to_host(), [8, 3, 11, 4, 2, 7])   # lm_head's rows: D = 2
    for bad_n, cap in ((2, 12), (7, 40), (-1, 40)):                      # past capacity, past n_cap
        ids.copy_to_device(np.arange(4, dtype=np.int32))
        n.copy_to_device(np.array([bad_n], np.int32))
        draft_meta(status, n, bonus, cap, 6, 95, write_block=False)
        np.testing.assert_array_equal(status.copy_to_host(), [11, 1])
        np.testing.assert_array_equal(meta.copy_to_host(), [11, 0, 11, 4, 3, 4])   # n taken as 0
        np.testing.assert_array_equal(ids.copy_to_host(), np.arange(4))  # ids left as written
        status.copy_to_device(np.array([11, 0], np.int32))


def test_a_batch_of_drafts_in_one_forward_gives_each_slot_its_own_drafts_bits():
    """``draft_batch_device``: three slots of a ``DeviceDrafterPool``, two rounds of drafts with
    packed context rows (one slot with none in the second round, as a finished sequence): each
    slot's logits and cache length are bit for bit those of ``draft_device`` on its own cache;
    a slot asking for more rows than its capacity appends nothing and is flagged, and so is a
    slot whose packed rows lie past the features (no launch reads or writes past them)."""
    path = os.path.join(DATA, "v3_released")
    dev_t = dd.load_target(path, backend="cuda", precision="fp32")
    dev = random_drafter(dev_t, num_hidden_layers=1, block_size=4, num_attention_heads=6, num_key_value_heads=2,
                         head_dim=4, intermediate_size=24, seed=7)
    rng = np.random.default_rng(2)
    y, m, L = len(dev.target_layer_ids), dev.config.hidden_size, dev.block_size - 1
    S, cap = 3, 12
    pool = dev.new_pool(S, cap)
    alone = [dev.new_cache(cap) for _ in range(S)]
    for counts, bonus in [((3, 5, 2), (4, 9, 60)), ((1, 0, 4), (7, 9, 2))]:
        feats = [rng.standard_normal((c, y * m)).astype(np.float32) for c in counts]
        packed = np.concatenate(feats + [np.full((2, y * m), np.nan, np.float32)])   # rows past: poison
        logits = dev.draft_batch_device(cuda.to_device(packed), cuda.to_device(np.array(counts, np.int32)),
                                        cuda.to_device(np.array(bonus, np.int32)), pool).copy_to_host()
        assert logits.shape == (S * L, 96)
        for z in range(S):
            buf = cuda.to_device(np.concatenate([feats[z], np.zeros((1, y * m), np.float32)]))
            one = dev.draft_device(buf, cuda.to_device(np.array([counts[z]], np.int32)),
                                   cuda.to_device(np.array([bonus[z]], np.int32)), alone[z]).copy_to_host()
            np.testing.assert_array_equal(logits[z * L:(z + 1) * L].view(np.uint32), one.view(np.uint32))
        np.testing.assert_array_equal(pool.lengths, [c.length for c in alone])
    assert not pool.overflowed.any()
    too_many = np.array([0, 0, cap], np.int32)                 # slot 2 holds 6 rows: 12 more do not fit
    dev.draft_batch_device(cuda.to_device(np.zeros((cap, y * m), np.float32)), cuda.to_device(too_many),
                           cuda.to_device(np.zeros(S, np.int32)), pool)
    assert pool.overflowed.tolist() == [False, False, True] and pool.lengths[2] == 6
    # packed rows past the features view (a narrow view, as the decode loops' rounds take): slot
    # 0's 2 rows fit in 4, slot 1's 3 after them do not, nor slot 2's after those
    pool = dev.new_pool(S, cap)
    view = cuda.to_device(np.zeros((4, y * m), np.float32))
    dev.draft_batch_device(view, cuda.to_device(np.array([2, 3, 1], np.int32)), cuda.to_device(np.zeros(S, np.int32)),
                           pool)
    assert pool.overflowed.tolist() == [False, True, True] and pool.lengths.tolist() == [2, 0, 0]


def test_a_draft_of_fewer_depths_gives_the_first_rows_of_the_whole_draft():
    """``depths=D`` (the decode loops' min(L, budget)): lm_head over the first D positions only,
    bit for bit the first D rows of the whole draft, for one draft and for a batch of drafts
    (slot z's D rows at [z D, (z + 1) D)); a depth outside [1, L] is refused by name."""
    path = os.path.join(DATA, "v3_released")
    dev_t = dd.load_target(path, backend="cuda", precision="fp32")
    dev = random_drafter(dev_t, num_hidden_layers=1, block_size=4, num_attention_heads=6, num_key_value_heads=2,
                         head_dim=4, intermediate_size=24, seed=7)
    assert dev.partial_depths
    rng = np.random.default_rng(4)
    y, m, L, S = len(dev.target_layer_ids), dev.config.hidden_size, dev.block_size - 1, 2
    bits = lambda a: a.copy_to_host().view(np.uint32)                # noqa: E731
    i32 = lambda *v: cuda.to_device(np.array(v, np.int32))           # noqa: E731
    feats = cuda.to_device(rng.standard_normal((3, y * m)).astype(np.float32))
    whole = dev.draft_device(feats, i32(3), i32(11), dev.new_cache(8)).copy_to_host()   # (the workspace's buffer)
    part = dev.draft_device(feats, i32(3), i32(11), dev.new_cache(8), depths=2)
    assert part.shape == (2, 96)
    np.testing.assert_array_equal(bits(part), whole[:2].view(np.uint32))
    whole = dev.draft_batch_device(feats, i32(2, 1), i32(5, 60), dev.new_pool(S, 8)).copy_to_host()
    part = dev.draft_batch_device(feats, i32(2, 1), i32(5, 60), dev.new_pool(S, 8), depths=1)
    assert part.shape == (S, 96)
    np.testing.assert_array_equal(bits(part), whole[::L].view(np.uint32))
    for bad in (0, L + 1, 1.5):
        with pytest.raises(ValueError, match="depths"):
            dev.draft_device(feats, i32(3), i32(11), dev.new_cache(8), depths=bad)
        with pytest.raises(ValueError, match="depths"):
            dev.draft_batch_device(feats, i32(2, 1), i32(5, 60), dev.new_pool(S, 8), depths=bad)


def test_the_drafters_device_prefill_then_narrow_drafts_give_one_drafts_bits():
    """``prefill_device`` (a decode loop's prefill: the cache emptied, the prompt's context rows
    appended, n set to 0), then drafts over a narrow feature view, give bit for bit the logits
    and cache lengths of drafts that take the prompt's rows themselves, from a cache that held
    rows before the prefill (it is emptied); the batched ``prefill_batch_device`` likewise
    against ``draft_batch_device``. A second prefill of the same inputs (a captured prefill's
    warm-up, then its replay) leaves the same state."""
    path = os.path.join(DATA, "v3_released")
    dev_t = dd.load_target(path, backend="cuda", precision="fp32")
    dev = random_drafter(dev_t, num_hidden_layers=1, block_size=4, num_attention_heads=6, num_key_value_heads=2,
                         head_dim=4, intermediate_size=24, seed=7)
    rng = np.random.default_rng(3)
    y, m, B = len(dev.target_layer_ids), dev.config.hidden_size, dev.block_size
    as_bits = lambda a: a.copy_to_host().view(np.uint32)             # noqa: E731
    dev_i32 = lambda *v: cuda.to_device(np.array(v, np.int32))       # noqa: E731
    prompt = rng.standard_normal((7, y * m)).astype(np.float32)
    rounds = [(rng.standard_normal((c, y * m)).astype(np.float32), bonus) for c, bonus in ((3, 5), (4, 71))]
    # one sequence: a 16-row feature buffer, the prompt's 7 rows
    feats = cuda.to_device(np.concatenate([prompt, np.full((9, y * m), np.nan, np.float32)]))
    wide, narrow = dev.new_cache(32), dev.new_cache(32)
    dev.draft_device(cuda.to_device(prompt[:5]), dev_i32(5), dev_i32(1), narrow)    # rows to be emptied
    n = dev_i32(7)
    for _ in range(2):
        n.copy_to_device(np.array([7], np.int32))
        dev.prefill_device(feats, n, narrow)
        assert int(n.copy_to_host()[0]) == 0 and narrow.length == 7
    want = as_bits(dev.draft_device(feats, dev_i32(7), dev_i32(9), wide))
    np.testing.assert_array_equal(as_bits(dev.draft_device(feats[:B], n, dev_i32(9), narrow)), want)
    for rows, bonus in rounds:
        feats[:rows.shape[0]].copy_to_device(rows)
        want = as_bits(dev.draft_device(feats, dev_i32(rows.shape[0]), dev_i32(bonus), wide))
        got = as_bits(dev.draft_device(feats[:B], dev_i32(rows.shape[0]), dev_i32(bonus), narrow))
        np.testing.assert_array_equal(got, want)
    assert narrow.length == wide.length == 14
    # two slots, packed: prompts of 7 and 2 rows
    S = 2
    packed = cuda.to_device(np.concatenate([prompt, prompt[:2], np.full((7, y * m), np.nan, np.float32)]))
    wide, narrow = dev.new_pool(S, 32), dev.new_pool(S, 32)
    n = dev_i32(7, 2)
    for _ in range(2):
        n.copy_to_device(np.array([7, 2], np.int32))
        dev.prefill_batch_device(packed, n, dev_i32(0, 0), narrow)
        assert n.copy_to_host().tolist() == [0, 0] and narrow.lengths.tolist() == [7, 2]
    want = as_bits(dev.draft_batch_device(packed, dev_i32(7, 2), dev_i32(9, 4), wide))
    np.testing.assert_array_equal(as_bits(dev.draft_batch_device(packed[:S * B], n, dev_i32(9, 4), narrow)), want)
    rows = np.concatenate([r for r, _ in rounds])                    # slot 0 takes 3 rows, slot 1 four
    packed[:7].copy_to_device(rows)
    want = as_bits(dev.draft_batch_device(packed, dev_i32(3, 4), dev_i32(5, 71), wide))
    got = as_bits(dev.draft_batch_device(packed[:S * B], dev_i32(3, 4), dev_i32(5, 71), narrow))
    np.testing.assert_array_equal(got, want)
    assert narrow.lengths.tolist() == wide.lengths.tolist() == [10, 6]
