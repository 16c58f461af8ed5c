"""generate(): greedy DDTree and DFlash-chain == greedy autoregressive, token for token, on the
golden checkpoints; stop tokens and max_new_tokens exactly; bad input; and at T > 0 the
distribution of the first tokens against the target's own (chi-square), with a wrong
acceptance rule shown to fail the same test."""

import os

import numpy as np
import pytest
from scipy.stats import chi2

import ddtree_numba as dd
import ddtree_numba.decode as decode
import ddtree_numba.decode.host as host_loop
from ddtree_numba.model import ModelConfig
from ddtree_numba.model import random_drafter, random_target
from ddtree_numba.reference.accept import uniform_open

DATA = os.path.join(os.path.dirname(__file__), "data")
CHECKPOINTS = ["v3_noaux_tc", "v2_greedy_f16", "kimi_fp8", "kimi_int4", "v3_bf16_tied", "v3_neox_yarn_nolora"]
N_NEW = 40


class NoisyOracle:
    """A test drafter that knows the target's greedy continuation ``seq`` (prompt included).

    At depth d after a bonus at position ``start`` it puts the right token ``seq[start + d]`` at
    rank 0 with probability ``p``, else at rank 1, 2 or 3, with random tokens elsewhere, so
    DDTree sees accepted paths of every length and acceptance off the first branch. It also
    checks that the loop feeds it exactly the target's hidden features of the committed tokens.
    """

    backend = "numpy"                  # its draft() takes and returns numpy (model.protocols.Drafter)

    def __init__(self, seq, features, vocab, p, seed, block_size=6, target_layer_ids=(0, 1)):
        self.seq, self.features, self.vocab, self.p = list(seq), features, vocab, p
        self.rng = np.random.default_rng(seed)
        self.block_size, self.target_layer_ids = block_size, target_layer_ids
        self.placed = []                                                   # (start, depth, rank)

    class _Cache:
        def __init__(self):
            self.length = 0

    def new_cache(self, max_tokens):
        return self._Cache()

    def draft(self, features, bonus, cache):
        s0, n = cache.length, features.shape[0]
        assert features.shape[1:] == self.features.shape[1:]
        # the features of these positions (a cuda target's 'fp32' GEMMs: within ~5e-5 of float32)
        np.testing.assert_allclose(features, self.features[s0:s0 + n], rtol=1e-3, atol=1e-3)
        cache.length = start = s0 + n
        assert bonus == self.seq[start]
        L = self.block_size - 1
        logits = self.rng.standard_normal((L, self.vocab)).astype(np.float32)   # [L, V] background
        for d in range(1, L + 1):
            others = self.rng.permutation(self.vocab)
            if start + d < len(self.seq):
                right = self.seq[start + d]
                rank = 0 if self.rng.random() < self.p else int(self.rng.integers(1, 4))
                others = others[others != right]
                top = np.insert(others[:3], rank, right)                    # 4 tokens, right at `rank`
                self.placed.append((start, d, rank))
            else:
                top = others[:4]
            logits[d - 1, top] = np.float32([12.0, 11.0, 10.0, 9.0])
        return logits


def _greedy(target, prompt, n):
    res = dd.generate(target, None, prompt, n, method="ar")
    assert res.target_forwards == n and (res.acceptance_lengths == 1).all()
    seq = np.concatenate([prompt, res.tokens]).astype(np.int32)
    feats = target.forward(seq, np.arange(len(seq), dtype=np.int32), target.new_cache(len(seq)),
                           hidden_layer_ids=(0, 1)).hidden                 # [P + n, 2, M]
    return res.tokens, seq, feats


def _prompt(i, vocab, n=7):
    return ((np.arange(n) * (7 + i) + 3 * i) % vocab).astype(np.int32)


@pytest.fixture(scope="module", params=CHECKPOINTS)
def target(request):
    return dd.load_target(os.path.join(DATA, request.param), backend="numpy")


def test_greedy_ddtree_and_dflash_equal_autoregressive(target):
    vocab = target.config.vocab_size
    lengths, off_branch, saved = [], 0, []
    for i, p in enumerate([0.9, 0.6, 0.3]):
        prompt = _prompt(i, vocab, n=5 + 2 * i)
        ar, seq, feats = _greedy(target, prompt, N_NEW)
        for method, budget in [("ddtree", 16), ("ddtree", 3), ("dflash", 1)]:   # (dflash: unused)
            oracle = NoisyOracle(seq, feats, vocab, p, seed=10 * i + budget)
            res = dd.generate(target, oracle, prompt, N_NEW, method=method, budget=budget, trace=True)
            np.testing.assert_array_equal(res.tokens, ar, err_msg=f"{method} budget {budget} p {p}")
            assert res.target_forwards == 1 + len(res.acceptance_lengths)
            assert res.drafter_forwards == len(res.acceptance_lengths)
            assert res.acceptance_lengths.sum() >= N_NEW - 1
            if method == "ddtree":
                lengths += res.acceptance_lengths.tolist()
                saved.append(res.forwards_saved)
                for tr in res.traces:
                    off_branch += int((tr.tree.ranks[tr.keep[1:] - 1] > 0).any())
            else:
                assert (res.tree_sizes <= oracle.block_size - 1).all()
        rand = dd.generate(target, random_drafter(target, block_size=5, seed=i), prompt, N_NEW,
                           method="ddtree", budget=8)
        np.testing.assert_array_equal(rand.tokens, ar)
    lengths = np.asarray(lengths)
    # the tests must have seen long accepted paths and acceptance off the first branch
    assert lengths.max() >= 5 and (lengths >= 3).sum() >= 5, lengths
    assert off_branch >= 5, off_branch
    assert min(saved) > 0, saved


def test_acceptance_statistics_of_a_good_drafter():
    """With p = 0.9 and budget 16 the tree almost always holds the whole block: mean acceptance
    length near the block size, forwards several times fewer than autoregressive."""
    target = dd.load_target(os.path.join(DATA, "v3_noaux_tc"))
    prompt = _prompt(0, 96)
    ar, seq, feats = _greedy(target, prompt, 60)
    res = dd.generate(target, NoisyOracle(seq, feats, 96, 0.9, seed=1), prompt, 60, budget=16)
    chain = dd.generate(target, NoisyOracle(seq, feats, 96, 0.9, seed=1), prompt, 60, method="dflash")
    np.testing.assert_array_equal(res.tokens, ar)
    np.testing.assert_array_equal(chain.tokens, ar)
    assert res.mean_acceptance_length > 4.5 and res.target_forwards <= 15
    assert res.mean_acceptance_length > chain.mean_acceptance_length
    np.testing.assert_array_equal(res.accepted_depths, res.acceptance_lengths - 1)
    text = res.summary(file=None)
    assert "mean acceptance length" in text and "forwards saved" in text and "tokens/s" in text
    assert set(res.stage_times) == set(decode.STAGES) and res.stage_times["verify"] > 0
    assert res.loop == "host" and res.stage_clock == "host" and res.stage_clock in decode.STAGE_CLOCKS


@pytest.fixture(scope="module")
def small():
    target = dd.load_target(os.path.join(DATA, "v3_noaux_tc"))
    prompt = _prompt(1, 96)
    ar, seq, feats = _greedy(target, prompt, 30)
    return target, prompt, ar, seq, feats


@pytest.mark.parametrize("method", ["ddtree", "dflash", "ar"])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 8, 13])
def test_max_new_tokens_is_exact(small, method, n):
    target, prompt, ar, seq, feats = small
    res = dd.generate(target, NoisyOracle(seq, feats, 96, 0.8, seed=n), prompt, n, method=method, budget=12)
    np.testing.assert_array_equal(res.tokens, ar[:n])
    assert res.tokens.dtype == np.int32 and not res.stopped
    assert res.target_forwards == (0 if n == 0 else 1 + len(res.acceptance_lengths))


@pytest.mark.parametrize("method", ["ddtree", "dflash", "ar"])
def test_stop_tokens_end_generation_as_autoregressive_would(small, method):
    target, prompt, ar, seq, feats = small
    absent = [t for t in range(96) if t not in ar][:2]
    for k in [0, 1, 4, 9, 17]:
        stop = int(ar[k])
        first = int(np.flatnonzero(ar == stop)[0])
        want = ar[:first + 1]
        res = dd.generate(target, NoisyOracle(seq, feats, 96, 0.8, seed=k), prompt, 30,
                          method=method, budget=12, stop_token_ids=[stop, absent[0]])
        np.testing.assert_array_equal(res.tokens, want)
        assert res.stopped
    res = dd.generate(target, NoisyOracle(seq, feats, 96, 0.8, seed=0), prompt, 30, method=method,
                      stop_token_ids=absent)
    np.testing.assert_array_equal(res.tokens, ar)
    assert not res.stopped


@pytest.mark.parametrize("budget", [1, 2, 200])
def test_budget_extremes_and_a_cache_with_no_spare_rows(small, budget):
    target, prompt, ar, seq, feats = small
    oracle = NoisyOracle(seq, feats, 96, 0.7, seed=budget)
    # max_tokens = prompt + new tokens exactly: trees shrink to the rows left, output unchanged
    res = dd.generate(target, oracle, prompt, 30, budget=budget, max_tokens=len(prompt) + 30, trace=True)
    np.testing.assert_array_equal(res.tokens, ar)
    assert (res.tree_sizes <= budget).all()
    for tr in res.traces:                                     # traces agree with the output
        got = [tr.bonus] + [int(tr.tree.tokens[j - 1]) for j in tr.keep[1:]]
        off = tr.start - len(prompt)
        np.testing.assert_array_equal(got[:30 - off], ar[off:off + len(got)])


def test_bad_input_raises(small):
    target, prompt, ar, seq, feats = small
    drafter = random_drafter(target)
    cases = [
        (dict(prompt_ids=np.zeros(0, np.int32)), "prompt_ids is empty"),
        (dict(prompt_ids=np.zeros((2, 3), np.int32)), "prompt_ids must be 1-D"),
        (dict(prompt_ids=np.array([1.0, 2.0])), "must hold integers"),
        (dict(prompt_ids=np.array([1, 96])), "prompt token id 96 is out of range"),
        (dict(max_tokens=len(prompt) - 1), "longer than the cache"),
        (dict(max_tokens=len(prompt) + 5), "exceed the cache"),
        (dict(method="beam"), "method must be one of"),
        (dict(budget=0), "budget must be >= 1"),
        (dict(temperature=-0.5), "temperature must be finite and >= 0"),
        (dict(temperature=float("nan")), "temperature must be finite and >= 0"),
        (dict(temperature=None), "temperature must be a number, got None"),
        (dict(temperature="0.5"), "temperature must be a number, got '0.5'"),   # (float() took it)
        (dict(temperature=True), "temperature must be a number"),
        (dict(prompt_ids=[1, 2**70]), f"prompt token id {2**70} is out of range"),   # (an object array)
        (dict(max_new_tokens=-1), "max_new_tokens must be >= 0"),
        (dict(drafter=None), "needs a drafter"),
        (dict(drafter=type("Undeclared", (), dict(block_size=4, target_layer_ids=(0,)))()),
         "the drafter must declare backend 'numpy' or 'cuda'"),
    ]
    for change, words in cases:
        kw = dict(target=target, drafter=drafter, prompt_ids=prompt, max_new_tokens=10)
        kw.update(change)
        with pytest.raises(ValueError, match=words):
            dd.generate(**kw)
    res = dd.generate(target, drafter, prompt, 4)
    np.testing.assert_array_equal(dd.generate(target, drafter, prompt.astype(object), 4).tokens, res.tokens)
    with pytest.raises(Exception):
        res.tokens = None                                     # results are frozen


# -- temperature > 0: the first generated tokens follow the target's own distribution -------

TEMPERATURE, SEEDS, FIRST = 1.5, 2500, 3


def _target_joint(target, prompt, depth):
    """Exact probabilities of every sequence of the next ``depth`` sampled tokens. -> {tuple: p}"""
    def probs(ids):
        out = target.forward(ids, np.arange(len(ids), dtype=np.int32), target.new_cache(len(ids)))
        z = out.logits[-1].astype(np.float64) / TEMPERATURE
        e = np.exp(z - z.max())
        return e / e.sum()

    joint = {(): 1.0}
    for _ in range(depth):
        nxt = {}
        for seq, p in joint.items():
            for t, q in enumerate(probs(np.concatenate([prompt, seq]).astype(np.int32))):
                nxt[seq + (t,)] = p * q
        joint = nxt
    return joint


def _chi_square(target, drafter, prompt, joint, method="ddtree", budget=24):
    counts = dict.fromkeys(joint, 0)
    deep = 0
    for seed in range(SEEDS):
        res = dd.generate(target, drafter, prompt, FIRST, method=method, budget=budget,
                          temperature=TEMPERATURE, seed=seed)
        counts[tuple(int(t) for t in res.tokens)] += 1
        deep += int(res.acceptance_lengths[0] == FIRST - 1)   # both later tokens from one verify
    cells = sorted(joint, key=joint.get, reverse=True)
    expected = np.array([joint[c] * SEEDS for c in cells])
    observed = np.array([counts[c] for c in cells], np.float64)
    big = expected >= 5                                        # pool the rare cells into one
    e = np.append(expected[big], expected[~big].sum())
    o = np.append(observed[big], observed[~big].sum())
    stat = float(((o - e) ** 2 / e).sum())
    return stat, chi2.ppf(1 - 1e-3, len(e) - 1), deep


@pytest.fixture(scope="module")
def tiny_vocab():
    target = random_target(ModelConfig.tiny(vocab_size=8), seed=1)
    drafter = random_drafter(target, block_size=4, seed=2)
    prompt = np.array([1, 2, 3], np.int32)
    return target, drafter, prompt, _target_joint(target, prompt, FIRST)


@pytest.mark.parametrize("method", ["ddtree", "dflash", "ar"])
def test_sampling_matches_the_target_distribution(tiny_vocab, method):
    target, drafter, prompt, joint = tiny_vocab
    stat, threshold, deep = _chi_square(target, drafter, prompt, joint, method=method)
    assert stat < threshold, (stat, threshold)
    if method == "ddtree":                                     # the tree did the work
        assert deep > SEEDS // 4, deep


def _shared_draws(logits, temperature, seed):
    """A wrong acceptance rule: every node reuses node 0's random draws."""
    if temperature == 0.0:
        return logits.argmax(axis=1).astype(np.int32)
    v = logits.shape[1]
    g = -np.log(-np.log(uniform_open(seed, np.zeros(v, np.int64), np.arange(v))))  # [V]
    return (logits.astype(np.float64) / temperature + g).argmax(axis=1).astype(np.int32)


def _child_compares_itself(tree, post):
    """A wrong acceptance rule: accept a child when its token equals the target's choice *at the
    child* (off by one) instead of at its parent."""
    keep = [0]
    for j in range(1, tree.num_nodes + 1):
        if tree.parents[j] == keep[-1] and tree.tokens[j - 1] == post[j]:
            keep.append(j)
    return np.asarray(keep, np.int32), int(post[keep[-1]])


@pytest.mark.parametrize("name, value", [("sample_post", _shared_draws), ("follow_tree", _child_compares_itself)])
def test_a_wrong_acceptance_rule_fails_the_chi_square_test(tiny_vocab, monkeypatch, name, value):
    target, drafter, prompt, joint = tiny_vocab
    monkeypatch.setattr(host_loop, name, value)
    stat, threshold, _ = _chi_square(target, drafter, prompt, joint)
    assert stat > 2 * threshold, (stat, threshold)


def test_the_golden_dflash_drafter_drives_all_methods_to_the_same_tokens():
    target = dd.load_target(os.path.join(DATA, "v3_noaux_tc"))
    drafter = dd.load_drafter(os.path.join(DATA, "drafters", "dflash_v3_noaux_tc"), target)
    prompt = _prompt(2, 96, n=9)
    ar = dd.generate(target, None, prompt, 25, method="ar").tokens
    for method in ("ddtree", "dflash"):
        res = dd.generate(target, drafter, prompt, 25, method=method, budget=32)
        np.testing.assert_array_equal(res.tokens, ar)
        assert res.drafter_forwards == len(res.acceptance_lengths) > 0
        assert res.tree_sizes.max() == (32 if method == "ddtree" else drafter.block_size - 1)


def test_summary_prints_once_and_says_what_a_cut_round_dropped(small, capsys):
    """In a notebook, ``res.summary()`` used to print and then echo its string; and a first round
    cut by max_new_tokens read "4 tokens in 2 target forwards, mean acceptance 6.00", "1 rounds"."""
    target, prompt, ar, seq, feats = small
    res = dd.generate(target, NoisyOracle(seq, feats, 96, 1.0, seed=0), prompt, 4, budget=16)
    assert len(res.acceptance_lengths) == 1 and res.acceptance_lengths[0] > 4   # the round accepted more
    assert res.summary() is None
    printed = capsys.readouterr().out
    assert printed.count("mean acceptance length") == 1 and "(1 round + the prefill)" in printed
    assert res.dropped == res.acceptance_lengths.sum() - 4
    assert f"({res.dropped} more were accepted past the end" in res.summary(file=None)
    full = dd.generate(target, NoisyOracle(seq, feats, 96, 1.0, seed=0), prompt, 30, budget=16)
    assert "rounds + the prefill" in full.summary(file=None)
    none = dd.generate(target, NoisyOracle(seq, feats, 96, 1.0, seed=0), prompt, 0)
    assert "0 tokens in 0 target forwards (nothing asked for)" in none.summary(file=None)


def test_results_models_and_trees_say_what_they_are(small):
    target, prompt, ar, seq, feats = small
    res = dd.generate(target, random_drafter(target), prompt, 6, budget=8, trace=True)
    assert repr(res).startswith("GenerationResult(ddtree: 6 tokens, ") and "host loop" in repr(res)
    assert "<table>" in res._repr_html_() and "mean acceptance length" in res._repr_html_()
    assert repr(target).startswith("NumpyTarget(deepseek_v3, 3 layers")
    assert repr(random_drafter(target)).startswith("NumpyDrafter(DFlash, 1 layer, block 8")
    tree = res.traces[0].tree
    assert tree._repr_html_().startswith("<pre>Tree(N=") and "node 1" in tree._repr_html_()
