"""visibility / visibility_bits: invariants of the twin, the kernel bit for bit."""

import numpy as np
import pytest
from numba import cuda
from hypothesis import given, settings
from hypothesis import strategies as st

from ddtree_numba import kernels as kn
from ddtree_numba import reference as ref


def random_parents(rng, n):
    """A random tree in which every parent precedes its child: parents [n+1] int32."""
    return np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n + 1)], np.int32)


@settings(max_examples=80, deadline=None)
@given(n=st.integers(0, 70), seed=st.integers(0, 2**32 - 1))
def test_each_row_is_its_parents_row_plus_itself(n, seed):
    parents = random_parents(np.random.default_rng(seed), n)
    vis = ref.visibility(parents)
    assert vis[0].tolist() == [True] + [False] * n
    for i in range(1, n + 1):
        want = vis[parents[i]].copy()
        want[i] = True
        np.testing.assert_array_equal(vis[i], want)
    bits = ref.visibility_bits(parents)
    unpacked = ((bits[:, :, None] >> np.arange(32, dtype=np.uint32)) & 1).reshape(n + 1, -1)
    np.testing.assert_array_equal(unpacked[:, : n + 1].astype(bool), vis)
    assert not unpacked[:, n + 1:].any()


@pytest.mark.kernels
@pytest.mark.parametrize("n", [0, 1, 31, 32, 45])
def test_kernel_matches_twin(rng, n):
    parents = random_parents(rng, n)
    np.testing.assert_array_equal(kn.visibility(parents), ref.visibility(parents))
    np.testing.assert_array_equal(kn.visibility_bits(parents, block=(4, 2)), ref.visibility_bits(parents))


@pytest.mark.kernels
def test_trees_side_by_side_get_each_its_own_mask(rng):
    """A batch's verify rows (``seqs`` = (s0, t, row0, slot) a tree): each tree's rows get the mask
    of that tree alone, over its own nodes; rows in no tree are left as they were; the kernel
    equals its twin, and the twin equals each tree's ``visibility_bits``."""
    trees = [random_parents(rng, n) for n in (5, 0, 40, 2)]
    seqs, row0 = [], 1                                   # row 0 and the rows past the trees: no tree
    for j, p in enumerate(trees):
        seqs.append((7, p.shape[0], row0, j))
        row0 += p.shape[0]
    rows = row0 + 3
    parents = np.zeros(rows, np.int32)
    for (_, t, r0, _), p in zip(seqs, trees):
        parents[r0:r0 + t] = p
    seqs = np.array(seqs, np.int32)
    seqs[1, 1] = 0                                       # a finished sequence: no rows
    want = np.full((rows, 3), 0xAB, np.uint32)
    ref.enqueue_visibility_bits(parents, want, seqs=seqs)
    for (_, t, r0, _) in seqs:
        if t:
            packed = ref.visibility_bits(parents[r0:r0 + t])
            np.testing.assert_array_equal(want[r0:r0 + t, :packed.shape[1]], packed)
    assert (want[0] == 0xAB).all() and (want[row0:] == 0xAB).all()
    bits = cuda.to_device(np.full((rows, 3), 0xAB, np.uint32))
    kn.enqueue_visibility_bits(cuda.to_device(parents), bits, seqs=cuda.to_device(seqs), block=(4, 2))
    np.testing.assert_array_equal(bits.copy_to_host(), want)


@pytest.mark.parametrize("fn", [ref.visibility, kn.visibility, ref.visibility_bits, kn.visibility_bits])
def test_bad_parents_are_refused(fn):
    with pytest.raises(ValueError, match=r"parents\[0\] must be -1"):
        fn(np.array([0, 0], np.int32))
    with pytest.raises(ValueError, match=r"parents\[2\] = 2"):
        fn(np.array([-1, 0, 2], np.int32))
    with pytest.raises(ValueError, match="int32"):
        fn(np.array([-1, 0], np.int64))
