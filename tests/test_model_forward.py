"""The numpy reference forward against HF transformers' logits (goldens from tools/make_goldens.py).

Every case under tests/data/ is a tiny random checkpoint HF's own DeepseekV3ForCausalLM /
DeepseekV2ForCausalLM produced; see that script for what each covers.
"""

import os

import numpy as np
import pytest

import ddtree_numba as dd
from ddtree_numba.model import target as target_mod
from ddtree_numba.model.compare import assert_close
from ddtree_numba.reference import mla_attention_naive

DATA = os.path.join(os.path.dirname(__file__), "data")
CASES = sorted(d for d in os.listdir(DATA) if os.path.exists(os.path.join(DATA, d, "expected.npz")))
RTOL = 1e-4


def test_the_goldens_cover_what_the_issue_asks_for():
    cfgs = {c: dd.ModelConfig.from_json(os.path.join(DATA, c)) for c in CASES}
    assert len(cfgs) >= 7
    seen = {(c.scoring_func, c.topk_method) for c in cfgs.values()}
    assert {("softmax", "greedy"), ("softmax", "group_limited_greedy"), ("sigmoid", "noaux_tc")} <= seen
    assert {c.rope_interleave for c in cfgs.values()} == {True, False}
    assert any(c.rope_scaling is not None for c in cfgs.values())
    assert {c.q_lora_rank is None for c in cfgs.values()} == {True, False}
    assert any(c.first_k_dense_replace > 0 for c in cfgs.values())
    assert {c.model_type for c in cfgs.values()} == {"deepseek_v2", "deepseek_v3", "kimi_k2"}
    assert any(c.weight_block_size for c in cfgs.values())
    assert any(c.int4_group_size for c in cfgs.values())
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(DATA) for f in fs)
    assert total < 3 << 20


@pytest.fixture(scope="module", params=CASES)
def case(request):
    path = os.path.join(DATA, request.param)
    return request.param, dd.load_target(path), np.load(os.path.join(path, "expected.npz")), \
        np.load(os.path.join(path, "tree.npz"))


def _all_layers(target):
    return tuple(range(target.config.num_hidden_layers))


def test_causal_forward_matches_hf(case):
    name, target, exp, _ = case
    cache = target.new_cache(32)
    cache.c_kv[:] = np.nan                            # poisoned: only rows written are read
    cache.k_pe[:] = np.nan
    out = target.forward(exp["ids"], exp["positions"], cache, hidden_layer_ids=_all_layers(target))
    assert out.logits.dtype == np.float32 and out.hidden.dtype == np.float32
    assert_close(out.logits, exp["logits"], RTOL, f"{name} logits")
    assert_close(out.hidden, exp["hidden"], RTOL, f"{name} hidden")
    assert (out.logits.argmax(-1) == exp["logits"].argmax(-1)).all()
    assert len(cache) == len(exp["ids"])


def test_chunked_forward_through_the_cache_matches_hf(case):
    name, target, exp, _ = case
    cache = target.new_cache(len(exp["ids"]))         # exactly full at the end
    bounds = [0, 3, 4, 9, len(exp["ids"])]
    logits, hidden = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        out = target.forward(exp["ids"][a:b], exp["positions"][a:b], cache, hidden_layer_ids=(0, target.config.num_hidden_layers - 1))
        logits.append(out.logits)
        hidden.append(out.hidden)
    assert_close(np.concatenate(logits), exp["logits"], RTOL, f"{name} chunked logits")
    assert_close(np.concatenate(hidden), exp["hidden"][:, [0, -1]], RTOL, f"{name} chunked hidden")
    assert (np.concatenate(logits).argmax(-1) == exp["logits"].argmax(-1)).all()
    assert cache.free == 0


def test_tree_forward_matches_causal_hf_over_each_root_to_node_path(case):
    name, target, _, tree = case
    cache = target.new_cache(32)
    target.forward(tree["prefix_ids"], tree["prefix_positions"], cache)
    out = target.forward(tree["tree_ids"], tree["tree_positions"], cache, parents=tree["parents"],
                         hidden_layer_ids=_all_layers(target))
    assert_close(out.logits, tree["logits"], RTOL, f"{name} tree logits")
    assert_close(out.hidden, tree["hidden"], RTOL, f"{name} tree hidden")
    assert (out.logits.argmax(-1) == tree["logits"].argmax(-1)).all()


def _path(parents, i):
    path = []
    while i >= 0:
        path.append(i)
        i = parents[i]
    return path[::-1]


def test_compacted_cache_continues_like_the_accepted_path(case):
    """Verify a tree, keep one root-to-leaf path (docs/DESIGN.md §1, step 7), then feed the leaf again:
    its logits must be HF's for prefix + path, i.e. the compacted rows are the path's rows."""
    name, target, _, tree = case
    parents = tree["parents"]
    leaf = int(np.argmax([len(_path(parents, i)) for i in range(len(parents))]))
    keep = np.array(_path(parents, leaf), dtype=np.int32)
    cache = target.new_cache(32)
    start = len(tree["prefix_ids"])
    target.forward(tree["prefix_ids"], tree["prefix_positions"], cache)
    target.forward(tree["tree_ids"], tree["tree_positions"], cache, parents=parents)
    cache.compact(start, keep)
    assert len(cache) == start + len(keep)
    cache.truncate(start + len(keep) - 1)             # drop the leaf, then recompute it
    cache.c_kv[:, len(cache):] = np.nan               # the stale tree rows must not be read
    cache.k_pe[:, len(cache):] = np.nan
    out = target.forward(tree["tree_ids"][leaf:leaf + 1], tree["tree_positions"][leaf:leaf + 1], cache)
    assert_close(out.logits[0], tree["logits"][leaf], RTOL, f"{name} after compaction")


def test_naive_mla_forward_also_matches_hf(case, monkeypatch):
    """The whole forward with the naive (expanded K / V) attention instead of the absorbed one."""
    name, target, exp, _ = case
    monkeypatch.setattr(target_mod, "mla_attention_absorbed", mla_attention_naive)
    out = target.forward(exp["ids"], exp["positions"], target.new_cache(32))
    assert_close(out.logits, exp["logits"], RTOL, f"{name} naive-MLA logits")


def test_parents_none_equals_a_chain_tree(case):
    name, target, exp, _ = case
    chain = np.arange(-1, len(exp["ids"]) - 1, dtype=np.int32)
    a = target.forward(exp["ids"], exp["positions"], target.new_cache(32))
    b = target.forward(exp["ids"], exp["positions"], target.new_cache(32), parents=chain)
    np.testing.assert_array_equal(a.logits, b.logits)
