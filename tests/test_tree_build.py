"""build_tree: the twin against brute-force enumeration and invariants, the kernel bit for bit."""

import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import THREADS
from ddtree_numba import kernels as kn
from ddtree_numba import reference as ref
from ddtree_numba.reference import tree_build as tb


def _draft(rng, L, V, k, kind="normal"):
    if kind == "ties":
        x = rng.integers(-2, 2, (L, V)).astype(np.float32)
    else:
        x = (rng.standard_normal((L, V)) * rng.uniform(0.5, 4.0)).astype(np.float32)
    return ref.topk_logprobs(x, k)


def _rank_path(tree, node):
    return tuple(int(tree.ranks[i - 1]) for i in tree.path(node)[1:])


@pytest.mark.parametrize("kind", ["normal", "ties"])
@pytest.mark.parametrize("L,V,budget", [(1, 5, 3), (3, 4, 30), (3, 3, 39), (4, 3, 200), (2, 6, 0)])
def test_twin_is_exactly_the_budget_best_paths_in_order(rng, kind, L, V, budget):
    lp, ids = _draft(rng, L, V, min(budget, V) or 1, kind)
    tree = ref.build_tree(lp, ids, budget)
    want = ref.enumerate_paths(lp)[:budget]
    assert tree.num_nodes == len(want)
    for node, (score, path) in enumerate(want, start=1):
        assert _rank_path(tree, node) == path
        assert tree.scores[node - 1] == score
        assert tree.tokens[node - 1] == ids[len(path) - 1, path[-1]]


def assert_same_tree(a, b):
    for field in ("tokens", "depths", "parents", "ranks"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
    np.testing.assert_array_equal(a.scores.view(np.uint64), b.scores.view(np.uint64), err_msg="scores")


@pytest.mark.parametrize("tie_slots", [tb.TIE_SLOTS, 2, 0])
@pytest.mark.parametrize("L,V,budget", [(1, 5, 3), (3, 4, 30), (3, 3, 39), (4, 3, 200), (2, 6, 0)])
def test_level_build_is_the_budget_best_paths_in_order(rng, L, V, budget, tie_slots):
    """The level-synchronous twin against brute-force enumeration, with exact ties, its pop order
    from path compares of the tied nodes (``_order_few_ties``) or, past ``tie_slots`` of them,
    from preorder (``_order_with_ties``)."""
    lp, ids = _draft(rng, L, V, min(budget, V) or 1, "ties")
    want = ref.enumerate_paths(lp)[:budget]
    tree = ref.build_tree_levels(lp, ids, budget, tie_slots=tie_slots)
    assert [_rank_path(tree, n) for n in range(1, tree.num_nodes + 1)] == [p for _, p in want]
    np.testing.assert_array_equal(tree.scores, [s for s, _ in want])


def test_tied_count_is_the_nodes_the_few_ties_path_places():
    """``tied_count`` (from the level scores and the B best, as the GPU counts before choosing its
    path) against the definition spelled out: nodes scoring T, and nodes above T that share their
    score with another of the B best. B = 5 of seven scores: the B best -1, -2, -2, -3, -3, so T =
    -3; tied: the two -2 and all three -3 (one outside the B best)."""
    score = np.array([-3.0, -1.0, -2.0, -3.0, -4.0, -2.0, -3.0])
    top = -np.sort(-score)[:5]
    T = top[-1]
    want = sum(1 for s in score if s == T or (s > T and (top == s).sum() >= 2))
    assert tb.tied_count(score, top, T) == want == 5
    # a budget above the seven nodes: T is -inf and the B best are all of them; tied: -2 x 2, -3 x 3
    assert tb.tied_count(score, -np.sort(-score), -np.inf) == 5
    # the default limit: a quarter of the budget, at most TIE_SLOTS
    assert [tb.few_ties_limit(b) for b in (0, 16, 256, 1024, 4096)] == [0, 4, 64, tb.TIE_SLOTS, tb.TIE_SLOTS]


@settings(max_examples=150, deadline=None)
@given(L=st.integers(1, 6), V=st.integers(1, 14), budget=st.integers(0, 160),
       seed=st.integers(0, 2**32 - 1), kind=st.sampled_from(["normal", "ties", "magnitudes"]),
       tie_slots=st.sampled_from([None, tb.TIE_SLOTS, 3, 0]))
def test_level_build_equals_the_heap_build_bit_for_bit(L, V, budget, seed, kind, tie_slots):
    """``build_tree_levels`` (no pop chain) == ``build_tree`` (the heap): tokens, depths, parents,
    ranks and score bits. 'magnitudes' spans 1e-30 .. 1e12 so that float64 path sums round."""
    rng = np.random.default_rng(seed)
    if kind == "magnitudes":
        x = (np.sign(rng.standard_normal((L, V))) * 10.0 ** rng.integers(-30, 12, (L, V))).astype(np.float32)
        lp, ids = ref.topk_logprobs(x, min(budget, V) or 1)
    else:
        lp, ids = _draft(rng, L, V, min(budget, V) or 1, kind)
    assert_same_tree(ref.build_tree_levels(lp, ids, budget, tie_slots=tie_slots), ref.build_tree(lp, ids, budget))


@settings(max_examples=200, deadline=None)
@given(P=st.integers(1, 40), R=st.integers(1, 40), budget=st.integers(1, 200), seed=st.integers(0, 2**32 - 1),
       kind=st.sampled_from(["normal", "ties", "rounding"]))
def test_a_level_keeps_exactly_the_best_budget_children(P, R, budget, seed, kind):
    """``select_level`` (threshold from the capped candidates, ties by binary search) keeps exactly
    the best ``budget`` children by (-score, parent's path order, rank), as a sort of every child
    finds them: the caps never lose a child that belongs (a superset would still give the right
    tree in the end, so this is checked here, where the GPU's fixed level capacity depends on it)."""
    from ddtree_numba.reference.tree_build import select_level
    rng = np.random.default_rng(seed)
    if kind == "ties":
        prev = -rng.integers(0, 4, P).astype(np.float64)
        row = -np.sort(rng.integers(0, 4, R)).astype(np.float64)
    elif kind == "rounding":                       # unequal parents whose children round to one value
        prev = -1.0 - 0.01 * rng.integers(0, 6, P)
        row = -np.sort(np.r_[rng.random(1), np.full(R - 1, 1e18)])
    else:
        prev = -np.abs(rng.standard_normal(P)) * 3
        row = -np.sort(np.abs(rng.standard_normal(R)) * 3)
    child = (prev[:, None] + row[None, :]).reshape(-1)
    parent, rank = np.repeat(np.arange(P), R), np.tile(np.arange(R), P)
    best = np.lexsort((rank, parent, -child))[:budget]          # parents are given in path order
    want = np.bincount(parent[best], minlength=P)
    np.testing.assert_array_equal(select_level(prev, row, budget), want)


def test_level_build_follows_the_path_order_when_rounding_ties_children_of_unequal_parents():
    """Twelve depth-1 ranks close together, then a wide gap at depth 2: the parents (r, 0) all score
    above (0, 1) but come after it by path. A -1e18 log-prob (float64 ulp 128 there) rounds their
    children's scores to one value, so the path order puts (0, 1)'s children before the children
    of 11 better-scored parents. A level build that ordered a level's children by their parents'
    scores instead of their paths keeps the wrong ones at every budget below (measured)."""
    K = 12
    lp = np.stack([-1.0 - 0.01 * np.arange(K), np.r_[-0.5, -5.0, np.full(K - 2, -1e18)],
                   np.full(K, -1e18)]).astype(np.float32)
    ids = np.arange(3 * K, dtype=np.int32).reshape(3, K)
    for budget in (40, 50, 66, 80, 120):
        for tie_slots in (tb.TIE_SLOTS, 0):
            assert_same_tree(ref.build_tree_levels(lp, ids, budget, tie_slots=tie_slots), ref.build_tree(lp, ids, budget))
    heap = ref.build_tree(lp, ids, 80)
    d3 = np.flatnonzero(heap.depths == 3) + 1
    assert any(heap.parents[a] > heap.parents[b] for a in d3 for b in d3 if a < b), "no inverted parents"


def check_invariants(tree, lp, ids):
    n = tree.num_nodes
    p = tree.parents
    assert p.shape == (n + 1,) and p[0] == -1
    assert (p[1:] < np.arange(1, n + 1)).all() and (p[1:] >= 0).all()
    parent_depth = np.concatenate([[0], tree.depths])[p[1:]]
    assert (tree.depths == parent_depth + 1).all()
    for parent in range(n + 1):
        kids = np.flatnonzero(p[1:] == parent)
        toks = tree.tokens[kids]
        assert len(set(toks.tolist())) == len(toks), "siblings hold distinct tokens"
        # siblings are a prefix of the ranks 0, 1, 2, .. (best-first never skips a rank)
        assert sorted(tree.ranks[kids].tolist()) == list(range(len(kids)))
    assert (np.diff(tree.scores) <= 0).all(), "pop order is score order"


@settings(max_examples=60, deadline=None)
@given(L=st.integers(1, 5), V=st.integers(1, 12), budget=st.integers(0, 80),
       seed=st.integers(0, 2**32 - 1), ties=st.booleans())
def test_twin_invariants(L, V, budget, seed, ties):
    rng = np.random.default_rng(seed)
    lp, ids = _draft(rng, L, V, min(budget, V), "ties" if ties else "normal")
    tree = ref.build_tree(lp, ids, budget)
    assert tree.num_nodes == min(budget, sum(min(budget, V) ** d for d in range(1, L + 1)))
    check_invariants(tree, lp, ids)


@settings(max_examples=60, deadline=None)
@given(L=st.integers(2, 8), V=st.integers(1, 6), budget=st.integers(1, 7),
       seed=st.integers(0, 2**32 - 1), ties=st.booleans())
def test_a_tree_of_budget_b_needs_only_the_first_b_depths(L, V, budget, seed, ties):
    """The decode loops read only min(L, budget) rows of a draft (``decode.device.tree_depths``):
    a node at depth d is popped after its d - 1 ancestors, so a tree of budget b holds no node
    deeper than b, and the rows past b change nothing, ties included. Both builds, against the
    tree of every row."""
    rng = np.random.default_rng(seed)
    lp, ids = _draft(rng, L, V, min(budget, V), "ties" if ties else "normal")
    whole = ref.build_tree(lp, ids, budget)
    assert whole.num_nodes == 0 or whole.depths.max() <= budget
    for build in (ref.build_tree, ref.build_tree_levels):
        part = build(lp[:budget], ids[:budget], budget)
        for name in ("tokens", "depths", "parents", "ranks", "scores"):
            np.testing.assert_array_equal(getattr(part, name), getattr(whole, name), err_msg=name)


@pytest.mark.kernels
@pytest.mark.parametrize("kind", ["normal", "ties"])
def test_kernel_matches_twin_bit_for_bit(rng, kind):
    for L, V, budget in [(int(rng.integers(1, 6)), int(rng.integers(2, 30)), int(rng.integers(1, 40))),
                         (3, 2, 20), (1, 7, 3)]:
        lp, ids = _draft(rng, L, V, min(budget, V), kind)
        got = kn.build_tree(lp, ids, budget, threads=THREADS)
        want = ref.build_tree(lp, ids, budget)
        assert got == want, (L, V, budget)
        check_invariants(got, lp, ids)
    assert kn.build_tree(lp, ids, budget) == want     # the default kernel (_build_method)


@pytest.mark.kernels
@pytest.mark.parametrize("kind", ["normal", "ties", "rounding"])
def test_level_kernel_matches_the_twins_bit_for_bit(rng, kind):
    """The level-synchronous kernel (no pop chain) gives the heap build's tree: tokens, depths,
    parents, ranks and score bits, including ties at each level's threshold and rounding ties of
    unequal parents (the case where ordering children by parent score instead of path goes wrong)."""
    cases = [(int(rng.integers(1, 5)), int(rng.integers(2, 12)), int(rng.integers(1, 40))), (3, 2, 20), (1, 7, 3),
             (4, 3, 60)]
    for L, V, budget in cases:
        if kind == "rounding":
            K = 6
            lp = np.stack([-1.0 - 0.01 * np.arange(K), np.r_[-0.5, -5.0, np.full(K - 2, -1e18)],
                           np.full(K, -1e18)]).astype(np.float32)
            ids = np.arange(3 * K, dtype=np.int32).reshape(3, K)
        else:
            lp, ids = _draft(rng, L, V, min(budget, V), kind)
        want = ref.build_tree(lp, ids, budget)
        for tie_slots in (None, tb.TIE_SLOTS, 2, 0):     # tied nodes by path compares, or by preorder
            got = kn.build_tree_levels(lp, ids, budget, threads=THREADS, tie_slots=tie_slots)
            assert got == want, (kind, L, V, budget, tie_slots)
            assert got == ref.build_tree_levels(lp, ids, budget, tie_slots=tie_slots)


@pytest.mark.kernels
def test_level_kernel_is_compiled_once_for_every_budget_and_tie_limit(rng):
    """The tie limit is a kernel argument, not a factory's: a factory keyed by it compiled a new
    kernel for each budget (``few_ties_limit`` is a quarter of it), ~10 s each on a GPU, and a
    test over 120 random budgets ran for minutes there."""
    from ddtree_numba.kernels import tree_build as ktb
    lp, ids = _draft(rng, 2, 6, 6, "ties")
    kn.build_tree_levels(lp, ids, 6, threads=THREADS)
    before = ktb._build_tree_levels_kernel.cache_info().currsize
    for budget, tie_slots in ((5, None), (9, None), (17, None), (33, 2), (40, 0), (23, tb.TIE_SLOTS)):
        assert kn.build_tree_levels(lp, ids, budget, threads=THREADS, tie_slots=tie_slots) == ref.build_tree(
            lp, ids, budget)
    assert ktb._build_tree_levels_kernel.cache_info().currsize == before


@pytest.mark.kernels
@settings(max_examples=25, deadline=None)
@given(L=st.integers(1, 5), V=st.integers(1, 12), budget=st.integers(0, 90),
       seed=st.integers(0, 2**32 - 1), kind=st.sampled_from(["normal", "ties", "magnitudes"]))
def test_level_kernel_equals_the_heap_build_on_random_drafts(L, V, budget, seed, kind):
    rng = np.random.default_rng(seed)
    if kind == "magnitudes":              # float64 path sums that round
        x = (np.sign(rng.standard_normal((L, V))) * 10.0 ** rng.integers(-30, 12, (L, V))).astype(np.float32)
        lp, ids = ref.topk_logprobs(x, min(budget, V) or 1)
    else:
        lp, ids = _draft(rng, L, V, min(budget, V) or 1, kind)
    assert kn.build_tree_levels(lp, ids, budget, threads=THREADS) == ref.build_tree(lp, ids, budget)


@pytest.mark.kernels
def test_level_kernel_reuses_its_scratch_and_fills_device_buffers(rng):
    lp, ids = _draft(rng, 3, 10, 10)
    bufs, scratch = kn.TreeBuffers.allocate(12), kn.LevelScratch.allocate(3, 12)
    for seed in range(2):
        lp, ids = _draft(np.random.default_rng(seed), 3, 10, 10)
        assert kn.build_tree_levels(lp, ids, 12, out=bufs, scratch=scratch, threads=4) is bufs
        assert bufs.to_tree() == ref.build_tree(lp, ids, 12)
    with pytest.raises(ValueError, match="scratch is for 3 depths x budget 12"):
        kn.build_tree_levels(lp, ids, 11, scratch=scratch, threads=4)


@pytest.mark.kernels
@pytest.mark.parametrize("fn", ["build_tree", "build_tree_levels"])
def test_the_budget_can_come_from_the_device(rng, fn):
    """With ``budget_device`` the kernels build min(budget, budget_device[0]) nodes, read when they
    run (what a captured round replays); a host array is refused."""
    from numba import cuda
    build = getattr(kn, fn)
    lp, ids = _draft(rng, 3, 6, 6, "ties")
    bufs = kn.TreeBuffers.allocate(12)
    n_budget = cuda.to_device(np.array([5], np.int32))
    for value, want in [(5, 5), (40, 12), (-3, 0), (0, 0)]:
        n_budget.copy_to_device(np.array([value], np.int32))
        build(lp, ids, 12, out=bufs, budget_device=n_budget, threads=THREADS)
        assert bufs.to_tree() == ref.build_tree(lp, ids, want), (fn, value)
    with pytest.raises(ValueError, match="budget_device must be a device array"):
        build(lp, ids, 12, budget_device=np.array([3], np.int32), threads=THREADS)


@pytest.mark.kernels
def test_level_kernel_gives_an_empty_tree_for_unsorted_device_rows():
    """Device inputs are not value-checked: a row out of order breaks the binary searches, and the
    kernel would keep more than the budget at a level. It returns an empty tree instead of
    writing past its level arrays (the simulator bounds-checks every index). With the seed the
    count may come back under the budget: some tree of at most the budget, still no write past."""
    from numba import cuda
    lp = np.array([[-0.1, -0.2, -0.3, -0.4], [-9.0, -9.0, -0.01, -0.01]], np.float32)   # row 1 rises
    ids = np.arange(8, dtype=np.int32).reshape(2, 4)
    tree = kn.build_tree_levels(cuda.to_device(lp), cuda.to_device(ids), 4, threads=THREADS, seed=False)
    assert tree.num_nodes == 0 and tree.parents.tolist() == [-1]
    assert kn.build_tree_levels(cuda.to_device(lp), cuda.to_device(ids), 4, threads=THREADS).num_nodes <= 4


@pytest.mark.kernels
def test_level_kernel_gives_an_empty_tree_for_nan_in_device_rows():
    """A NaN log-prob in a device row (not value-checked) kept as a node has no place in pop order:
    placing the nodes by their scores wrote past the tree (found by review: tokens[budget]). The
    kernel returns an empty tree instead; the simulator bounds-checks every index."""
    from numba import cuda
    for lp, budget in (([[0.0, 0.0, np.nan], [0.0, -1.0, -2.0], [np.nan, -2.0, -2.0]], 18),
                       ([[0.0, np.nan, -2.0, -2.0], [0.0, 0.0, -1.0, np.nan], [0.0, 0.0, -2.0, np.nan]], 7)):
        lp = np.array(lp, np.float32)
        ids = np.arange(lp.size, dtype=np.int32).reshape(lp.shape)
        tree = kn.build_tree_levels(cuda.to_device(lp), cuda.to_device(ids), budget, threads=THREADS, seed=False)
        assert tree.num_nodes == 0 and tree.parents.tolist() == [-1]


@pytest.mark.kernels
def test_kernel_into_device_buffers(rng):
    lp, ids = _draft(rng, 3, 10, 10)
    bufs = kn.TreeBuffers.allocate(16)
    assert kn.build_tree(lp, ids, 12, out=bufs, threads=4) is bufs
    assert bufs.to_tree() == ref.build_tree(lp, ids, 12)


def _score_bits(tree):
    return tree.scores.view(np.uint64).tolist()


@pytest.mark.kernels
def test_every_build_scores_a_chain_of_negative_zeros_as_plus_zero():
    """A confident top-K row can lead with -0.0. Every build adds a path's log-probs to the root's
    0.0 (0.0 + -0.0 = +0.0); the heap twin once seeded its first node with lp[0, 0] itself and
    scored that chain -0.0, which ``np.array_equal`` of the values could not see: Tree == now
    compares the scores' bits, and here they are checked against the brute-force sums."""
    lp = np.array([[-0.0, -1.0], [-0.0, -2.0], [-0.0, -0.5]], np.float32)
    ids = np.arange(6, dtype=np.int32).reshape(3, 2)
    want = ref.build_tree(lp, ids, 6)
    brute = dict((path, s) for s, path in tb.enumerate_paths(lp))
    assert _score_bits(want) == [np.float64(brute[_rank_path(want, i)]).view(np.uint64) for i in range(1, 7)]
    assert not np.signbit(want.scores[want.scores == 0]).any()        # (the first three score 0)
    for got in (kn.build_tree(lp, ids, 6, threads=THREADS), kn.build_tree_levels(lp, ids, 6),
                ref.build_tree_levels(lp, ids, 6)):
        assert got == want and _score_bits(got) == _score_bits(want)
    flipped = ref.build_tree(lp, ids, 6)
    flipped.scores[0] = -flipped.scores[0]          # +0.0 -> -0.0: the same value, another tree
    assert flipped != want


@pytest.mark.parametrize("fn", [ref.build_tree, kn.build_tree, ref.build_tree_levels, kn.build_tree_levels])
def test_bad_input_is_refused(rng, fn):
    lp, ids = _draft(rng, 2, 6, 4)
    with pytest.raises(ValueError, match="budget must be >= 0"):
        fn(lp, ids, -1)
    with pytest.raises(ValueError, match="ids has shape"):
        fn(lp, ids[:, :3], 4)
    with pytest.raises(ValueError, match="int32"):
        fn(lp, ids.astype(np.int64), 4)
    with pytest.raises(ValueError, match="descending"):
        fn(lp[:, ::-1].copy(), ids, 4)
    with pytest.raises(ValueError, match="<= 0"):
        fn(-lp, ids, 4)


def test_kernel_limits_are_refused(rng):
    lp, ids = _draft(rng, 2, 6, 4)
    with pytest.raises(ValueError, match="MAX_BUDGET"):
        kn.build_tree(lp, ids, 1025)
    for threads in (True, 3):                        # (a bool is an int to Python: refused by name)
        with pytest.raises(ValueError, match="threads must be a power of two"):
            kn.build_tree(lp, ids, 4, threads=threads)
    lp33, ids33 = _draft(rng, 33, 3, 2)
    with pytest.raises(ValueError, match="MAX_DEPTH"):
        kn.build_tree(lp33, ids33, 4)


# -- a batch of trees in one launch (issue 17: a block a sequence) -------------------------------

def _batch(rng, S, L, V, k):
    drafts = [_draft(rng, L, V, k, "ties" if s % 2 else "normal") for s in range(S)]
    return np.stack([d[0] for d in drafts]), np.stack([d[1] for d in drafts])


def test_batch_twin_is_the_single_build_of_each_sequence(rng):
    lp, ids = _batch(rng, 4, 3, 7, 7)
    trees = ref.build_trees(lp, ids, 20)
    assert len(trees) == 4
    for s in range(4):
        assert trees[s] == ref.build_tree(lp[s], ids[s], 20)
    assert ref.build_trees(lp[:0], ids[:0], 5) == []


@pytest.mark.kernels
def test_the_heap_kernel_reads_ranks_past_its_shared_copy_of_lp(rng):
    """lp [20, 300] is more than the shared copy holds (LP_CACHE // 20 = 204 ranks a depth): with
    nearly flat rows the 400 best paths are every rank of depth 1 (ranks 204.. read from global
    memory), then 100 of depth 2, whose scores read the copy's second row (the copy's stepped
    (depth, rank) walk crosses rows mid-block)."""
    x = (rng.standard_normal((20, 300)) * 0.05).astype(np.float32)
    lp, ids = ref.topk_logprobs(x, 300)
    got = kn.build_tree(lp, ids, 400, threads=32)
    assert got == ref.build_tree(lp, ids, 400)
    assert int(got.ranks.max()) == 299 and int(got.depths.max()) == 2


@pytest.mark.kernels
@pytest.mark.parametrize("threads", [32, 64])
def test_one_and_two_warp_blocks_break_exact_score_ties_by_path(rng, threads):
    """The heap kernel's blocks of the demo budgets, on drafts of integer logits (most scores
    tie exactly): on a GPU each warp's arg-max takes the greatest score by a shuffle minimum of
    order keys, then the tied lanes by path; the tree must still be the twin's, bit for bit."""
    for L, V, budget in [(6, 12, 64), (4, 9, 33), (15, 5, 16)]:
        lp, ids = _draft(rng, L, V, min(budget, V), "ties")
        assert kn.build_tree(lp, ids, budget, threads=threads) == ref.build_tree(lp, ids, budget), (L, V, budget)


@pytest.mark.kernels
@pytest.mark.parametrize("redux", [True, False])
@pytest.mark.parametrize("kind", ["normal", "ties"])
def test_warp_kernel_matches_twin_bit_for_bit(rng, kind, redux, monkeypatch):
    """The warp kernel (the frontier in registers, two slots a lane): trees of one slot a lane and
    of both (past 32 slots), chains (K 1), rows shorter than the budget, the empty tree; on drafts
    of integer logits most scores tie exactly, and the tied slots are ordered by path (on a GPU:
    within a lane, then between the tied lanes; the warp's greatest key by redux.sync or by
    shuffles)."""
    import importlib
    monkeypatch.setattr(importlib.import_module("ddtree_numba.kernels.tree_build"), "WARP_REDUX", redux)
    for L, V, budget in [(1, 5, 3), (3, 4, 30), (3, 3, 39), (6, 12, 64), (15, 5, 16), (15, 40, 64),
                         (5, 2, 64), (1, 100, 64), (4, 1, 8), (2, 7, 1), (2, 6, 0)]:
        lp, ids = _draft(rng, L, V, max(min(budget, V), 1), kind)
        got = kn.build_tree(lp, ids, budget, method="warp")
        want = ref.build_tree(lp, ids, budget)
        assert got == want, (L, V, budget)
        check_invariants(got, lp, ids)


@pytest.mark.kernels
def test_warp_kernel_builds_a_batch_with_budgets_from_the_device(rng):
    from numba import cuda
    lp, ids = _batch(rng, 3, 4, 9, 9)
    ids = ids + (100 * np.arange(3, dtype=np.int32))[:, None, None]       # each sequence's own tokens
    assert kn.build_trees(lp, ids, 50, method="warp") == ref.build_trees(lp, ids, 50)
    bufs = kn.TreeBatchBuffers.allocate(3, 64)
    per_tree = cuda.to_device(np.array([9, 0, 50], np.int32))
    kn.build_trees(lp, ids, 50, out=bufs, budget_device=per_tree, method="warp")
    assert bufs.to_trees() == [ref.build_tree(lp[s], ids[s], b) for s, b in enumerate((9, 0, 50))]


def test_the_build_method_is_chosen_by_budget_and_refused_by_name(rng):
    import importlib
    tbk = importlib.import_module("ddtree_numba.kernels.tree_build")
    limit = tbk.WARP_DEFAULT_UP_TO
    assert 0 <= limit <= tbk.WARP_BUDGET
    assert [tbk._build_method(None, b, None) for b in (0, 16, 64, 65, 1024)] == \
        ["warp" if b <= limit else "block" for b in (0, 16, 64, 65, 1024)]
    assert tbk._build_method(None, min(16, limit), 64) == "block"   # a block size asks for the block kernel
    lp, ids = _draft(rng, 2, 6, 4)
    with pytest.raises(ValueError, match="method must be one of"):
        kn.build_tree(lp, ids, 4, method="heap")
    with pytest.raises(ValueError, match="WARP_BUDGET = 64, got 65"):
        kn.build_tree(lp, ids, 65, method="warp")
    with pytest.raises(ValueError, match="one warp"):
        kn.build_trees(lp[None], ids[None], 4, method="warp", threads=64)


@pytest.mark.kernels
@pytest.mark.parametrize("budget", [0, 1, 13, 40])
def test_batch_kernel_builds_each_sequence_in_its_own_block(rng, budget):
    """Every sequence's tree equals its own heap build (tokens, depths, parents, ranks, score
    bits), so the block of one sequence reads only its rows and writes only its row."""
    lp, ids = _batch(rng, 5, 3, 6, 6)
    ids = ids + (100 * np.arange(5, dtype=np.int32))[:, None, None]       # each sequence's own tokens
    got = kn.build_trees(lp, ids, budget, threads=THREADS)
    want = ref.build_trees(lp, ids, budget)
    assert len(got) == 5 and all(g == w for g, w in zip(got, want))


@pytest.mark.kernels
def test_batch_kernel_with_the_default_block_past_one_warp(rng):
    """The block kernel's ``threads`` None: ``_heap_threads(budget)``, one warp up to budget 32,
    two to 64, one to 192, two to 256, then the module's THREADS; at budget 40 (two warps) every
    tree is still its twin's."""
    import importlib
    tb = importlib.import_module("ddtree_numba.kernels.tree_build")
    assert [tb._heap_threads(b) for b in (1, 32, 33, 64, 65, 192, 193, 256, 257)] == \
        [32, 32, 64, 64, 32, 32, 64, 64, 128]
    lp, ids = _batch(rng, 2, 3, 5, 5)
    got = kn.build_trees(lp, ids, 40, method="block")
    want = ref.build_trees(lp, ids, 40)
    assert len(got) == 2 and all(g == w for g, w in zip(got, want))
    assert all(w.num_nodes == 40 for w in want)          # every tree reaches the budget


@pytest.mark.kernels
def test_batch_kernel_into_device_buffers_and_the_device_budget(rng):
    from numba import cuda
    lp, ids = _batch(rng, 3, 2, 5, 5)
    bufs = kn.TreeBatchBuffers.allocate(4, 16)
    assert kn.build_trees(cuda.to_device(lp), cuda.to_device(ids), 12, out=bufs, threads=THREADS) is bufs
    assert bufs.to_trees()[:3] == ref.build_trees(lp, ids, 12)
    n_budget = cuda.to_device(np.array([5], np.int32))
    kn.build_trees(lp, ids, 12, out=bufs, budget_device=n_budget, threads=THREADS)
    assert bufs.to_trees()[:3] == ref.build_trees(lp, ids, 5)
    per_tree = cuda.to_device(np.array([7, 0, 12], np.int32))             # a budget a tree
    kn.build_trees(lp, ids, 12, out=bufs, budget_device=per_tree, threads=THREADS)
    assert bufs.to_trees()[:3] == [ref.build_tree(lp[s], ids[s], b) for s, b in enumerate((7, 0, 12))]
    with pytest.raises(ValueError, match="budget_device holds 2 budgets; give 1, or one a tree"):
        kn.build_trees(lp, ids, 12, out=bufs, budget_device=cuda.to_device(np.array([1, 2], np.int32)))
    with pytest.raises(ValueError, match="out holds 4 trees of 16 nodes"):
        kn.build_trees(np.concatenate([lp, lp]), np.concatenate([ids, ids]), 12, out=bufs)


@pytest.mark.parametrize("fn", [ref.build_trees, kn.build_trees])
def test_batch_bad_input_is_refused(rng, fn):
    lp, ids = _batch(rng, 2, 2, 6, 4)
    with pytest.raises(ValueError, match="lp must be 3-D"):
        fn(lp[0], ids[0], 4)
    with pytest.raises(ValueError, match="ids has shape"):
        fn(lp, ids[:, :, :3], 4)
    bad = lp.copy()
    bad[1] = -bad[1]
    with pytest.raises(ValueError, match="sequence 1: lp must be log-probabilities"):
        fn(bad, ids, 4)


def _peaked_draft(rng, L=15, V=64, k=20):
    """A drafter's usual shape: one or two likely tokens a depth over a flat tail."""
    x = (rng.standard_normal((L, V)) * 2.0).astype(np.float32)
    for d in range(L):
        x[d, rng.choice(V, 3, replace=False)] += np.float32([9.0, 6.0, 4.0])
    return ref.topk_logprobs(x, k)


def test_level_build_filters_by_its_running_bound_and_selects_only_where_it_must():
    """Most levels keep the children scoring >= the running bound tau (the B-th best score kept so
    far: no selection); a level with more than B of them selects; the build stops at the first
    empty level. Each way gives the heap build's tree, and both ways occur here without the seed
    (so the kernel test below covers both). With it the seed is computed once, before the first
    level that would select, and fewer levels select (none here)."""
    rng = np.random.default_rng(1)            # drafts where both ways occur
    for budget in (8, 20, 40):
        lp, ids = _peaked_draft(rng, k=budget)
        trace = []
        tree = ref.build_tree_levels(lp, ids, budget, trace=trace, seed=False)
        assert_same_tree(tree, ref.build_tree(lp, ids, budget))
        assert "select" in trace and trace.count("filter") >= 2, trace
        assert len(trace) == min(lp.shape[0], tree.depths.max() + 1), "the build went on past an empty level"
        seeded = []
        assert_same_tree(ref.build_tree_levels(lp, ids, budget, trace=seeded), tree)
        assert seeded.count("seed") == 1 and seeded.count("select") < trace.count("select"), seeded
        assert seeded.index("seed") == trace.index("select")


def _family_nodes(lp):
    """Every node of ``family_count``'s family, by brute force over rank paths: one deviation from
    the chain (rank r at depth d, zeros below it) or the chain itself; their scores in path order."""
    L, K = lp.shape
    out = []
    for d in range(L):
        for e in range(d, L):
            for r in range(0 if e == d else 1, K):
                path = [0] * d + [r] + [0] * (e - d)
                s = 0.0
                for i, q in enumerate(path):
                    s = s + float(lp[i, q])
                out.append(s)
    return np.array(out)


def test_seed_family_counts_and_seed_against_brute_force():
    """``family_count`` == a count over the family enumerated path by path (so every counted node is
    a real node, scored as the heap scores it); ``family_seed`` has at least budget of them at or
    above it (so it is at most the tree's budget-th best score), and no family value between it
    and the next candidate would do much better: it is within one last-round step of the largest
    valid value. Ties included."""
    rng = np.random.default_rng(5)
    for trial in range(30):
        L, K = int(rng.integers(1, 7)), int(rng.integers(1, 9))
        lp, _ = ref.topk_logprobs(rng.standard_normal((L, 40)).astype(np.float32) * 3, K)
        if trial % 5 == 0:
            lp[:, K // 2:] = lp[:, K // 2:K // 2 + 1]          # ties
        lp64 = lp.astype(np.float64)
        fam = _family_nodes(lp64)
        v = np.unique(np.r_[fam, fam - 1e-9, 0.5, -np.inf])
        np.testing.assert_array_equal(tb.family_count(lp64, K, v), (fam[:, None] >= v[None, :]).sum(axis=0))
        for budget in (1, 3, 10, 40):
            seed = tb.family_seed(lp64, K, budget)
            if fam.shape[0] < budget:
                assert seed == -np.inf
                continue
            assert (fam >= seed).sum() >= budget
            best = np.sort(fam)[::-1][budget - 1]               # the largest valid value
            assert seed <= best
            span = lp64[0, 0] - fam.min()                       # the search's first interval
            assert best - seed <= span / tb.SEED_CANDIDATES ** tb.SEED_ROUNDS * 1.01 + 1e-12, (seed, best)
            tree = ref.build_tree(lp, np.zeros_like(lp, np.int32), budget)
            assert seed <= tree.scores[-1]


@pytest.mark.kernels
def test_level_kernel_filters_and_selects_as_the_twin_does():
    """With and without the seed: the same tree, and the seed the kernel computed (``LevelScratch.seed``)
    is the twin's. Below ``SEED_FROM`` nodes the default build computes no seed."""
    rng = np.random.default_rng(1)
    for budget in (8, 20):
        lp, ids = _peaked_draft(rng, k=budget)
        trace = []
        want = ref.build_tree_levels(lp, ids, budget, trace=trace, seed=False)
        assert "select" in trace and "filter" in trace
        scratch = kn.LevelScratch.allocate(lp.shape[0], budget)
        assert kn.build_tree_levels(lp, ids, budget, threads=THREADS, seed=False, scratch=scratch) == want
        assert scratch.seed.copy_to_host()[0] == -np.inf
        assert kn.build_tree_levels(lp, ids, budget, threads=THREADS, seed=True, scratch=scratch) == want
        R = min(lp.shape[1], budget)               # the kernel's seed is the twin's, bit for bit
        assert scratch.seed.copy_to_host()[0] == tb.family_seed(lp.astype(np.float64)[:, :R], R, budget)
        fresh = kn.LevelScratch.allocate(lp.shape[0], budget)
        assert budget < kn.tree_build.SEED_FROM
        assert kn.build_tree_levels(lp, ids, budget, threads=THREADS, scratch=fresh) == want
        assert fresh.seed.copy_to_host()[0] == -np.inf


# -- the warp kernel's GPU path, in the simulator with an emulated warp ---------------------------

def _gpu_branch(monkeypatch, *factories):
    """The tree-build module with its GPU branches on, in emulated warps (tests/warp_emulation.py)."""
    from warp_emulation import gpu_branch
    return gpu_branch(monkeypatch, importlib.import_module("ddtree_numba.kernels.tree_build"), *factories)


@pytest.mark.kernels
@pytest.mark.parametrize("redux", [True, False])
def test_warp_kernels_gpu_path_matches_the_twin_in_an_emulated_warp(rng, monkeypatch, redux):
    """The GPU branch of the warp build (shuffles, a ballot of the tied lanes, redux), which the
    simulator otherwise never runs, in an emulated warp with numba's int32 ballot: on the first
    H100 run (forty-first session) trees of more than 31 slots came out wrong, because an int32
    ballot with lane 31 set sign-extended in ``tied & (tied - 1)`` and the tie loop visited
    phantom lanes 32..63, one of which could win a pop no lane owned. Drafts where lane 31 wins
    pops: many ranks at few depths, budgets past 32 slots."""
    with _gpu_branch(monkeypatch, "_build_tree_warp_kernel") as tbk:
        monkeypatch.setattr(tbk, "WARP_REDUX", redux)
        for L, V, budget, kind in [(3, 64, 64, "normal"), (2, 40, 60, "normal"), (3, 12, 50, "ties")]:
            lp, ids = _draft(rng, L, V, min(budget, V), kind)
            assert kn.build_tree(lp, ids, budget, method="warp") == ref.build_tree(lp, ids, budget), (L, V, budget)


@pytest.mark.kernels
@pytest.mark.parametrize("threads", [32, 64])
def test_block_heap_kernels_gpu_path_matches_the_twin_in_an_emulated_warp(rng, monkeypatch, threads):
    """The block heap kernel's GPU branch (each warp's arg-max by a shuffle minimum of order keys,
    its tied lanes by path, thread 0 over the warps), which the simulator otherwise never runs,
    in emulated warps, on drafts of exact ties and past 31 slots a warp."""
    with _gpu_branch(monkeypatch, "_build_tree_kernel"):
        for L, V, budget, kind in [(3, 64, 80, "normal"), (6, 12, 64, "ties"), (3, 12, 50, "ties")]:
            lp, ids = _draft(rng, L, V, min(budget, V), kind)
            got = kn.build_tree(lp, ids, budget, method="block", threads=threads)
            assert got == ref.build_tree(lp, ids, budget), (L, V, budget)


@pytest.mark.kernels
@pytest.mark.parametrize("threads", [32, 64])
def test_level_kernels_gpu_path_matches_the_twin_in_an_emulated_warp(rng, monkeypatch, threads):
    """The level build's GPU branch (its prefix sums by warp scans, its block counts by warp sums)
    in emulated warps, on drafts that filter, select and tie, with the few-ties placement and the
    preorder one (tie_slots 0)."""
    with _gpu_branch(monkeypatch, "_build_tree_levels_kernel"):
        for L, V, budget, kind in [(4, 40, 60, "normal"), (5, 6, 40, "ties"), (3, 9, 50, "ties")]:
            lp, ids = _draft(rng, L, V, min(budget, V), kind)
            want = ref.build_tree(lp, ids, budget)
            for tie_slots in (None, 0):
                got = kn.build_tree_levels(lp, ids, budget, threads=threads, tie_slots=tie_slots)
                assert got == want, (L, V, budget, tie_slots)
