"""load_target / forward / the latent cache: API shape and every bad-input path."""

import os

import numpy as np
import pytest

import ddtree_numba as dd
from ddtree_numba.model import MLACache

DATA = os.path.join(os.path.dirname(__file__), "data")


@pytest.fixture(scope="module")
def target():
    return dd.load_target(os.path.join(DATA, "v3_noaux_tc"), backend="numpy")


def _ids(n, v=96):
    return (np.arange(n, dtype=np.int32) * 7) % v


def test_config_cache_and_output_shapes(target):
    cfg = target.config
    assert isinstance(cfg, dd.ModelConfig) and target.backend == "numpy"
    cache = target.new_cache(10)
    assert cache.c_kv.shape == (cfg.num_hidden_layers, 10, cfg.kv_lora_rank)
    assert cache.k_pe.shape == (cfg.num_hidden_layers, 10, cfg.qk_rope_head_dim)
    out = target.forward(_ids(4), np.arange(4), cache, hidden_layer_ids=(2, 0))
    assert out.logits.shape == (4, cfg.vocab_size) and out.logits.dtype == np.float32
    assert out.hidden.shape == (4, 2, cfg.hidden_size) and out.hidden.dtype == np.float32
    assert target.forward(_ids(1), np.array([4]), cache).hidden.shape == (1, 0, cfg.hidden_size)
    assert len(cache) == 5 and cache.free == 5
    with pytest.raises(Exception):
        out.logits = None                                     # results are frozen


def test_hidden_layer_ids_pick_layer_outputs(target):
    a = target.forward(_ids(3), np.arange(3), target.new_cache(3), hidden_layer_ids=(0, 1, 2))
    b = target.forward(_ids(3), np.arange(3), target.new_cache(3), hidden_layer_ids=(2, 0))
    np.testing.assert_array_equal(b.hidden[:, 0], a.hidden[:, 2])
    np.testing.assert_array_equal(b.hidden[:, 1], a.hidden[:, 0])


def test_backend_and_weight_dtype_checks(monkeypatch):
    from numba import config as numba_config
    from numba import cuda
    from ddtree_numba.model.loader import BackendUnavailable
    monkeypatch.setattr(numba_config, "ENABLE_CUDASIM", False)
    monkeypatch.setattr(cuda, "is_available", lambda: False)
    with pytest.raises(BackendUnavailable, match="needs a CUDA GPU"):
        dd.load_target(os.path.join(DATA, "v3_noaux_tc"), backend="cuda")
    with pytest.raises(ValueError, match="weight_dtype applies to backend='cuda' only"):
        dd.load_target(os.path.join(DATA, "v3_noaux_tc"), weight_dtype="bfloat16")
    with pytest.raises(ValueError, match="backend must be one of"):
        dd.load_target(os.path.join(DATA, "v3_noaux_tc"), backend="tpu")


@pytest.mark.parametrize("ids, positions, words", [
    (np.arange(3, dtype=np.float32), np.arange(3), "ids must have dtype"),
    (np.zeros((2, 2), np.int32), np.arange(2), "ids must be 1-D"),
    (np.array([1, 96, 2]), np.arange(3), "token id 96 is out of range"),
    (np.array([1, -1, 2]), np.arange(3), "token id -1 is out of range"),
    (np.zeros(0, np.int32), np.zeros(0, np.int32), "ids is empty"),
    (_ids(3), np.arange(4), "positions has 4 entries but ids has 3"),
    (_ids(3), np.array([0, -1, 2]), "positions must be >= 0"),
    (_ids(3), np.arange(3, dtype=np.float64), "positions must have dtype"),
    ([1, 2, 3], np.arange(3), "ids must be an array"),
])
def test_bad_ids_and_positions(target, ids, positions, words):
    cache = target.new_cache(8)
    with pytest.raises(ValueError, match=words):
        target.forward(ids, positions, cache)
    assert len(cache) == 0


@pytest.mark.parametrize("parents, words", [
    (np.array([-1, 0, 1], np.int64), "parents must have dtype int32"),
    (np.array([-1, 0], np.int32), "parents has shape"),
    (np.array([0, 0, 1, 2], np.int32), r"parents\[0\] must be -1"),
    (np.array([-1, 0, 2, 1], np.int32), r"parents\[2\] = 2"),
])
def test_bad_parents(target, parents, words):
    with pytest.raises(ValueError, match=words):
        target.forward(_ids(4), np.arange(4), target.new_cache(8), parents=parents)


def test_bad_hidden_layer_ids_and_cache(target):
    with pytest.raises(ValueError, match="hidden_layer_ids entry must be <= 2"):
        target.forward(_ids(2), np.arange(2), target.new_cache(8), hidden_layer_ids=(3,))
    with pytest.raises(ValueError, match="cache must be an MLACache"):
        target.forward(_ids(2), np.arange(2), {"rows": []})
    other = dd.load_target(os.path.join(DATA, "v2_group_yarn"))
    with pytest.raises(ValueError, match="different model config"):
        target.forward(_ids(2), np.arange(2), other.new_cache(8))
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        target.new_cache(0)


def test_cache_refuses_to_grow_past_capacity(target):
    cache = target.new_cache(6)
    with pytest.raises(ValueError, match="cache overflow: 0 rows \\+ 7 new exceeds capacity 6"):
        target.forward(_ids(7), np.arange(7), cache)
    target.forward(_ids(4), np.arange(4), cache)
    before = cache.c_kv.copy()
    with pytest.raises(ValueError, match="cache overflow: 4 rows \\+ 3 new exceeds capacity 6"):
        target.forward(_ids(3), np.arange(4, 7), cache)
    assert len(cache) == 4
    np.testing.assert_array_equal(cache.c_kv, before)        # nothing written on refusal


def test_truncate_and_compact_checks(target):
    cache = target.new_cache(8)
    target.forward(_ids(6), np.arange(6), cache)
    with pytest.raises(ValueError, match="length must be <= 6"):
        cache.truncate(7)
    with pytest.raises(ValueError, match="keep must be strictly increasing"):
        cache.compact(2, np.array([0, 2, 2], np.int32))
    with pytest.raises(ValueError, match="keep must have dtype int32"):
        cache.compact(2, np.array([0, 2], np.int64))
    with pytest.raises(ValueError, match=r"keep\[-1\] = 4 points past"):
        cache.compact(2, np.array([0, 4], np.int32))
    rows = cache.c_kv[:, :6].copy()
    cache.compact(2, np.array([0, 2, 3], np.int32))
    assert len(cache) == 5
    np.testing.assert_array_equal(cache.c_kv[:, :5], rows[:, [0, 1, 2, 4, 5]])
    cache.truncate(1)
    assert len(cache) == 1 and isinstance(cache, MLACache)


def test_truncate_then_recompute_gives_the_same_logits(target):
    cache = target.new_cache(8)
    a = target.forward(_ids(5), np.arange(5), cache)
    cache.truncate(3)
    b = target.forward(_ids(5)[3:], np.arange(3, 5), cache)
    np.testing.assert_allclose(b.logits, a.logits[3:], rtol=0, atol=1e-5 * np.abs(a.logits).max())


def test_random_target_runs_trees_like_paths():
    """On a random (non-golden) model too, a tree node's logits are those of its path."""
    from ddtree_numba.model import random_target
    t = random_target(dd.ModelConfig.tiny(num_hidden_layers=3, first_k_dense_replace=1), seed=3)
    rng = np.random.default_rng(0)
    prefix = rng.integers(0, 64, 4).astype(np.int32)
    parents = np.array([-1, 0, 0, 1, 2, 3, 3], np.int32)
    depth = np.zeros(7, np.int32)
    for i in range(1, 7):
        depth[i] = depth[parents[i]] + 1
    toks = rng.integers(0, 64, 7).astype(np.int32)
    cache = t.new_cache(16)
    t.forward(prefix, np.arange(4), cache)
    tree = t.forward(toks, 4 + depth, cache, parents=parents).logits
    for i in range(7):
        path = [i]
        while parents[path[-1]] >= 0:
            path.append(int(parents[path[-1]]))
        path = path[::-1]
        ids = np.concatenate([prefix, toks[path]])
        ref = t.forward(ids, np.arange(len(ids)), t.new_cache(16)).logits[-1]
        np.testing.assert_allclose(tree[i], ref, rtol=0, atol=1e-5 * np.abs(ref).max())


def test_resolve_backend_says_why(monkeypatch):
    from numba import config as numba_config
    from numba import cuda

    from ddtree_numba.model.loader import BackendUnavailable, resolve_backend
    monkeypatch.setattr(numba_config, "ENABLE_CUDASIM", False)
    monkeypatch.setattr(cuda, "is_available", lambda: False)
    choice = resolve_backend("auto")
    assert (choice.backend, choice.reason) == ("numpy", "no CUDA GPU found")
    with pytest.raises(BackendUnavailable, match="needs a CUDA GPU"):
        resolve_backend("cuda")
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    assert resolve_backend("auto").backend == "cuda" and resolve_backend("numpy").backend == "numpy"
    monkeypatch.setattr(numba_config, "ENABLE_CUDASIM", True)
    choice = resolve_backend("auto")
    assert choice.backend == "numpy" and "simulator" in choice.reason
    assert resolve_backend("cuda").backend == "cuda"                 # the simulator runs the kernels
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("tpu")


def test_the_numpy_models_implement_the_protocols():
    from ddtree_numba.model import DeviceDrafter, DeviceTarget, Drafter, Target, random_drafter
    from ddtree_numba.model.protocols import TargetCache
    target = dd.load_target(os.path.join(DATA, "v3_noaux_tc"))
    drafter = random_drafter(target)
    assert isinstance(target, Target) and isinstance(drafter, Drafter)
    assert isinstance(target.new_cache(4), TargetCache) and target.backend == drafter.backend == "numpy"
    assert not isinstance(target, DeviceTarget) and not isinstance(drafter, DeviceDrafter)
    assert isinstance(target.new_cache(4).length, int)
