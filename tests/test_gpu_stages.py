"""The DDTree stage kernels at full size on a real GPU (skipped elsewhere)."""

import numpy as np
import pytest

from ddtree_numba import kernels as kn
from ddtree_numba import reference as ref

pytestmark = [pytest.mark.gpu, pytest.mark.kernels]


@pytest.mark.parametrize("V,budget", [(32000, 1024), (163840, 512), (5000, 1000)])
def test_full_size_topk_and_build_match_twins(rng, V, budget):
    L = 15
    x = (rng.standard_normal((L, V)) * 2).astype(np.float32)
    x[:, : V // 4] = np.round(x[:, : V // 4] * 2)  # a quarter of the vocabulary in exact ties
    lp, ids = kn.topk_logprobs(x, budget)
    lp_r, ids_r = ref.topk_logprobs(x, budget)
    np.testing.assert_array_equal(ids, ids_r)
    np.testing.assert_array_equal(lp, lp_r)
    assert kn.build_tree(lp, ids, budget) == ref.build_tree(lp_r, ids_r, budget)


@pytest.mark.parametrize("V,budget,tie_share", [(163840, 1024, 4), (32000, 1024, 1), (5000, 777, 2)])
def test_full_size_level_build_matches_the_heap_twin(rng, V, budget, tie_share):
    """The level build at its default 1024 threads (the shuffle sorts and scans, warp-aggregated
    histograms) with exact ties in a 1/tie_share part of the vocabulary."""
    L = 15
    x = (rng.standard_normal((L, V)) * 2).astype(np.float32)
    x[:, : V // tie_share] = np.round(x[:, : V // tie_share] * 2)
    lp, ids = ref.topk_logprobs(x, budget)
    assert kn.build_tree_levels(lp, ids, budget) == ref.build_tree(lp, ids, budget)


def test_level_build_at_full_threads_on_small_random_drafts(rng):
    """Trees smaller than a warp and than the block: the register sort's padding lanes."""
    for case in range(120):
        L, V, budget = int(rng.integers(1, 6)), int(rng.integers(1, 40)), int(rng.integers(0, 300))
        if case % 3 == 0:
            x = rng.integers(-2, 2, (L, V)).astype(np.float32)
        elif case % 3 == 1:
            x = (np.sign(rng.standard_normal((L, V))) * 10.0 ** rng.integers(-30, 12, (L, V))).astype(np.float32)
        else:
            x = (rng.standard_normal((L, V)) * 3).astype(np.float32)
        lp, ids = ref.topk_logprobs(x, min(budget, V) or 1)
        assert kn.build_tree_levels(lp, ids, budget) == ref.build_tree(lp, ids, budget), (case, L, V, budget)


def test_poisoned_outputs_are_fully_overwritten(rng):
    from numba import cuda
    x = (rng.standard_normal((7, 3000)) * 3).astype(np.float32)
    lp_d = cuda.to_device(np.full((7, 200), np.nan, np.float32))
    ids_d = cuda.to_device(np.full((7, 200), -7, np.int32))
    kn.topk_logprobs(x, 200, out=(lp_d, ids_d))
    lp_r, ids_r = ref.topk_logprobs(x, 200)
    np.testing.assert_array_equal(ids_d.copy_to_host(), ids_r)
    np.testing.assert_array_equal(lp_d.copy_to_host(), lp_r)


def test_naive_in_place_compaction_is_observed_to_race():
    """Not an assertion of failure (a race need not show), but the safe kernels must be exact."""
    from numba import cuda
    from ddtree_numba.kernels.compact import _compact_rows_naive_kernel
    n, W = 1024, 64
    keep = np.concatenate([[0], np.arange(2, 2 * n, 2)[: n - 1]]).astype(np.int32)  # keep[i] = 2i
    rows = np.arange(2 * n + 1, dtype=np.float32)[:, None].repeat(W, 1)
    want = rows.copy()
    ref.compact_rows(want, 0, keep)
    d_rows = cuda.to_device(rows)
    _compact_rows_naive_kernel[(n // 4, 1), (4, 64)](d_rows, cuda.to_device(np.array([0, n], np.int32)),
                                                    cuda.to_device(keep))
    naive_wrong = int((d_rows.copy_to_host() != want).any(axis=1).sum())
    print(f"naive in-place gather: {naive_wrong} of {n} rows wrong")
    for method in ("columns", "scratch"):
        got = rows.copy()
        kn.compact_rows(got, 0, keep, method=method)
        np.testing.assert_array_equal(got, want)
