"""topk_logprobs: the twin against an independent check, the kernel against the twin."""

import math

import numpy as np
import pytest
from numba import cuda, float64
from scipy.special import log_softmax

from conftest import THREADS
from ddtree_numba import kernels as kn
from ddtree_numba import reference as ref


def _logits(rng, L, V, kind):
    if kind == "normal":
        # peaked rows with a few runner-ups, so the top of the distribution is not flat
        x = rng.standard_normal((L, V)) * 2.0
        x[np.arange(L), rng.integers(0, V, L)] += 8.0
    elif kind == "ties":  # integer logits: many exact ties, broken by the lower id
        x = rng.integers(-3, 3, (L, V))
    elif kind == "near_ties":  # neighbours one float32 ulp apart
        base = np.float32(rng.standard_normal())
        x = np.nextafter(np.full((L, V), base, np.float32), np.float32(np.inf))
        x[:, ::2] = base
        x[:, ::5] = np.nextafter(base, np.float32(-np.inf))
    elif kind == "masked":  # -inf entries, signed zeros
        x = rng.standard_normal((L, V))
        x[rng.random((L, V)) < 0.3] = -np.inf
        x[:, 0] = 0.0
        x[:, 1] = -0.0
    return np.asarray(x, np.float32)


def test_twin_matches_scipy_and_a_plain_sort(rng):
    x = _logits(rng, 4, 300, "ties")
    lp, ids = ref.topk_logprobs(x, 17)
    for d in range(4):
        want = sorted(range(300), key=lambda v: (-x[d, v], v))[:17]
        assert ids[d].tolist() == want
    np.testing.assert_allclose(lp, np.take_along_axis(log_softmax(x.astype(np.float64), axis=1), ids, 1),
                               rtol=0, atol=1e-6)


@pytest.mark.kernels
@pytest.mark.parametrize("kind", ["normal", "ties", "near_ties", "masked"])
def test_kernel_matches_twin_bit_for_bit(rng, kind):
    for _ in range(2):
        L = int(rng.integers(1, 4))
        V = int(rng.integers(5, 200))  # ragged: rarely a multiple of the block
        k = int(rng.integers(1, min(V, 40) + 1))
        x = _logits(rng, L, V, kind)
        lp, ids = kn.topk_logprobs(x, k, threads=THREADS)
        lp_ref, ids_ref = ref.topk_logprobs(x, k)
        np.testing.assert_array_equal(ids, ids_ref)
        np.testing.assert_array_equal(lp.view(np.uint32), lp_ref.view(np.uint32))


@pytest.mark.kernels
@pytest.mark.parametrize("kind", ["normal", "ties", "masked"])
def test_log_sum_exp_over_several_warps_matches_the_twin(rng, kind):
    """The partial kernel's (max, rest) in a block of two warps: the lowest thread holding the max
    (many hold it in 'ties'; none has an entry past a -inf-only part in 'masked'), every other
    thread's term rescaled to it, the two warps' sums added in order. A lost warp's sum, or the
    holder's 1 counted, moves the log-probs."""
    x = _logits(rng, 2, 700, kind)
    x[1, 600:] = -np.inf                      # the last threads of row 1 see -inf only
    lp, ids = kn.topk_logprobs(x, 7, threads=64, slices=1)
    lp_ref, ids_ref = ref.topk_logprobs(x, 7)
    np.testing.assert_array_equal(ids, ids_ref)
    np.testing.assert_array_equal(lp.view(np.uint32), lp_ref.view(np.uint32))


@pytest.mark.kernels
@pytest.mark.parametrize("kind", ["normal", "ties", "masked"])
@pytest.mark.parametrize("V,k,slices", [(50, 7, 3),      # ragged slices, each holding more than k
                                        (40, 30, 4),     # slices smaller than k: the merge needs them all
                                        (9, 4, 16),      # more slices than entries: empty slices
                                        (100, 100, 5),   # k = V
                                        (200, 3, 40)])   # more slices than the simulator's merge threads
@pytest.mark.parametrize("fuse", [True, False])
def test_split_rows_match_the_twin_bit_for_bit(rng, kind, V, k, slices, fuse):
    """A row split over several blocks (each a top-K of its slice and a log-sum-exp pair, then one
    merge: by the row's last block, or by a merge kernel) gives the twin's ids and log-prob bits,
    however the slices fall."""
    x = _logits(rng, 3, V, kind)
    lp, ids = kn.topk_logprobs(x, k, threads=THREADS, slices=slices, fuse=fuse)
    lp_ref, ids_ref = ref.topk_logprobs(x, k)
    np.testing.assert_array_equal(ids, ids_ref)
    np.testing.assert_array_equal(lp.view(np.uint32), lp_ref.view(np.uint32))


@pytest.mark.kernels
@pytest.mark.parametrize("k", [3, THREADS + 1])
def test_filter_and_its_fallback_match_the_twin(rng, k):
    """The partial kernel's filter (tau from each thread's kept keys) when its candidates fit,
    and the radix select it falls back to when more than FILTER_CAP keys pass: every large logit
    sits in one thread's stride, so the other threads' kept keys set a low tau."""
    from ddtree_numba.kernels.topk import FILTER_CAP, _keep_per_thread
    assert _keep_per_thread(k, THREADS) > 0
    V = (FILTER_CAP // 2 + 8) * THREADS
    x = _logits(rng, 1, V, "normal")
    lp, ids = kn.topk_logprobs(x, k, threads=THREADS, slices=1)                 # a spread row
    np.testing.assert_array_equal(ids, ref.topk_logprobs(x, k)[1])
    x[0, ::THREADS // 2] += 50.0                 # two threads' strides hold > FILTER_CAP large keys
    lp, ids = kn.topk_logprobs(x, k, threads=THREADS, slices=1)
    lp_ref, ids_ref = ref.topk_logprobs(x, k)
    np.testing.assert_array_equal(ids, ids_ref)
    np.testing.assert_array_equal(lp.view(np.uint32), lp_ref.view(np.uint32))


@pytest.mark.kernels
@pytest.mark.parametrize("keep", [0, 3, 8])
def test_any_number_of_kept_keys_gives_the_twins_top_k(rng, keep):
    """The filter's bound from 0 (off: the radix select over the slice), 3 or 8 kept keys a
    thread: candidates both fewer and more than the block's threads."""
    x = _logits(rng, 2, 700, "normal")
    for k in (2, 30):
        lp, ids = kn.topk_logprobs(x, k, threads=THREADS, slices=2, keep=keep)
        lp_ref, ids_ref = ref.topk_logprobs(x, k)
        np.testing.assert_array_equal(ids, ids_ref)
        np.testing.assert_array_equal(lp.view(np.uint32), lp_ref.view(np.uint32))
    with pytest.raises(ValueError, match="keep must be <= 8"):
        kn.topk_logprobs(x, 2, keep=9)


@pytest.mark.kernels
def test_split_scratch_is_reused_and_checked(rng):
    from ddtree_numba.kernels.topk import TopKScratch
    scratch = TopKScratch.allocate(2, 60, 5, slices=3)
    for _ in range(2):
        x = _logits(rng, 2, 60, "ties")
        lp, ids = kn.topk_logprobs(x, 5, threads=THREADS, slices=3, scratch=scratch)
        np.testing.assert_array_equal(ids, ref.topk_logprobs(x, 5)[1])
    with pytest.raises(ValueError, match="scratch is for"):
        kn.topk_logprobs(x, 6, threads=THREADS, slices=3, scratch=scratch)


@pytest.mark.kernels
def test_kernel_k_equals_v_and_device_arrays(rng):
    x = _logits(rng, 2, 33, "ties")
    d_lp, d_ids = kn.topk_logprobs(cuda.to_device(x), 33, threads=THREADS)
    lp_ref, ids_ref = ref.topk_logprobs(x, 33)
    np.testing.assert_array_equal(d_ids.copy_to_host(), ids_ref)
    np.testing.assert_array_equal(d_lp.copy_to_host(), lp_ref)


@pytest.mark.kernels
@pytest.mark.parametrize("kind", ["normal", "ties", "near_ties", "masked"])
def test_rows_kernel_matches_twin_bit_for_bit(rng, kind):
    """The warp-a-row kernel (``method="rows"``): rows shorter than a warp, not a multiple of it
    and the demo drafter's 264, k from 1 to past the default rule's 32 and k = V; device in,
    device out."""
    for L, V, k in ((3, 264, 16), (2, 5, 5), (2, 40, 1), (1, 97, 40)):
        x = _logits(rng, L, V, kind)
        lp, ids = kn.topk_logprobs(x, k, method="rows")
        lp_ref, ids_ref = ref.topk_logprobs(x, k)
        np.testing.assert_array_equal(ids, ids_ref)
        np.testing.assert_array_equal(lp.view(np.uint32), lp_ref.view(np.uint32))
    d_lp, d_ids = kn.topk_logprobs(cuda.to_device(x), k, method="rows")
    np.testing.assert_array_equal(d_ids.copy_to_host(), ids_ref)
    np.testing.assert_array_equal(d_lp.copy_to_host().view(np.uint32), lp_ref.view(np.uint32))


@pytest.mark.kernels
@pytest.mark.parametrize("method, slices", [("rows", None), ("split", 1), ("split", 3)])
def test_confident_rows_keep_the_twins_top_log_prob(method, slices):
    """Rows whose top logit leads by 12-22, so its log-prob is ~-1e-7: with lse = max + log(s), s =
    1 + rest, s's rounding at 1 (different in each summation order) moved that log-prob by a
    float32 ulp or two in ~1 % of such rows (of these 300: rows 139 and 268 for the warp-a-row
    kernel, 124 for three slices of the simulator's 8-thread blocks; the test keeps those and 21
    more, the simulator being slow); lse = max +
    log1p(rest), rest leaving out one max entry's 1, gives every row's bits, the max in one slice
    or in two (split across slices: merged rests)."""
    rng = np.random.default_rng(0)
    L, V = 300, 64
    m = rng.uniform(10, 100, (L, 1))
    gap = rng.uniform(12, 22, (L, 1))
    x = (m - gap - rng.uniform(0, 3, (L, V))).astype(np.float32)
    x[:, 5] = m[:, 0].astype(np.float32)
    x[::7, 40] = x[::7, 5]                                    # two entries at the max
    x[::5, 50] = x[::5, 5]                                    # (and in another slice)
    x = np.ascontiguousarray(x[np.r_[124, 139, 268, :21]])    # those that differed, and more
    knobs = {} if method == "rows" else {"threads": THREADS, "slices": slices}
    lp, ids = kn.topk_logprobs(x, 2, method=method, **knobs)
    lp_ref, ids_ref = ref.topk_logprobs(x, 2)
    np.testing.assert_array_equal(ids, ids_ref)
    np.testing.assert_array_equal(lp.view(np.uint32), lp_ref.view(np.uint32))


def test_the_rows_kernel_is_the_default_for_short_rows_only():
    """``method`` None takes the warp-a-row kernel where it was measured faster (V <= 320 and k <=
    32, or k = 1 up to ROWS_MAX_VOCAB) when no knob of the split kernels is given; "rows" past
    ROWS_MAX_VOCAB, another name, or a split-kernel knob with "rows", is refused."""
    tk = kn.topk
    assert tk._rows_path(264, 16) and tk._rows_path(320, 32) and tk._rows_path(tk.ROWS_MAX_VOCAB, 1)
    assert not tk._rows_path(321, 2) and not tk._rows_path(264, 33) and not tk._rows_path(tk.ROWS_MAX_VOCAB + 1, 1)
    x = np.zeros((2, tk.ROWS_MAX_VOCAB + 1), np.float32)
    with pytest.raises(ValueError, match="method 'rows' takes V <="):
        kn.topk_logprobs(x, 2, method="rows")
    with pytest.raises(ValueError, match="method must be 'rows' or 'split'"):
        kn.topk_logprobs(x[:, :8], 2, method="heap")
    with pytest.raises(ValueError, match="the split kernels' .method 'split'., not 'rows'"):
        kn.topk_logprobs(x[:, :8], 2, method="rows", slices=1)


@pytest.mark.parametrize("fn", [ref.topk_logprobs, kn.topk_logprobs])
def test_bad_input_is_refused(fn):
    x = np.zeros((2, 5), np.float32)
    with pytest.raises(ValueError, match="k must be <= 5"):
        fn(x, 6)
    with pytest.raises(ValueError, match="k must be >= 0"):
        fn(x, -1)
    with pytest.raises(ValueError, match="float32"):
        fn(x.astype(np.float64), 2)
    with pytest.raises(ValueError, match="2-D"):
        fn(x[0], 2)
    bad = x.copy()
    bad[1, 3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        fn(bad, 2)
    bad[1] = -np.inf
    bad[1, 3] = -np.inf
    with pytest.raises(ValueError, match="no finite entry"):
        fn(bad, 2)


@pytest.mark.kernels
@pytest.mark.parametrize("fuse", [True, False])
def test_merge_of_sorted_lists_in_either_order(rng, fuse):
    """The merge ranks each slice's sorted candidates against the other slices' lists: rows that
    rise (the last slice holds the best), fall (the first does) and step (ties across the slices'
    borders, broken by the lower id)."""
    V, k, slices = 64, 10, 8
    x = np.stack([np.arange(V), -np.arange(V), np.arange(V) // 16]).astype(np.float32)
    lp, ids = kn.topk_logprobs(x, k, threads=THREADS, slices=slices, fuse=fuse)
    lp_ref, ids_ref = ref.topk_logprobs(x, k)
    np.testing.assert_array_equal(ids, ids_ref)
    np.testing.assert_array_equal(lp.view(np.uint32), lp_ref.view(np.uint32))


def test_too_many_slices_for_the_merge_is_refused():
    from ddtree_numba.kernels.topk import FILTER_CAP, MERGE_SLOTS
    x = np.zeros((1, 5000), np.float32)
    with pytest.raises(ValueError, match=f"the merge holds at most {MERGE_SLOTS} keys"):
        kn.topk_logprobs(x, 1024, slices=8)
    with pytest.raises(ValueError, match=f"shared keys hold at most {FILTER_CAP}"):
        kn.topk_logprobs(x, 1024, slices=4, fuse=True)


def test_a_vocabulary_past_the_kernels_32_bit_indices_is_refused():
    from ddtree_numba.kernels.topk import MAX_VOCAB
    x = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), shape=(1, MAX_VOCAB + 1), strides=(0, 0))
    with pytest.raises(ValueError, match=f"more than the kernel's MAX_VOCAB = {MAX_VOCAB}"):
        kn.topk_logprobs(x, 1)


@pytest.mark.kernels
def test_the_fused_merges_arrival_counters_are_left_at_zero(rng):
    """The last block of a row resets the row's arrival counter, so a reused scratch (a replayed
    graph) merges each launch once, after all of its slices."""
    from ddtree_numba.kernels.topk import TopKScratch
    scratch = TopKScratch.allocate(3, 90, 6, slices=4)
    for kind in ("normal", "ties", "masked"):
        x = _logits(rng, 3, 90, kind)
        lp, ids = kn.topk_logprobs(x, 6, threads=THREADS, slices=4, scratch=scratch, fuse=True)
        lp_ref, ids_ref = ref.topk_logprobs(x, 6)
        np.testing.assert_array_equal(ids, ids_ref)
        np.testing.assert_array_equal(lp.view(np.uint32), lp_ref.view(np.uint32))
        np.testing.assert_array_equal(scratch.arrive.copy_to_host(), 0)


def test_the_partial_kernels_exp_is_within_an_ulp_of_a_long_double_one():
    """The first read's exp (kernels.topk._exp_nonpositive, not libdevice's) against numpy's
    80-bit exp: about an ulp (1.1 allowed: the table's rounding and the last one, plus a few
    hundredths from the polynomial), as libdevice's (1 ulp), so the log-sum-exp keeps its float64
    accuracy. Arguments spread over [-700, 0] and log-spread down to -1e-12; below -700, 0."""
    from ddtree_numba.kernels.topk import EXP_STEPS, EXP_TABLE, _exp_nonpositive

    @cuda.jit
    def exp_kernel(d, table_in, out):
        table = cuda.shared.array(EXP_STEPS, float64)
        for j in range(cuda.threadIdx.x, EXP_STEPS, cuda.blockDim.x):
            table[j] = table_in[j]
        cuda.syncthreads()
        for i in range(cuda.grid(1), d.shape[0], cuda.gridsize(1)):
            out[i] = _exp_nonpositive(d[i], table)

    rng = np.random.default_rng(5)
    n = 1500
    d = np.concatenate([-rng.uniform(0, 700, n), -np.exp(rng.uniform(math.log(1e-12), math.log(700), n)),
                        [0.0, -0.0, -5e-324, -1e-300, -math.log(2) / 32, -699.999, -700.5, -1e4, -np.inf]])
    out = np.full_like(d, np.nan)
    exp_kernel[1, 32](d, EXP_TABLE, out)
    exact = np.exp(d.astype(np.longdouble))
    exact[d < -700] = 0
    err = np.abs(out.astype(np.longdouble) - exact) / np.spacing(exact.astype(np.float64)).astype(np.longdouble)
    assert err.max() <= 1.1, f"exp off by {float(err.max()):.2f} ulp at d = {d[err.argmax()]!r}"
    nan = np.full(1, np.nan)
    exp_kernel[1, 32](np.full(1, np.nan), EXP_TABLE, nan)
    assert np.isnan(nan[0])


def _slice_of(V, slices, threads):
    """The slice holding each of a row's V entries: runs of min(SLICE_RUN, threads) entries dealt
    round the slices (``reference.topk.slice_of``)."""
    from ddtree_numba.kernels.topk import SLICE_RUN
    from ddtree_numba.reference.topk import slice_of
    return slice_of(np.arange(V), slices, min(SLICE_RUN, threads))


def _capped_merge(x, k, slices, cap, threads):
    """``reference.topk.capped_merge`` for a block of ``threads`` (runs of min(SLICE_RUN, threads))
    -> (ids as a list, fallback)."""
    from ddtree_numba.kernels.topk import SLICE_RUN
    from ddtree_numba.reference.topk import capped_merge
    ids, fallback = capped_merge(np.asarray(x, np.float32), k, slices, cap, min(SLICE_RUN, threads))
    return ids.tolist(), fallback


def test_the_fallback_odds_match_the_models_fallbacks_on_random_rows():
    """``fallback_odds`` (the union bound the split rule is chosen by) against how often the
    capped merge's model falls back on 2,000 random rows: 4 slices of 32-id runs, lists of 8, k 16."""
    from ddtree_numba.reference.topk import capped_merge, fallback_odds
    k, slices, cap, run, n = 16, 4, 8, 32, 2000
    rng = np.random.default_rng(3)
    fell = sum(capped_merge(rng.standard_normal(slices * run * 8).astype(np.float32), k, slices, cap, run)[1]
               for _ in range(n))
    odds = fallback_odds(k, slices, cap)
    assert 0.5 * odds <= fell / n <= odds + 3 * np.sqrt(odds / n), (fell / n, odds)


def test_the_capped_merge_model_refuses_bad_input():
    from ddtree_numba.reference.topk import capped_merge
    x = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match="cap must be <= 3"):
        capped_merge(x, 3, 2, 4, 1)
    with pytest.raises(ValueError, match="1-D"):
        capped_merge(x[None], 3, 2, 2, 1)
    with pytest.raises(ValueError, match="run must be >= 1"):
        capped_merge(x, 3, 2, 2, 0)


def test_the_capped_merges_rule_is_exact_against_brute_force(rng):
    """Whenever the merge keeps the union's top k (no fallback), that is the row's top k: random
    rows with many ties, every cap and slice count small enough to enumerate; and the rule does
    fall back sometimes (a slice holding more than cap of the top k), else the check would be
    vacuous."""
    fallbacks = kept = 0
    for _ in range(400):
        V = int(rng.integers(4, 40))
        k = int(rng.integers(1, V + 1))
        slices = int(rng.integers(1, 8))
        cap = int(rng.integers(1, k + 1))
        if slices * cap < k:
            continue
        x = rng.integers(-3, 3, V).astype(np.float32)
        if rng.random() < 0.5:
            x = rng.standard_normal(V).astype(np.float32)
        top, fallback = _capped_merge(x, k, slices, cap, int(rng.integers(1, 5)))
        if fallback:
            fallbacks += 1
        else:
            kept += 1
            assert top == ref.topk_logprobs(x[None], k)[1][0].tolist()
    assert fallbacks > 20 and kept > 20


@pytest.mark.kernels
@pytest.mark.parametrize("kind", ["normal", "ties", "masked"])
@pytest.mark.parametrize("fuse", [True, False])
def test_capped_lists_match_the_twin_with_and_without_the_fallback(rng, kind, fuse):
    """Slices that keep fewer than k keys (``cap``): rows whose top k is spread over the slices
    (the union holds it) and a row whose top k sits in one slice (the merge falls back to the whole
    row), each the twin's ids and log-prob bits; the model above says which rows fall back."""
    k, slices, cap = 24, 6, 16
    V = 5 * slices * THREADS + 10                        # five runs a slice and a ragged end
    x = _logits(rng, 3, V, kind)
    x[2, _slice_of(V, slices, THREADS) == 1] += 20.0     # row 2: its top k in slice 1
    ran = [_capped_merge(x[d], k, slices, cap, THREADS)[1] for d in range(3)]
    assert ran[2]
    if kind != "ties":                                   # (tied rows crowd into the lowest ids)
        assert not all(ran[:2]), "no spread row keeps the union's top k: the path without fallback is untested"
    lp, ids = kn.topk_logprobs(x, k, threads=THREADS, slices=slices, cap=cap, fuse=fuse)
    lp_ref, ids_ref = ref.topk_logprobs(x, k)
    np.testing.assert_array_equal(ids, ids_ref)
    np.testing.assert_array_equal(lp.view(np.uint32), lp_ref.view(np.uint32))


@pytest.mark.kernels
def test_the_default_split_caps_lists_and_matches_the_twin(rng):
    """``_split``'s own choice (no knob) at a vocabulary and k where it caps the lists: the
    twin's ids and bits, a spread row and a row whose top k crowds into its first ids."""
    from ddtree_numba.kernels.topk import _default_threads, _split
    V, k = 40960, 128
    G, cap = _split(V, k)
    T = _default_threads(k, cap)                         # the block the launcher picks: the runs
    assert cap < k
    x = _logits(rng, 2, V, "normal")
    x[1, _slice_of(V, G, T) == 0] += 30.0                # row 1: its top k in slice 0
    assert [_capped_merge(x[d], k, G, cap, T)[1] for d in range(2)] == [False, True]
    lp, ids = kn.topk_logprobs(x, k)
    lp_ref, ids_ref = ref.topk_logprobs(x, k)
    np.testing.assert_array_equal(ids, ids_ref)
    np.testing.assert_array_equal(lp.view(np.uint32), lp_ref.view(np.uint32))


@pytest.mark.kernels
def test_runs_narrower_than_the_block_deal_each_entry_to_one_slice(rng):
    """A block of 64 threads over runs of 32 (each warp its own runs of the slice): the twin's ids
    and bits, with capped lists and without, where a block's entries are not one run."""
    V, k, slices = 2 * 6 * 64 + 10, 24, 6
    x = _logits(rng, 2, V, "normal")
    for cap in (16, 24):
        lp, ids = kn.topk_logprobs(x, k, threads=64, slices=slices, cap=cap)
        lp_ref, ids_ref = ref.topk_logprobs(x, k)
        np.testing.assert_array_equal(ids, ids_ref)
        np.testing.assert_array_equal(lp.view(np.uint32), lp_ref.view(np.uint32))


def test_the_split_rule_caps_lists_only_at_large_k():
    from math import sqrt

    from ddtree_numba.kernels.topk import (CAP_SIGMAS, CAPPED_FROM, CAPPED_SLICES, FILTER_CAP, SMALL_K_SLICE,
                                           _slices, _split)
    from ddtree_numba.reference.topk import fallback_odds
    # below CAPPED_FROM: uncapped lists over up to CAPPED_SLICES slices of SMALL_K_SLICE entries or more
    assert _split(163840, CAPPED_FROM // 2) == (CAPPED_SLICES, CAPPED_FROM // 2)
    assert _split(32000, 16) == (min(CAPPED_SLICES, 32000 // SMALL_K_SLICE), 16)
    assert _split(SMALL_K_SLICE - 1, 1) == (1, 1)
    for k in (CAPPED_FROM, 128, 256, 1024):
        G, cap = _split(163840, k)
        share = k / G
        assert G == 8 and cap < k and G * cap <= FILTER_CAP
        assert cap // 2 < share + CAP_SIGMAS * sqrt(share) <= cap and cap & (cap - 1) == 0
        # the chance that a row whose top k falls on the slices at random makes the merge fall back
        # (some slice holding cap of the top k - 1) is small: the rule's reason (its docstring)
        assert fallback_odds(k, G, cap) < 1e-3
    assert _split(20000, 1024) == (_slices(20000, 1024), 1024)   # 1 slice of SLICE entries: uncapped
    assert _split(32000, 1024) == (_slices(32000, 1024), 1024)   # 3 slices: lists of 512 > CAP_MAX
    x = np.zeros((1, 50), np.float32)
    with pytest.raises(ValueError, match="lists hold fewer than k = 20 keys"):
        kn.topk_logprobs(x, 20, slices=4, cap=4)
    with pytest.raises(ValueError, match="cap must be <= 20"):
        kn.topk_logprobs(x, 20, slices=4, cap=21)


# -- the GPU branches (warp shuffles), in the simulator with emulated warps ------------------------

@pytest.mark.kernels
@pytest.mark.parametrize("kind", ["normal", "ties", "masked"])
def test_gpu_branches_match_the_twin_in_emulated_warps(rng, monkeypatch, kind):
    """The partial kernel's log-sum-exp by warp shuffles (each warp's max and its lowest holder by
    group maxima, the terms by an xor butterfly, then the warps in order) and the warp-a-row
    kernel's exchanges, which the simulator otherwise runs through shared memory: in emulated warps
    (tests/warp_emulation.py, the GPU's butterfly order), bit for bit the twin."""
    import importlib

    from warp_emulation import gpu_branch
    topk = importlib.import_module("ddtree_numba.kernels.topk")
    with gpu_branch(monkeypatch, topk, "_topk_partial_kernel", "_topk_rows_kernel"):
        x = _logits(rng, 2, 700, kind)
        x[1, 600:] = -np.inf
        lp_ref, ids_ref = ref.topk_logprobs(x, 7)
        for slices in (1, 3):
            lp, ids = kn.topk_logprobs(x, 7, threads=64, slices=slices)
            np.testing.assert_array_equal(ids, ids_ref)
            np.testing.assert_array_equal(lp.view(np.uint32), lp_ref.view(np.uint32))
        x = _logits(rng, 2, 264, kind)
        lp_ref, ids_ref = ref.topk_logprobs(x, 16)
        lp, ids = kn.topk_logprobs(x, 16, method="rows")
        np.testing.assert_array_equal(ids, ids_ref)
        np.testing.assert_array_equal(lp.view(np.uint32), lp_ref.view(np.uint32))


def test_kept_keys_in_registers_are_a_threads_largest_keys(rng):
    """The partial kernel's kept-key tuple (``_kept_put`` / ``_kept_low`` / ``_kept_at``, as the
    first read uses them: replace the smallest kept key by a larger one) holds the M largest keys of
    any stream, the entries past M stay 0, and ``_kept_at`` reads every slot."""
    from ddtree_numba.kernels import topk as tk
    for M in range(1, tk.MAX_KEEP + 1):
        for n in (0, M - 1, M, 3 * M + 5):
            keys = rng.choice(np.arange(1, 10**6, dtype=np.uint64), size=n, replace=False)
            z = np.uint64(0)
            kept, low, j = (z,) * 8, z, 0
            for key in keys:
                if key > low:
                    kept = tk._kept_put(kept, M, j, key)
                    low, j = tk._kept_low(kept, M)
            want = sorted(keys.tolist(), reverse=True)[:M]
            assert sorted((int(k) for k in kept[:M] if k != 0), reverse=True) == want
            assert all(k == 0 for k in kept[M:])
            assert [tk._kept_at(kept, i) for i in range(8)] == list(kept)
            assert low == min(kept[:M]) and kept[j] == low
