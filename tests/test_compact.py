"""compact_rows: the naive in-place gather's hazard, the two safe kernels against the twin."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddtree_numba import kernels as kn
from ddtree_numba import reference as ref


def random_keep(rng, n_tree):
    """An accepted path: 0 then a strictly increasing run of node ids <= n_tree."""
    picks = rng.choice(np.arange(1, n_tree + 1), size=int(rng.integers(0, n_tree + 1)), replace=False)
    return np.concatenate([[0], np.sort(picks)]).astype(np.int32)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), start=st.integers(0, 20), n_tree=st.integers(0, 30))
def test_twin_moves_kept_rows_and_leaves_the_rest(seed, start, n_tree):
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((start + n_tree + 1 + int(rng.integers(0, 5)), 3)).astype(np.float32)
    keep = random_keep(rng, n_tree)
    assert (np.diff(keep) > 0).all() and (keep >= np.arange(len(keep))).all()
    before = rows.copy()
    ref.compact_rows(rows, start, keep)
    np.testing.assert_array_equal(rows[:start], before[:start])           # prefix untouched
    np.testing.assert_array_equal(rows[start:start + len(keep)], before[start + keep])
    np.testing.assert_array_equal(rows[start + len(keep):], before[start + len(keep):])


def test_naive_in_place_gather_depends_on_thread_order():
    rows = np.arange(8, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32)
    keep = np.array([0, 2, 3], np.int32)  # thread 1 reads row 2, which thread 2 overwrites
    assert ref.naive_row_hazards(keep) == [(1, 2)]  # row 3 has no writer: n = 3
    want = rows.copy()
    ref.compact_rows(want, 0, keep)
    in_order = ref.naive_gather_in_order(rows, 0, keep, order=[0, 1, 2])
    reversed_order = ref.naive_gather_in_order(rows, 0, keep, order=[2, 1, 0])
    np.testing.assert_array_equal(in_order, want)                 # one lucky schedule
    assert not np.array_equal(reversed_order, want)               # another GPU schedule
    assert reversed_order[1, 0] == 3.0 and want[1, 0] == 2.0      # row 2 was read after it was overwritten


@pytest.mark.kernels
@pytest.mark.parametrize("method", ["columns", "scratch"])
@pytest.mark.parametrize("dtype", [np.float32, np.uint16])
def test_kernels_match_twin(rng, method, dtype):
    for _ in range(3):
        n_tree = int(rng.integers(0, 25))
        start = int(rng.integers(0, 10))
        rows = (rng.standard_normal((start + n_tree + 3, 70)) * 100).astype(dtype)  # W off the block size
        keep = random_keep(rng, n_tree)
        got, want = rows.copy(), rows.copy()
        kn.compact_rows(got, start, keep, method=method)
        ref.compact_rows(want, start, keep)
        np.testing.assert_array_equal(got, want)


@pytest.mark.kernels
def test_kernel_on_device_rows_with_scratch_buffer(rng):
    from numba import cuda
    rows = rng.standard_normal((20, 5)).astype(np.float32)
    keep = np.array([0, 1, 4, 9], np.int32)
    d_rows = cuda.to_device(rows)
    kn.compact_rows(d_rows, 6, keep, method="scratch", scratch=cuda.device_array((16, 5), np.float32))
    want = rows.copy()
    ref.compact_rows(want, 6, keep)
    np.testing.assert_array_equal(d_rows.copy_to_host(), want)


@pytest.mark.kernels
@pytest.mark.parametrize("method", ["columns", "scratch"])
def test_a_strided_host_view_compacts_in_place_as_the_twin(rng, method):
    """rows[:, ::2], rows[::2] and a Fortran-order array: the launcher's copy back goes through a
    contiguous copy (numba's copy_to_host refused the view with 'incompatible strides')."""
    base = rng.standard_normal((12, 6)).astype(np.float32)
    keep = np.array([0, 2, 3], np.int32)
    for view in (lambda a: a[:, ::2], lambda a: a[::2], np.asfortranarray):
        got, want = base.copy(), base.copy()
        got_v, want_v = view(got), view(want)
        ref.compact_rows(want_v, 1, keep)
        kn.compact_rows(got_v, 1, keep, method=method)
        np.testing.assert_array_equal(got_v, want_v)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fn", [ref.compact_rows, kn.compact_rows])
def test_bad_keep_is_refused(fn):
    rows = np.zeros((10, 2), np.float32)
    with pytest.raises(ValueError, match=r"keep\[0\] must be 0"):
        fn(rows, 0, np.array([1, 2], np.int32))
    with pytest.raises(ValueError, match="strictly increasing"):
        fn(rows, 0, np.array([0, 3, 3], np.int32))
    with pytest.raises(ValueError, match="points past the array"):
        fn(rows, 5, np.array([0, 5], np.int32))
    with pytest.raises(ValueError, match="start must be <= 10"):
        fn(rows, 11, np.array([0], np.int32))
    with pytest.raises(ValueError, match="int32"):
        fn(rows, 0, np.array([0, 1], np.int64))


@pytest.mark.kernels
def test_a_stack_of_layers_compacts_in_one_launch_as_each_layer_alone(rng):
    """The device tier's [layers, S, W] form (a cache's every layer, one launch): each layer as
    the twin compacts it; rows past start + n and the prefix untouched."""
    from numba import cuda
    rows = rng.standard_normal((3, 30, 9)).astype(np.float32)
    keep = np.array([0, 2, 3, 7, 11], np.int32)
    d_rows = cuda.to_device(rows)
    kn.enqueue_compact_rows(d_rows, cuda.to_device(np.array([5, len(keep)], np.int32)), cuda.to_device(keep),
                            n_max=len(keep))
    want = rows.copy()
    for layer in want:
        ref.compact_rows(layer, 5, keep)
    np.testing.assert_array_equal(d_rows.copy_to_host(), want)
    with pytest.raises(ValueError, match="scratch scheme"):
        kn.enqueue_compact_rows(d_rows, None, None, n_max=1, method="scratch")


@pytest.mark.kernels
def test_a_second_array_compacts_in_the_same_launch(rng):
    """``second`` (a cache's rope keys beside its latents): both arrays as the twin compacts each,
    with a different width and layer count, the first one wider than a block (its column blocks,
    then the second's)."""
    from numba import cuda
    a = rng.standard_normal((3, 30, 130)).astype(np.float32)
    b = rng.standard_normal((2, 30, 7)).astype(np.float32)
    keep = np.array([0, 2, 3, 7, 11], np.int32)
    start_n = np.array([5, len(keep)], np.int32)
    d_a, d_b = cuda.to_device(a), cuda.to_device(b)
    kn.enqueue_compact_rows(d_a, cuda.to_device(start_n), cuda.to_device(keep), n_max=len(keep), second=d_b)
    want_a, want_b = a.copy(), b.copy()
    ref.enqueue_compact_rows(want_a, start_n, keep, n_max=len(keep), second=want_b)
    for got, want, orig in ((d_a, want_a, a), (d_b, want_b, b)):
        np.testing.assert_array_equal(got.copy_to_host(), want)
        np.testing.assert_array_equal(want[:, 5:10], orig[:, 5 + keep])   # the twin moved the rows
    with pytest.raises(ValueError, match="columns scheme"):
        kn.enqueue_compact_rows(d_a[0], None, None, n_max=1, method="scratch", second=d_b[0])


@pytest.mark.kernels
def test_a_pool_of_caches_compacts_each_slot_by_its_own_keep_in_one_launch(rng):
    """Groups (a cache pool's slots, ``DeviceCachePool.enqueue_compact``): the layers in G equal
    runs, run g moved by start_n[g] and keep[g] (a slot with n = 0 untouched), both arrays in one
    launch, as the twin moves them and as each run compacted alone."""
    from numba import cuda
    G, L = 3, 2
    a = rng.standard_normal((G * L, 20, 9)).astype(np.float32)
    b = rng.standard_normal((G * L, 20, 4)).astype(np.float32)
    start_n = np.array([[4, 3], [0, 0], [2, 5]], np.int32)
    keep = np.array([[0, 2, 5, -1, -1, -1], [0, 0, 0, 0, 0, 0], [0, 1, 3, 4, 8, -1]], np.int32)
    d_a, d_b = cuda.to_device(a), cuda.to_device(b)
    kn.enqueue_compact_rows(d_a, cuda.to_device(start_n), cuda.to_device(keep), n_max=6, second=d_b)
    want_a, want_b = a.copy(), b.copy()
    ref.enqueue_compact_rows(want_a, start_n, keep, n_max=6, second=want_b)
    for got, want, orig in ((d_a, want_a, a), (d_b, want_b, b)):
        np.testing.assert_array_equal(got.copy_to_host(), want)
        for g, (start, n) in enumerate(start_n):
            alone = orig[g * L:(g + 1) * L].copy()
            for layer in alone:
                if n:
                    ref.compact_rows(layer, int(start), keep[g, :n])
            np.testing.assert_array_equal(want[g * L:(g + 1) * L], alone)
    np.testing.assert_array_equal(want_a[L:2 * L], a[L:2 * L])                  # n = 0: untouched
    with pytest.raises(ValueError, match="start_n gives 2 groups"):
        kn.enqueue_compact_rows(d_a, cuda.to_device(start_n[:2]), cuda.to_device(keep), n_max=6)

