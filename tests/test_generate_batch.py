"""generate_batch(): every sequence of a batch gives exactly what ``generate`` gives it alone
(greedy: its own autoregressive tokens; sampled: the same draws), sequences of different lengths
that finish at different rounds, one verify forward for all live sequences with the router's
unique experts counted over the batch, and bad input."""

import os

import numpy as np
import pytest

import ddtree_numba as dd
from ddtree_numba.model import ModelConfig, random_drafter, random_target
from ddtree_numba.model.target import Segment

from test_decode import DATA, NoisyOracle, _greedy, _prompt

N_NEW = 24


class Oracles:
    """One ``NoisyOracle`` per sequence behind one drafter: ``generate_batch`` makes the drafter
    caches in the prompts' order, so the i-th cache belongs to the i-th oracle."""

    backend = "numpy"

    def __init__(self, oracles):
        self.oracles, self.made = oracles, 0
        self.block_size, self.target_layer_ids = oracles[0].block_size, oracles[0].target_layer_ids

    def new_cache(self, max_tokens):
        cache = self.oracles[self.made].new_cache(max_tokens)
        cache.owner = self.oracles[self.made]
        self.made += 1
        return cache

    def draft(self, features, bonus, cache):
        return cache.owner.draft(features, bonus, cache)


@pytest.fixture(scope="module", params=["v3_noaux_tc", "kimi_int4"])
def target(request):
    return dd.load_target(os.path.join(DATA, request.param), backend="numpy")


def test_each_sequence_equals_its_own_greedy_decoding(target):
    """Three prompts of different lengths: ddtree (two budgets), dflash and ar batched give every
    sequence its own ar tokens, the same rounds as that prompt alone, and one verify forward a
    round over all live sequences."""
    vocab = target.config.vocab_size
    prompts = [_prompt(i, vocab, n=4 + 3 * i) for i in range(3)]
    alone = [_greedy(target, p, N_NEW) for p in prompts]                   # (tokens, seq, feats)
    for method, budget in [("ddtree", 12), ("ddtree", 3), ("dflash", 1), ("ar", 1)]:
        def oracles():
            return [NoisyOracle(seq, feats, vocab, 0.7, seed=7 * i + budget) for i, (_, seq, feats) in enumerate(alone)]
        drafter = None if method == "ar" else Oracles(oracles())
        batch = dd.generate_batch(target, drafter, prompts, N_NEW, method=method, budget=budget)
        assert isinstance(batch, list) and len(batch) == 3
        for i, res in enumerate(batch):
            np.testing.assert_array_equal(res.tokens, alone[i][0], err_msg=f"{method} {budget} sequence {i}")
            solo = dd.generate(target, None if method == "ar" else oracles()[i], prompts[i], N_NEW,
                               method=method, budget=budget)
            np.testing.assert_array_equal(res.acceptance_lengths, solo.acceptance_lengths)
            assert res.target_forwards == solo.target_forwards
        assert len(batch.rounds) == max(len(r.acceptance_lengths) for r in batch)
        for k, rnd in enumerate(batch.rounds):        # a round verifies every live sequence's tree at once
            live = [r for r in batch if len(r.tree_sizes) > k]
            assert rnd.sequences == len(live)
            assert rnd.rows == sum(int(r.tree_sizes[k]) + 1 for r in live)
            assert rnd.accepted == sum(int(r.acceptance_lengths[k]) for r in live)
            moe = [i for i, lw in enumerate(target.layers) if lw.gate is not None]
            assert all(0 < rnd.unique_experts[i] <= target.config.n_routed_experts for i in moe)
            assert all(rnd.unique_experts[i] == 0 for i in range(len(target.layers)) if i not in moe)


def test_sequences_finish_independently(target):
    """A stop token ends one sequence early; the others go on, and the finished one costs nothing
    more (it is in no later round)."""
    vocab = target.config.vocab_size
    prompts = [_prompt(i, vocab, n=5 + i) for i in range(3)]
    ar = [dd.generate(target, None, p, N_NEW, method="ar").tokens for p in prompts]
    stop = int(ar[1][4])                              # sequence 1 stops at its 5th token (or earlier)
    batch = dd.generate_batch(target, None, prompts, N_NEW, method="ar", stop_token_ids=[stop])
    for i, res in enumerate(batch):
        want = ar[i][:list(ar[i]).index(stop) + 1] if stop in ar[i] else ar[i]
        np.testing.assert_array_equal(res.tokens, want)
        assert res.target_forwards == len(want)
    assert batch[1].stopped and len(batch[1].tokens) <= 5
    assert [r.sequences for r in batch.rounds][-1] < 3
    assert sum(r.sequences for r in batch.rounds) == sum(len(r.tokens) - 1 for r in batch)


def test_sampled_sequences_draw_what_they_draw_alone():
    """At T > 0 a sequence's draws are a function of (seed, its round, node, token): batched or
    alone, the same tokens."""
    target = random_target(ModelConfig.tiny(), seed=3)
    drafter = random_drafter(target, block_size=5, seed=4)
    prompts = [np.arange(3 + 2 * i, dtype=np.int32) % target.config.vocab_size for i in range(3)]
    batch = dd.generate_batch(target, drafter, prompts, 16, budget=8, temperature=0.9, seed=11)
    for p, res in zip(prompts, batch):
        solo = dd.generate(target, drafter, p, 16, budget=8, temperature=0.9, seed=11)
        np.testing.assert_array_equal(res.tokens, solo.tokens)


def test_a_batched_forward_equals_each_sequence_alone():
    """forward_batch's outputs are each segment's forward alone (the block-diagonal visibility),
    and its caches hold what a lone forward writes."""
    target = random_target(ModelConfig.tiny(), seed=5)
    rng = np.random.default_rng(0)
    V = target.config.vocab_size
    segs, solo = [], []
    for n, tree in [(5, None), (3, np.array([-1, 0, 0, 1], np.int32)), (4, np.array([-1, 0, 1], np.int32))]:
        prefix = rng.integers(0, V, n).astype(np.int32)
        caches = []
        for _ in range(2):
            c = target.new_cache(16)
            target.forward(prefix, np.arange(n, dtype=np.int32), c)
            caches.append(c)
        t = 4 if tree is None else len(tree)
        ids = rng.integers(0, V, t).astype(np.int32)
        depth = np.zeros(t, np.int32) if tree is None else np.array([0] + [1] * (t - 1), np.int32)
        pos = (n + (np.arange(t) if tree is None else depth)).astype(np.int32)
        segs.append(Segment(ids, pos, caches[0], tree))
        solo.append(target.forward(ids, pos, caches[1], parents=tree, hidden_layer_ids=(0,)))
    out = target.forward_batch(segs, hidden_layer_ids=(0,))
    for seg, got, want, in zip(segs, out.outputs, solo):
        np.testing.assert_allclose(got.logits, want.logits, rtol=2e-5, atol=2e-5)
        np.testing.assert_allclose(got.hidden, want.hidden, rtol=2e-5, atol=2e-5)
        assert seg.cache.length == len(seg.ids) + int(seg.positions.min())


def test_bad_batches_are_refused():
    target = random_target(ModelConfig.tiny(), seed=1)
    with pytest.raises(ValueError, match="prompts is empty"):
        dd.generate_batch(target, None, [], 4, method="ar")
    with pytest.raises(ValueError, match="prompts must be a list"):
        dd.generate_batch(target, None, np.arange(3, dtype=np.int32), 4, method="ar")
    with pytest.raises(ValueError, match=r"prompts\[1\]: prompt token id"):
        dd.generate_batch(target, None, [np.arange(3), np.array([1, 10**6])], 4, method="ar")
    with pytest.raises(ValueError, match="graph is for a batch whose rounds run on the GPU"):
        dd.generate_batch(target, None, [np.arange(3)], 4, method="ar", graph=True)
    cache = target.new_cache(8)
    ids = np.arange(2, dtype=np.int32)
    with pytest.raises(ValueError, match="shares its cache"):
        target.forward_batch([Segment(ids, ids, cache), Segment(ids, ids, cache)])
    with pytest.raises(ValueError, match="non-empty list of Segment"):
        target.forward_batch([])
