"""generate() on the cuda backend: greedy DDTree and the DFlash chain equal greedy autoregressive
decoding token for token, with the cuda target (and the cuda DFlash drafter), and equal the numpy
backend's tokens; with a device drafter every round stays on the GPU (decode.device).

The simulator runs a few rounds of one golden checkpoint; on a GPU the same checks run on every
golden checkpoint with longer generations.
"""

import os

import numpy as np
import pytest
from numba import cuda

import ddtree_numba as dd
from ddtree_numba.model.cuda_drafter import CudaDrafter

from conftest import REAL_GPU, load_cuda_target
from test_decode import NoisyOracle, _prompt
from test_generate_batch import Oracles

pytestmark = pytest.mark.kernels


DATA = os.path.join(os.path.dirname(__file__), "data")
CHECKPOINTS = ["v3_noaux_tc", "v2_greedy_f16", "kimi_fp8", "v3_bf16_tied", "v3_neox_yarn_nolora"] \
    if REAL_GPU else ["v3_noaux_tc"]
N_NEW = 40 if REAL_GPU else 4
# The simulator spends ~20 s on a forward: there, one DDTree run against the numpy backend's
# tokens (prefill + two rounds); the rest on a GPU.
METHODS = [("ddtree", 8), ("dflash", 1)] if REAL_GPU else [("ddtree", 8)]


@pytest.mark.gpu   # the simulator runs the GPU-resident loop below; this is the host loop on cuda
@pytest.mark.parametrize("name", CHECKPOINTS)
def test_greedy_ddtree_on_cuda_equals_autoregressive_on_both_backends(name):
    path = os.path.join(DATA, name)
    host, gpu = dd.load_target(path), load_cuda_target(path)
    prompt = _prompt(1, host.config.vocab_size, n=5)
    want = dd.generate(host, None, prompt, N_NEW, method="ar").tokens          # numpy backend
    if REAL_GPU:
        np.testing.assert_array_equal(dd.generate(gpu, None, prompt, N_NEW, method="ar").tokens, want)
    seq = np.concatenate([prompt, want]).astype(np.int32)
    feats = host.forward(seq, np.arange(len(seq), dtype=np.int32), host.new_cache(len(seq)),
                         hidden_layer_ids=(0, 1)).hidden                       # [P + n, 2, M]
    lengths = []
    for method, budget in METHODS:
        oracle = NoisyOracle(seq, feats, host.config.vocab_size, 0.9 if not REAL_GPU else 0.7, seed=3)
        res = dd.generate(gpu, oracle, prompt, N_NEW, method=method, budget=budget)
        assert res.loop == "host"                      # a numpy drafter: the host drives the rounds
        np.testing.assert_array_equal(res.tokens, want, err_msg=f"{name} {method}")
        lengths += res.acceptance_lengths.tolist()
    assert max(lengths) >= 3, lengths                  # multi-token acceptance was exercised


@pytest.mark.gpu
def test_the_golden_drafter_runs_on_cuda_and_drives_ddtree_to_the_ar_tokens():
    path = os.path.join(DATA, "v3_noaux_tc")
    gpu = load_cuda_target(path)
    drafter = dd.load_drafter(os.path.join(DATA, "drafters", "dflash_v3_noaux_tc"), gpu)
    assert isinstance(drafter, CudaDrafter)
    prompt = _prompt(2, 96, n=5)
    ar = dd.generate(gpu, None, prompt, N_NEW, method="ar").tokens
    res = dd.generate(gpu, drafter, prompt, N_NEW, method="ddtree", budget=8)
    np.testing.assert_array_equal(res.tokens, ar)
    assert res.drafter_forwards == len(res.acceptance_lengths) > 0


class DeviceOracle(NoisyOracle):
    """The noisy oracle behind ``draft_device``, so the GPU-resident loop runs with controlled
    acceptance: it reads the device features and bonus back (tests only) and returns device
    logits. Its cache length lives on the host, advanced by the device count n."""

    backend = "cuda"                   # it implements model.protocols.DeviceDrafter

    def draft_device(self, features, n, bonus, cache, *, graph=False, stream=0):
        stream.synchronize()
        k = int(n.copy_to_host()[0])
        y = len(self.target_layer_ids)
        feats = features[:k].copy_to_host().reshape(k, y, -1)
        logits = self.draft(feats, int(bonus.copy_to_host()[0]), cache)
        return cuda.to_device(logits, stream=stream)


def _oracle_run(prompt_seed, prompt_len, n_new):
    """The v3_noaux_tc golden on both backends, a prompt, its ar tokens on numpy, the features of
    the whole sequence, and a DeviceOracle factory (right with probability 0.9)."""
    path = os.path.join(DATA, "v3_noaux_tc")
    host, gpu = dd.load_target(path), load_cuda_target(path)
    prompt = _prompt(prompt_seed, host.config.vocab_size, n=prompt_len)
    want = dd.generate(host, None, prompt, n_new, method="ar").tokens
    seq = np.concatenate([prompt, want]).astype(np.int32)
    feats = host.forward(seq, np.arange(len(seq), dtype=np.int32), host.new_cache(len(seq)),
                         hidden_layer_ids=(0, 1)).hidden
    return gpu, prompt, want, lambda seed: DeviceOracle(seq, feats, host.config.vocab_size, 0.9, seed=seed)


def test_the_gpu_resident_round_equals_autoregressive_and_accepts_many_tokens():
    """Every round on the GPU (draft -> top-K -> build -> verify -> accept -> compaction ->
    drafter features); the host reads back only the accepted tokens."""
    n_new = 40 if REAL_GPU else 6
    gpu, prompt, want, oracle = _oracle_run(1, 5, n_new)
    res = dd.generate(gpu, oracle(5), prompt, n_new, method="ddtree", budget=8)
    assert res.loop == "device" and res.stage_clock == ("cuda_events" if REAL_GPU else "host_after_sync")
    np.testing.assert_array_equal(res.tokens, want)
    assert res.acceptance_lengths.max() >= 3, res.acceptance_lengths   # multi-token rounds
    assert res.target_forwards == 1 + len(res.acceptance_lengths) < n_new
    assert res.stage_times["verify"] > 0 and res.stage_times["draft"] > 0
    if REAL_GPU:
        for method in ("ar", "dflash"):
            np.testing.assert_array_equal(dd.generate(gpu, oracle(6), prompt, n_new, method=method).tokens, want)


def test_the_gpu_resident_round_with_the_level_build_equals_autoregressive(monkeypatch):
    """From decode.device.LEVEL_BUILD_FROM nodes a round builds its tree with the level kernel (the
    heap kernel's tree, bit for bit): forced on at a small budget, the tokens are still ar's."""
    import ddtree_numba.decode.device as device
    monkeypatch.setattr(device, "LEVEL_BUILD_FROM", 1)
    builds = []
    level_build = device.kn.build_tree_levels
    monkeypatch.setattr(device.kn, "build_tree_levels", lambda *a, **kw: builds.append(1) or level_build(*a, **kw))
    n_new = 24 if REAL_GPU else 3
    gpu, prompt, want, oracle = _oracle_run(2, 4, n_new)
    res = dd.generate(gpu, oracle(3), prompt, n_new, method="ddtree", budget=6)
    assert res.loop == "device" and len(builds) == len(res.acceptance_lengths)
    np.testing.assert_array_equal(res.tokens, want)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")
def test_the_gpu_loop_refuses_non_finite_logits():
    """A target whose first layer overflows: the GPU-resident loop (which never copies the logits
    to the host) flags them at the prefill instead of sampling garbage."""
    from ddtree_numba.kernels import TILES
    from ddtree_numba.model import ModelConfig, random_target
    from ddtree_numba.model.cuda_target import CudaTarget
    host = random_target(ModelConfig.tiny(), seed=1)
    host.layers[0].o_proj = np.full_like(host.layers[0].o_proj, 3e38)
    gpu = CudaTarget.from_host(host, gemm_tile=None if REAL_GPU else TILES["small"])
    with pytest.raises(ValueError, match="target forward: its logits in the prefill are not finite"):
        dd.generate(gpu, None, np.array([1, 2, 3], np.int32), 4, method="ar")


def test_the_gpu_loop_refuses_a_drafter_whose_logits_go_non_finite():
    """The drafter's logits stay on the device in the GPU loop: a NaN there used to make garbage
    trees silently (the tokens stay right, acceptance collapses). The round's flags name it."""
    from ddtree_numba.kernels import TILES
    from ddtree_numba.model import ModelConfig, random_target
    from ddtree_numba.model.cuda_target import CudaTarget
    host = random_target(ModelConfig.tiny(), seed=1)
    gpu = CudaTarget.from_host(host, gemm_tile=None if REAL_GPU else TILES["small"])
    prompt = np.array([1, 2, 3], np.int32)
    feats = host.forward(prompt, np.arange(3, dtype=np.int32), host.new_cache(3), hidden_layer_ids=(0, 1)).hidden

    class NaNOracle(DeviceOracle):
        def draft(self, features, bonus, cache):
            cache.length += features.shape[0]
            return np.full((self.block_size - 1, self.vocab), np.nan, np.float32)

    oracle = NaNOracle(prompt, feats, host.config.vocab_size, 0.9, seed=1, block_size=4)
    with pytest.raises(ValueError, match="drafter forward: its logits in round 1 are not finite"):
        dd.generate(gpu, oracle, prompt, 6, budget=4)


@pytest.mark.gpu   # several prompts through the cuda target's forward_batch (slow in the simulator)
def test_generate_batch_on_cuda_gives_each_sequence_its_ar_tokens():
    path = os.path.join(DATA, "v3_noaux_tc")
    host, gpu = dd.load_target(path), load_cuda_target(path)
    prompts = [_prompt(i, host.config.vocab_size, n=4 + 2 * i) for i in range(3)]
    batch = dd.generate_batch(gpu, None, prompts, 12, method="ar")
    for p, res in zip(prompts, batch):
        np.testing.assert_array_equal(res.tokens, dd.generate(host, None, p, 12, method="ar").tokens)
    on_host = dd.generate_batch(host, None, prompts, 12, method="ar")      # one forward a round there too
    assert [r.unique_experts.tolist() for r in batch.rounds] == [r.unique_experts.tolist() for r in on_host.rounds]


@pytest.mark.gpu   # the simulator cannot capture graphs
def test_the_round_graph_replays_the_eager_rounds_bit_for_bit(monkeypatch):
    """Each round captured as one CUDA graph (decode.device.DeviceRound) and replayed: the same
    tokens, acceptance and tree sizes as eager rounds, for every method, at T = 0 and T > 0 (the
    round's seed is computed on the device), on a first call (round 1 eager, then captured) and
    on a second call (the kept graph replayed from round 1); greedy tokens equal ar's. Only two
    configurations are kept, so the second prompt finds them dropped and made again (a demo
    sweep of nine configurations once replayed a dropped cache's prefill graph)."""
    import ddtree_numba.decode.device as device
    monkeypatch.setattr(device, "KEPT_ROUNDS", 2)
    target_dir, drafter_dir = dd.demo_pair()
    gpu = dd.load_target(target_dir, backend="cuda", progress=False)
    drafter = dd.load_drafter(drafter_dir, gpu)
    from ddtree_numba.demo import demo_metadata
    prompts = [p["ids"] for p in demo_metadata()["prompts"][:2]]
    for prompt in prompts:
        ar = dd.generate(gpu, None, prompt, 48, method="ar", graph=False).tokens
        for method, budget, temperature in [("ar", 1, 0.0), ("dflash", 1, 0.0), ("ddtree", 16, 0.0),
                                            ("ddtree", 64, 0.0), ("ddtree", 16, 0.8),
                                            ("ddtree", device.LEVEL_BUILD_FROM, 0.0)]:   # the level build
            kw = dict(method=method, budget=budget, temperature=temperature, seed=7)
            d = None if method == "ar" else drafter
            eager = dd.generate(gpu, d, prompt, 48, graph=False, **kw)
            for call, graph in enumerate((True, True, "stages")):
                res = dd.generate(gpu, d, prompt, 48, graph=graph, **kw)
                what = f"{method} {budget} T={temperature} call {call}"
                np.testing.assert_array_equal(res.tokens, eager.tokens, err_msg=what)
                np.testing.assert_array_equal(res.acceptance_lengths, eager.acceptance_lengths, err_msg=what)
                np.testing.assert_array_equal(res.tree_sizes, eager.tree_sizes, err_msg=what)
                assert (res.stage_times["round"] > 0) == (graph is True), what
                assert any(graph in r.graphs for r in device._ROUNDS[gpu].values()), what   # replayed, not eager
                if temperature == 0:
                    np.testing.assert_array_equal(res.tokens, ar, err_msg=what)
            assert eager.stage_times["round"] == 0 and eager.stage_times["verify"] > 0


def test_graph_true_is_refused_where_a_round_cannot_be_captured():
    path = os.path.join(DATA, "v3_noaux_tc")
    gpu = load_cuda_target(path)
    oracle = DeviceOracle(np.arange(12, dtype=np.int32), np.zeros((12, 2, gpu.config.hidden_size), np.float32),
                          gpu.config.vocab_size, 0.9, seed=1)
    with pytest.raises(ValueError, match="graph=True needs a real GPU"):
        dd.generate(gpu, oracle, np.array([1, 2, 3], np.int32), 2, budget=4, graph=True)


@pytest.mark.slow
def test_a_kept_configuration_serves_the_next_call_from_a_clean_state():
    """The device loop keeps a configuration's caches and round state for later calls with the
    same sizes (a GPU replays its captured round from the first): every call starts clean
    (caches, round number, seeds and report reset at the prefill) and the configuration is
    reused, not rebuilt. ar at T > 0 draws the host loop's tokens (the round's seed made on the
    device); ddtree with a cache that ends exactly at the last token (8 rows, a power of two:
    nothing to spare) clips its trees as the host loop does and keeps ar's tokens. One dense
    layer, two calls each: the simulator spends seconds a forward."""
    import dataclasses
    from ddtree_numba.decode import device
    from ddtree_numba.kernels import TILES
    from ddtree_numba.model import ModelConfig, random_drafter, random_target
    from ddtree_numba.model.cuda_target import CudaTarget
    host = random_target(dataclasses.replace(ModelConfig.tiny(), num_hidden_layers=1), seed=2)
    gpu = CudaTarget.from_host(host, precision="fp32", gemm_tile=None if REAL_GPU else TILES["small"])
    prompts = [np.array([5, 9, 2, 7, 1], np.int32), np.array([1, 3, 3, 8, 4], np.int32)]

    def calls(drafter, order, **kw):
        """The prompts in ``order`` through one kept configuration: (prompt, result) pairs."""
        out, kept = [], []
        for i in order:
            res = dd.generate(gpu, drafter, prompts[i], 3, **kw)
            assert res.loop == "device"
            out.append((prompts[i], res))
            kept.append(set(map(id, device._ROUNDS[gpu].values())))
        assert all(k == kept[0] for k in kept), "the configuration was rebuilt between calls"
        return out

    for p, res in calls(None, (1, 0), method="ar", temperature=0.7, seed=11):
        want = dd.generate(host, None, p, 3, method="ar", temperature=0.7, seed=11)
        np.testing.assert_array_equal(res.tokens, want.tokens)
    # block 6 (L = 5 depths) at budget 3: the device round asks the drafter for 3 depths only
    # (decode.device.tree_depths), the host loop reads 3 of its 5 rows: the same trees
    d_host, d_gpu = random_drafter(host, block_size=6, seed=3), random_drafter(gpu, block_size=6, seed=3)
    for p, res in calls(d_gpu, (1, 0), method="ddtree", budget=3, max_tokens=8):
        want = dd.generate(host, d_host, p, 3, method="ddtree", budget=3, max_tokens=8)
        np.testing.assert_array_equal(res.tokens, dd.generate(host, None, p, 3, method="ar").tokens)
        np.testing.assert_array_equal(res.tree_sizes, want.tree_sizes)
        np.testing.assert_array_equal(res.acceptance_lengths, want.acceptance_lengths)
        assert want.tree_sizes.min() < 3, want.tree_sizes       # the cache's end did clip the trees
    assert {r.lp.shape[0] for r in device._ROUNDS[gpu].values() if r.method == "ddtree"} == {3}


def test_rounds_launched_ahead_commit_the_tokens_of_one_at_a_time(monkeypatch):
    """The device loop launches the next round before it reads this one's report (rounds in
    flight): the tokens are the host loop's, each round's report is read from its own buffer,
    a round launched ahead is never counted, and when a stop token ends the generation with a
    round in flight that round is waited for and the configuration serves the next call. ar on
    a one-layer target (one token a round, so rounds run ahead from the first)."""
    import dataclasses
    from ddtree_numba.decode import device
    from ddtree_numba.kernels import TILES
    from ddtree_numba.model import ModelConfig, random_target
    from ddtree_numba.model.cuda_target import CudaTarget
    host = random_target(dataclasses.replace(ModelConfig.tiny(), num_hidden_layers=1), seed=7)
    gpu = CudaTarget.from_host(host, precision="fp32", gemm_tile=None if REAL_GPU else TILES["small"])
    launched = []
    enqueue = device.DeviceRound.enqueue_round
    monkeypatch.setattr(device.DeviceRound, "enqueue_round",
                        lambda self, *a, **k: (launched.append(1), enqueue(self, *a, **k))[1])
    prompt = np.array([4, 8, 15, 16], np.int32)
    want = dd.generate(host, None, prompt, 4, method="ar").tokens
    assert len(set(want.tolist())) == 4                  # distinct tokens: a report read twice shows
    res = dd.generate(gpu, None, prompt, 4, method="ar", graph=False)
    np.testing.assert_array_equal(res.tokens, want)
    assert len(launched) == res.target_forwards - 1 == 3   # every round read; none ran past the end
    assert res.stage_times["verify"] > 0 and res.stage_times["accept"] > 0    # finished rounds timed
    launched.clear()                                       # the 2nd token (round 1's bonus) stops it,
    res = dd.generate(gpu, None, prompt, 4, method="ar", stop_token_ids=[int(want[1])], graph=False)
    np.testing.assert_array_equal(res.tokens, want[:2])    # with round 2 already launched
    assert res.stopped and len(launched) == res.target_forwards == 2  # round 2 ran, unread
    if REAL_GPU:        # (the simulator runs one launch at a time: nothing is ever in flight there)
        res = dd.generate(gpu, None, prompt, 4, method="ar")             # the same configuration, clean
        np.testing.assert_array_equal(res.tokens, want)


class DeviceOracles(Oracles):
    """``Oracles`` of ``DeviceOracle``s: the batched GPU round's device drafter. A slot with no new
    context rows (a finished sequence, whose draft is not read) gets background logits."""

    backend = "cuda"

    def draft_device(self, features, n, bonus, cache, *, graph=False, stream=0):
        stream.synchronize()
        if int(n.copy_to_host()[0]) == 0:
            return cuda.to_device(np.zeros((self.block_size - 1, cache.owner.vocab), np.float32), stream=stream)
        return cache.owner.draft_device(features, n, bonus, cache, stream=stream)


@pytest.mark.slow
def test_the_gpu_resident_batch_gives_each_sequence_its_ar_tokens():
    """generate_batch on a cuda target with a device drafter: every round of every sequence on the
    GPU (decode.device_batch: one verify forward over the live slots' packed rows), each sequence
    its own ar tokens; a stop token ends one sequence early and its slot costs no verify row after;
    a round launched ahead with no live slot left is harmless."""
    n_new = 24 if REAL_GPU else 8               # (at least two rounds: 5 tokens a round at most)
    runs = [_oracle_run(seed, 4 + 2 * seed, n_new) for seed in (1, 2)]
    gpu = runs[0][0]
    prompts, wants = [r[1] for r in runs], [r[2] for r in runs]
    drafter = DeviceOracles([r[3](11 + i) for i, r in enumerate(runs)])
    stop = int(wants[1][1])                       # the second sequence stops at its second token
    batch = dd.generate_batch(gpu, drafter, prompts, n_new, method="ddtree", budget=4, stop_token_ids=[stop])
    for i, (res, want) in enumerate(zip(batch, wants)):
        assert res.loop == "device"
        k = list(want).index(stop) + 1 if stop in want else n_new
        np.testing.assert_array_equal(res.tokens, want[:k], err_msg=f"sequence {i}")
    assert batch[1].stopped and len(batch[1].tokens) == 2
    assert len(batch.rounds) >= 2 and batch.rounds[-1].sequences == 1      # the first goes on alone
    for k, rnd in enumerate(batch.rounds):       # the rows of the live sequences' trees only
        live = [r for r in batch if len(r.tree_sizes) > k]
        assert rnd.sequences == len(live)
        assert rnd.rows == sum(int(r.tree_sizes[k]) + 1 for r in live)
        assert rnd.accepted == sum(int(r.acceptance_lengths[k]) for r in live)
        assert rnd.unique_experts.max() > 0
    # rounds run one ahead (the device ends sequences itself): the second prompt alone, by ar (the
    # cheap round), stops in its first round, so the round launched ahead of it has no live slot
    # and verifies no row (on a GPU, the kept configuration's second call replays its graph from
    # round 1, so rounds run ahead there too)
    for _ in range(2 if REAL_GPU else 1):
        alone = dd.generate_batch(gpu, None, prompts[1:], n_new, method="ar", stop_token_ids=[stop])
        np.testing.assert_array_equal(alone[0].tokens, wants[1][:2])
        assert len(alone.rounds) == 1 and alone[0].stopped


@pytest.mark.gpu   # the golden drafter's batch: ~100 s a call in the simulator (checked there by hand)
def test_the_gpu_resident_batch_with_the_golden_drafter_keeps_its_configuration():
    """generate_batch with a CudaDrafter: each sequence its ar tokens and the acceptance of its own
    generate; a second call replays the kept configuration (caches reset, the round's graph on a
    GPU) with the same results, and eager rounds (graph=False) give the same too."""
    from ddtree_numba.decode import device_batch
    gpu = load_cuda_target(os.path.join(DATA, "v3_noaux_tc"))
    drafter = dd.load_drafter(os.path.join(DATA, "drafters", "dflash_v3_noaux_tc"), gpu)
    n_new = N_NEW if REAL_GPU else 3
    prompts = [_prompt(2, 96, n=5), _prompt(3, 96, n=7), _prompt(4, 96, n=4)]
    ar = [dd.generate(gpu, None, p, n_new, method="ar").tokens for p in prompts]
    solo = [dd.generate(gpu, drafter, p, n_new, method="ddtree", budget=4).acceptance_lengths for p in prompts]
    runs = [dd.generate_batch(gpu, drafter, prompts, n_new, method="ddtree", budget=4) for _ in range(2)]
    runs.append(dd.generate_batch(gpu, drafter, prompts, n_new, method="ddtree", budget=4, graph=False))
    for batch in runs:
        for res, want, acc in zip(batch, ar, solo):
            assert res.loop == "device"
            np.testing.assert_array_equal(res.tokens, want)
            np.testing.assert_array_equal(res.acceptance_lengths, acc)
    assert len(device_batch._BATCH_ROUNDS[gpu]) == 1          # one configuration served every call


@pytest.mark.slow
def test_the_gpu_resident_batch_draws_at_t_above_0_what_each_sequence_draws_alone():
    """At T > 0 the batched device round draws each sequence's own tokens: its prefill's draw of
    every slot's last prompt row (one launch over the slots) and each round's draws. ar as the
    host loop draws them; ddtree as the device loop of that prompt alone does (the same drafter
    bits: drafts are batch invariant). One dense layer, prompts of two lengths."""
    import dataclasses
    from ddtree_numba.kernels import TILES
    from ddtree_numba.model import ModelConfig, random_drafter, random_target
    from ddtree_numba.model.cuda_target import CudaTarget
    host = random_target(dataclasses.replace(ModelConfig.tiny(), num_hidden_layers=1), seed=2)
    gpu = CudaTarget.from_host(host, precision="fp32", gemm_tile=None if REAL_GPU else TILES["small"])
    prompts = [np.array([5, 9, 2, 7, 1], np.int32), np.array([1, 3, 8], np.int32)]
    kw = dict(temperature=0.7, seed=11)
    batch = dd.generate_batch(gpu, None, prompts, 3, method="ar", **kw)
    for p, res in zip(prompts, batch):
        assert res.loop == "device"
        np.testing.assert_array_equal(res.tokens, dd.generate(host, None, p, 3, method="ar", **kw).tokens)
    drafter = random_drafter(gpu, block_size=6, seed=3)       # L = 5: the packed draft of 3 depths a slot
    batch = dd.generate_batch(gpu, drafter, prompts, 4, method="ddtree", budget=3, **kw)
    for p, res in zip(prompts, batch):
        solo = dd.generate(gpu, drafter, p, 4, method="ddtree", budget=3, **kw)
        assert res.loop == solo.loop == "device"
        np.testing.assert_array_equal(res.tokens, solo.tokens)


@pytest.mark.slow
def test_a_kept_configuration_starts_its_drafter_from_an_empty_cache():
    """The drafter's device prefill empties its cache on the device (the loops no longer reset it
    from the host): a second call of a kept configuration, single or batched, leaves the drafter
    cache holding exactly what the first call left, the prompt and the accepted tokens (a stale
    cache would hold both calls' rows), and gives the same rounds. GPU against GPU, so the GEMMs
    take bf16 (one mma a product where 'fp32' takes three: half the simulator's time)."""
    import dataclasses
    from ddtree_numba.decode import device, device_batch
    from ddtree_numba.kernels import TILES
    from ddtree_numba.model import ModelConfig, random_drafter, random_target
    from ddtree_numba.model.cuda_target import CudaTarget
    host = random_target(dataclasses.replace(ModelConfig.tiny(), num_hidden_layers=1), seed=4)
    gpu = CudaTarget.from_host(host, precision="bf16", gemm_tile=None if REAL_GPU else TILES["small"])
    drafter = random_drafter(gpu, block_size=4, seed=5)
    prompts = [np.array([5, 9, 2, 7, 1], np.int32), np.array([1, 3, 8, 6], np.int32)]
    runs, lengths = [], []
    for _ in range(2):
        runs.append(dd.generate(gpu, drafter, prompts[0], 3, method="ddtree", budget=3))
        (dr,) = device._ROUNDS[gpu].values()
        lengths.append(dr.dcache.length)
    assert runs[0].loop == "device" and lengths[0] == lengths[1] > len(prompts[0])
    np.testing.assert_array_equal(runs[0].tokens, runs[1].tokens)
    np.testing.assert_array_equal(runs[0].acceptance_lengths, runs[1].acceptance_lengths)
    runs, lengths = [], []
    for _ in range(2):
        runs.append(dd.generate_batch(gpu, drafter, prompts, 3, method="ddtree", budget=3))
        (br,) = device_batch._BATCH_ROUNDS[gpu].values()
        lengths.append(br.dpool.lengths.tolist())
    assert lengths[0] == lengths[1] and min(lengths[0]) >= 4
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a.tokens, b.tokens)
