"""visibility / visibility_bits: invariants of the twin, the kernel bit for bit."""

import numpy as np
import pytest
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


@pytest.mark.parametrize("fn", [ref.visibility, kn.visibility, ref.visibility_bits, kn.visibility_bits])
def test_bad_parents_are_refused(fn):
    with pytest.raises(ValueError, match=r"parents\[0\] must be -1"):
        fn(np.array([0, 0], np.int32))
    with pytest.raises(ValueError, match=r"parents\[2\] = 2"):
        fn(np.array([-1, 0, 2], np.int32))
    with pytest.raises(ValueError, match="int32"):
        fn(np.array([-1, 0], np.int64))
