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


@pytest.mark.kernels
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_batch_of_trees_samples_and_walks_as_each_tree_alone(rng, temperature):
    """The batched device round's launches: ``sample_post`` over several trees' rows side by side
    (``seqs`` = (s0, t, row0, slot) a tree, a seed a tree) draws each tree's rows as that tree
    alone, rows in no tree untouched; ``follow_trees`` walks each tree from its own row0 (a tree
    with t = 0 not at all); both equal their twins."""
    cases = [make_case(rng, budget=b, p_follow=0.9) for b in (6, 9, 3)]
    V = 12
    seqs, row0 = [], 2
    for z, (tree, _) in enumerate(cases):
        seqs.append((0, tree.num_nodes + 1, row0, z))
        row0 += tree.num_nodes + 1
    seqs = np.array(seqs, np.int32)
    seqs[2, 1] = 0                                          # a finished sequence
    logits = (rng.standard_normal((row0 + 2, V)) * 2).astype(np.float32)
    for (tree, post), (_, t, r0, _) in zip(cases, seqs):    # logits whose arg-max walks the trees
        logits[r0:r0 + tree.num_nodes + 1, :] -= 10
        logits[np.arange(r0, r0 + tree.num_nodes + 1), post] += 40
    seeds = np.array([3, 2**64 - 5, 11], np.uint64)
    post_d = cuda.to_device(np.full(row0 + 2, -7, np.int32))
    kn.sample_post(cuda.to_device(logits), temperature, 0, out=post_d, seed_device=cuda.to_device(seeds),
                   seqs=cuda.to_device(seqs), threads=THREADS)
    got = post_d.copy_to_host()
    want = np.full(row0 + 2, -7, np.int32)
    for z, (_, t, r0, _) in enumerate(seqs):
        if t:
            want[r0:r0 + t] = ref.sample_post(logits[r0:r0 + t], temperature, int(seeds[z]))
    np.testing.assert_array_equal(got, want)
    bufs = kn.TreeBatchBuffers.allocate(3, 10)
    for z, (tree, _) in enumerate(cases):
        n = tree.num_nodes
        for field, arr in (("tokens", tree.tokens), ("depths", tree.depths), ("parents", tree.parents)):
            getattr(bufs, field)[z, :arr.shape[0]].copy_to_device(np.asarray(arr, np.int32))
        bufs.n_nodes[z:z + 1].copy_to_device(np.array([n], np.int32))
    keep, info = cuda.device_array((3, 11), np.int32), cuda.device_array((3, 2), np.int32)
    kn.follow_trees(bufs, post_d, cuda.to_device(seqs), out=(keep, info), threads=THREADS)
    keep_h, info_h = keep.copy_to_host(), info.copy_to_host()
    walks = ref.follow_trees([c[0] for c in cases], got, seqs)
    assert [len(k) for k, _ in walks][:2] == info_h[:2, 0].tolist() and info_h[2].tolist() == [0, 0]
    for z, (k, bonus) in enumerate(walks):
        np.testing.assert_array_equal(keep_h[z, :len(k)], k)
        assert info_h[z, 1] == bonus
    if temperature == 0:                                   # the arg-max walks each tree as far as make_case's post
        for z in range(2):
            np.testing.assert_array_equal(walks[z][0], ref.follow_tree(*cases[z])[0])


@pytest.mark.parametrize("fn", [ref.follow_tree, kn.follow_tree])
def test_follow_tree_bad_input_is_refused(rng, fn):
    tree, post = make_case(rng, budget=10)
    with pytest.raises(ValueError, match="post has 10 entries; the tree has 11"):
        fn(tree, post[:10])
    with pytest.raises(ValueError, match="int32"):
        fn(tree, post.astype(np.int64))
    with pytest.raises(ValueError, match="must be a Tree"):
        fn(tree.parents, post)


def test_follow_tree_kernel_refuses_trees_past_its_table():
    """The GPU walk's table holds MAX_BUDGET nodes (every tree the package builds): bigger buffers
    are refused by name, not walked past the table."""
    from ddtree_numba.kernels.tree_build import MAX_BUDGET
    bufs = kn.TreeBuffers.allocate(MAX_BUDGET + 1)
    keep, info = cuda.device_array(MAX_BUDGET + 2, np.int32), cuda.device_array(2, np.int32)
    with pytest.raises(ValueError, match="up to MAX_BUDGET = 1024 nodes"):
        kn.follow_tree(bufs, np.zeros(MAX_BUDGET + 2, np.int32), out=(keep, info))
    with pytest.raises(ValueError, match="up to MAX_BUDGET = 1024 nodes"):
        kn.follow_trees(kn.TreeBatchBuffers.allocate(2, MAX_BUDGET + 1), cuda.to_device(np.zeros(8, np.int32)),
                        cuda.to_device(np.zeros((2, 4), np.int32)),
                        out=(cuda.device_array((2, MAX_BUDGET + 2), np.int32), cuda.device_array((2, 2), np.int32)))


@pytest.mark.parametrize("fn", [ref.sample_post, kn.sample_post])
def test_sample_post_bad_input_is_refused(fn):
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match="temperature"):
        fn(x, -0.1, 0)
    with pytest.raises(ValueError, match="seed"):
        fn(x, 1.0, -1)
    with pytest.raises(ValueError, match=r"no entries \(V = 0\)"):     # (the kernel drew the 'none' id)
        fn(np.zeros((3, 0), np.float32), 1.0, 0)
    with pytest.raises(ValueError, match="temperature must be a number"):
        fn(x, "0.5", 0)


def test_round_seed_on_the_device_matches_twin():
    """The decode loop's device seed of round r (read when a captured round replays) equals the
    host's ``round_seed``."""
    out = cuda.device_array(1, np.uint64)
    for seed, r in [(0, 0), (7, 1), (7, 2), (2**64 - 1, 2**31 - 1), (123456789, 40)]:
        kn.enqueue_round_seed(cuda.to_device(np.array([seed], np.uint64)), cuda.to_device(np.array([r], np.int32)), out)
        assert int(out.copy_to_host()[0]) == ref.round_seed(seed, r), (seed, r)
    assert ref.round_seed(7, 1) != ref.round_seed(7, 2)
