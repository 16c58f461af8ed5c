"""sample_post and follow_tree: the twin against direct checks, the kernels bit for bit."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import cuda

from conftest import THREADS
from ddtree_numba import kernels as kn
from ddtree_numba import reference as ref


def make_case(rng, L=4, V=12, budget=30, p_follow=0.7):
    """A tree and a target choice per node that walks down it for a while, off-branch at times."""
    x = (rng.standard_normal((L, V)) * 2).astype(np.float32)
    lp, ids = ref.topk_logprobs(x, min(budget, V))
    tree = ref.build_tree(lp, ids, budget)
    post = rng.integers(0, V, tree.num_nodes + 1).astype(np.int32)
    for j in rng.permutation(np.arange(1, tree.num_nodes + 1)):
        if rng.random() < p_follow:
            post[tree.parents[j]] = tree.tokens[j - 1]
    return tree, post


def walk_by_definition(tree, post):
    """docs/DESIGN.md §1, step 6 read literally: look for a matching child among all nodes."""
    keep = [0]
    while True:
        kids = [j for j in range(1, tree.num_nodes + 1)
                if tree.parents[j] == keep[-1] and tree.tokens[j - 1] == post[keep[-1]]]
        assert len(kids) <= 1
        if not kids:
            return keep, int(post[keep[-1]])
        keep.append(kids[0])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), budget=st.integers(0, 60), p=st.floats(0, 1))
def test_twin_follows_the_definition(seed, budget, p):
    tree, post = make_case(np.random.default_rng(seed), budget=budget, p_follow=p)
    keep, bonus = ref.follow_tree(tree, post)
    want_keep, want_bonus = walk_by_definition(tree, post)
    assert keep.tolist() == want_keep and bonus == want_bonus
    assert keep[0] == 0 and (np.diff(keep) > 0).all() and (keep >= np.arange(len(keep))).all()


def test_twin_sampling_matches_softmax_frequencies():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], np.float32))
    draws = np.array([ref.sample_post(logits, 1.0, s)[0] for s in range(4000)])
    freq = np.bincount(draws, minlength=4) / len(draws)
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.15, 0.05], atol=0.03)
    hot = np.array([ref.sample_post(logits, 0.25, s)[0] for s in range(2000)])
    p = np.exp(logits[0] / 0.25) / np.exp(logits[0] / 0.25).sum()
    np.testing.assert_allclose(np.bincount(hot, minlength=4) / len(hot), p, atol=0.03)


@pytest.mark.kernels
@pytest.mark.parametrize("temperature", [0.0, 0.6, 1.5])
def test_sample_post_kernel_matches_twin(rng, temperature):
    x = (rng.standard_normal((9, 37)) * 2).astype(np.float32)
    x[2] = np.round(x[2])  # exact ties at T = 0 go to the lower id
    for seed in (0, 2**64 - 1):
        np.testing.assert_array_equal(kn.sample_post(x, temperature, seed, threads=THREADS),
                                      ref.sample_post(x, temperature, seed))


@pytest.mark.kernels
def test_follow_tree_kernel_matches_twin(rng):
    lengths = set()
    for _ in range(6):
        tree, post = make_case(rng, budget=int(rng.integers(0, 40)))
        keep, bonus = kn.follow_tree(tree, post, threads=THREADS)
        want_keep, want_bonus = ref.follow_tree(tree, post)
        np.testing.assert_array_equal(keep, want_keep)
        assert bonus == want_bonus
        lengths.add(len(keep))
    assert len(lengths) > 1, "the cases should accept paths of several lengths"


@pytest.mark.kernels
def test_follow_tree_kernel_on_gpu_built_buffers(rng):
    x = (rng.standard_normal((3, 8)) * 2).astype(np.float32)
    lp, ids = ref.topk_logprobs(x, 8)
    bufs = kn.TreeBuffers.allocate(16)
    kn.build_tree(lp, ids, 10, out=bufs, threads=4)
    tree = ref.build_tree(lp, ids, 10)
    post = np.zeros(17, np.int32)
    post[0], post[1] = tree.tokens[0], tree.tokens[tree.parents.tolist().index(1) - 1]
    from numba import cuda
    keep_buf, info = cuda.device_array(17, np.int32), cuda.device_array(2, np.int32)
    kn.follow_tree(bufs, post, out=(keep_buf, info), threads=4)
    n, bonus = info.copy_to_host()
    want_keep, want_bonus = ref.follow_tree(tree, post[:11])
    np.testing.assert_array_equal(keep_buf.copy_to_host()[:n], want_keep)
    assert bonus == want_bonus and n >= 3


@pytest.mark.parametrize("fn", [ref.follow_tree, kn.follow_tree])
def test_follow_tree_bad_input_is_refused(rng, fn):
    tree, post = make_case(rng, budget=10)
    with pytest.raises(ValueError, match="post has 10 entries; the tree has 11"):
        fn(tree, post[:10])
    with pytest.raises(ValueError, match="int32"):
        fn(tree, post.astype(np.int64))
    with pytest.raises(ValueError, match="must be a Tree"):
        fn(tree.parents, post)


@pytest.mark.parametrize("fn", [ref.sample_post, kn.sample_post])
def test_sample_post_bad_input_is_refused(fn):
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match="temperature"):
        fn(x, -0.1, 0)
    with pytest.raises(ValueError, match="seed"):
        fn(x, 1.0, -1)


def test_round_seed_on_the_device_matches_twin():
    """The decode loop's device seed of round r (read when a captured round replays) equals the
    host's ``round_seed``."""
    out = cuda.device_array(1, np.uint64)
    for seed, r in [(0, 0), (7, 1), (7, 2), (2**64 - 1, 2**31 - 1), (123456789, 40)]:
        kn.enqueue_round_seed(cuda.to_device(np.array([seed], np.uint64)), cuda.to_device(np.array([r], np.int32)), out)
        assert int(out.copy_to_host()[0]) == ref.round_seed(seed, r), (seed, r)
    assert ref.round_seed(7, 1) != ref.round_seed(7, 2)
