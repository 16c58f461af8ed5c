"""The cuda-backend target forward: HF goldens, the numpy twin, batch invariance, graph == eager.

In CI this runs in the CUDA simulator on the tiny golden checkpoints; on a GPU the same tests run
on the hardware (plus the graph tests). The goldens come from tools/make_goldens.py (HF
transformers' own DeepseekV3 / V2 modules), as for the numpy backend in test_model_forward.py.
"""

import os

import numpy as np
import pytest

import ddtree_numba as dd
from ddtree_numba.model.compare import assert_close
from ddtree_numba.dtypes import to_bf16_bits
from ddtree_numba.model.cuda_target import CudaTarget, DeviceMLACache

from conftest import FP32_MODE_REL, REAL_GPU, load_cuda_target

pytestmark = pytest.mark.kernels


DATA = os.path.join(os.path.dirname(__file__), "data")
RTOL = 1e-4
# The simulator runs every GPU thread in Python: three goldens cover what the others do
# (q_lora and not, both rope layouts, YaRN, dense-first and all-MoE, sigmoid / noaux_tc and
# softmax / group-limited routing, bf16 and fp8 storage). On a GPU, all of them.
ALL = sorted(d for d in os.listdir(DATA) if os.path.exists(os.path.join(DATA, d, "expected.npz")))
CASES = ALL if REAL_GPU else ["v3_noaux_tc", "v3_neox_yarn_nolora", "v3_released"]
# Causal attention makes the goldens' first T logits those of the first T tokens alone: the
# simulator runs a prefix of them (every block barrier costs it milliseconds).
T = None if REAL_GPU else 8


@pytest.fixture(scope="module", params=CASES)
def case(request):
    path = os.path.join(DATA, request.param)
    target = load_cuda_target(path)
    return (request.param, target, np.load(os.path.join(path, "expected.npz")),
            np.load(os.path.join(path, "tree.npz")))


def _all_layers(target):
    return tuple(range(target.config.num_hidden_layers))


def test_load_target_cuda_keeps_the_checkpoint_dtype():
    t = load_cuda_target(os.path.join(DATA, "v3_released"))   # a bf16 checkpoint
    assert isinstance(t, CudaTarget) and t.backend == "cuda"
    assert t.layers[0].o_proj.dtype == np.uint16 and t.layers[0].input_layernorm.dtype == np.float32
    t = load_cuda_target(os.path.join(DATA, "v3_noaux_tc"))   # float32
    assert t.layers[0].o_proj.dtype == np.float32
    with pytest.raises(ValueError, match="weight_dtype must be one of"):
        load_cuda_target(os.path.join(DATA, "v3_noaux_tc"), weight_dtype="int8")


def test_fp8_checkpoint_stays_fp8_on_the_gpu_and_matches_hf():
    """An fp8 block-scaled checkpoint: the GPU keeps its matrices as stored (bytes + scales,
    multiplied by the GEMM as they are), and the forward still matches HF's (which dequantizes)."""
    from ddtree_numba.dtypes import BlockScaled
    path = os.path.join(DATA, "kimi_fp8")
    target = load_cuda_target(path)
    lw = target.layers[0]
    assert isinstance(lw.o_proj, BlockScaled) and lw.o_proj.data.dtype == np.uint8
    assert "float8_e4m3 block-scaled" in repr(target) and lw.input_layernorm.dtype == np.float32
    assert not isinstance(lw.w_uk_t, BlockScaled)      # its 16-row blocks straddle the 8-wide heads: dequantized
    exp = np.load(os.path.join(path, "expected.npz"))
    exp = {k: exp[k][:T] for k in exp}
    out = target.forward(exp["ids"], exp["positions"], target.new_cache(32))
    assert_close(out.logits, exp["logits"], RTOL, "kimi_fp8 cuda logits (fp8 kept)")
    plain = load_cuda_target(path, weight_dtype="float32")
    assert not isinstance(plain.layers[0].o_proj, BlockScaled) and "float8" not in repr(plain)
    with pytest.raises(ValueError, match="stores none in fp8"):
        load_cuda_target(os.path.join(DATA, "v3_released"), weight_dtype="float8")


def test_int4_checkpoint_stays_packed_on_the_gpu_and_matches_hf():
    """Kimi K2's compressed-tensors INT4 experts stay packed on the GPU (int32 words + bf16 group
    scales, the nibbles multiplied as they are), and the forward matches HF's on the dequantized weights."""
    from ddtree_numba.dtypes import Int4Grouped
    path = os.path.join(DATA, "kimi_int4")
    target = load_cuda_target(path)
    lw = target.layers[1]
    assert isinstance(lw.experts_down_proj, Int4Grouped) and lw.experts_down_proj.data.dtype == np.int32
    assert lw.experts_down_proj.scale.dtype == np.uint16        # bf16 group scales, as stored: never widened
    assert not isinstance(lw.shared_up_proj, Int4Grouped) and "int4 grouped + bfloat16" in repr(target)
    exp = np.load(os.path.join(path, "expected.npz"))
    exp = {k: exp[k][:T] for k in exp}
    out = target.forward(exp["ids"], exp["positions"], target.new_cache(32))
    assert_close(out.logits, exp["logits"], RTOL, "kimi_int4 cuda logits (int4 kept)")


def test_causal_forward_matches_hf(case):
    name, target, exp, _ = case
    exp = {k: exp[k][:T] for k in exp}
    cache = target.new_cache(32)
    cache.fill(np.nan)                                 # poisoned: only rows written are read
    out = target.forward(exp["ids"], exp["positions"], cache, hidden_layer_ids=_all_layers(target))
    assert out.logits.dtype == np.float32 and out.hidden.dtype == np.float32
    assert_close(out.logits, exp["logits"], RTOL, f"{name} cuda logits")
    assert_close(out.hidden, exp["hidden"], RTOL, f"{name} cuda hidden")
    assert (out.logits.argmax(-1) == exp["logits"].argmax(-1)).all()
    assert len(cache) == len(exp["ids"])


@pytest.mark.parametrize("name", CASES if REAL_GPU else CASES[:1])
def test_chunked_forward_through_the_cache_matches_hf(name):
    target = load_cuda_target(os.path.join(DATA, name))
    exp = np.load(os.path.join(DATA, name, "expected.npz"))
    exp = {k: exp[k][:T] for k in exp}
    cache = target.new_cache(len(exp["ids"]))          # exactly full at the end
    bounds = [0, 3, 4, len(exp["ids"])]
    logits = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        logits.append(target.forward(exp["ids"][a:b], exp["positions"][a:b], cache).logits)
    assert_close(np.concatenate(logits), exp["logits"], RTOL, f"{name} cuda chunked logits")
    assert cache.free == 0


def _path(parents, i):
    path = []
    while i >= 0:
        path.append(i)
        i = parents[i]
    return path[::-1]


def test_tree_forward_matches_hf_and_compaction_continues_the_path(case):
    name, target, _, tree = case
    parents = tree["parents"]
    cache = target.new_cache(32)
    cache.fill(np.nan)
    start = len(tree["prefix_ids"])
    target.forward(tree["prefix_ids"], tree["prefix_positions"], cache)
    out = target.forward(tree["tree_ids"], tree["tree_positions"], cache, parents=parents,
                         hidden_layer_ids=_all_layers(target))
    assert_close(out.logits, tree["logits"], RTOL, f"{name} cuda tree logits")
    assert_close(out.hidden, tree["hidden"], RTOL, f"{name} cuda tree hidden")
    # keep the deepest root-to-leaf path, then feed the leaf again over the compacted cache
    leaf = int(np.argmax([len(_path(parents, i)) for i in range(len(parents))]))
    keep = np.array(_path(parents, leaf), dtype=np.int32)
    cache.compact(start, keep)
    assert len(cache) == start + len(keep)
    cache.truncate(start + len(keep) - 1)
    again = target.forward(tree["tree_ids"][leaf:leaf + 1], tree["tree_positions"][leaf:leaf + 1], cache)
    assert_close(again.logits[0], tree["logits"][leaf], RTOL, f"{name} cuda after compaction")


def test_matches_the_numpy_twin_on_bf16_rounded_weights():
    """weight_dtype='bfloat16' stores every matrix in bf16: the numpy forward on the same
    rounded weights is the twin."""
    path = os.path.join(DATA, "v3_noaux_tc")
    host = dd.load_target(path)
    for lw in host.layers:                              # round the host copy the same way
        for k, v in vars(lw).items():
            if v is not None and v.ndim >= 2 and k != "gate":
                setattr(lw, k, (to_bf16_bits(v).astype(np.uint32) << 16).view(np.float32))
    for k in ("embed_tokens", "lm_head"):
        setattr(host, k, (to_bf16_bits(getattr(host, k)).astype(np.uint32) << 16).view(np.float32))
    gpu = load_cuda_target(path, weight_dtype="bfloat16")
    exp = np.load(os.path.join(path, "expected.npz"))
    ids, pos = exp["ids"][:T], exp["positions"][:T]
    want = host.forward(ids, pos, host.new_cache(16)).logits
    got = gpu.forward(ids, pos, gpu.new_cache(16)).logits
    assert_close(got, want, FP32_MODE_REL, "bf16 weights, fp32 GEMMs, vs numpy twin")


@pytest.mark.slow
def test_logits_are_batch_invariant_alone_in_a_batch_and_as_a_tree_node():
    """docs/DESIGN.md §4: a token's logits are the same *bits* decoded alone (one token per
    forward), inside a causal batch, and as a node of a tree whose ancestors are its path. In
    bf16, the GPU's default and half the simulator's time of 'fp32' (whose GEMMs'
    row-independence tests/test_linear_kernel.py holds at every tile)."""
    path = os.path.join(DATA, "v3_noaux_tc")
    target = load_cuda_target(path, precision="bf16")
    tree = np.load(os.path.join(path, "tree.npz"))
    prefix, parents = tree["prefix_ids"], tree["parents"]
    p = len(prefix)
    # as tree nodes
    cache = target.new_cache(32)
    target.forward(prefix, np.arange(p), cache)
    tree_logits = target.forward(tree["tree_ids"], tree["tree_positions"], cache, parents=parents).logits
    leaf = int(np.argmax([len(_path(parents, i)) for i in range(len(parents))]))
    nodes = _path(parents, leaf)
    ids = np.concatenate([prefix, tree["tree_ids"][nodes]]).astype(np.int32)
    # alone: one token per forward after the prefix (the simulator: only the last path token)
    first = p if REAL_GPU else len(ids) - 1
    cache = target.new_cache(32)
    target.forward(ids[:first], np.arange(first), cache)
    alone = [target.forward(ids[j:j + 1], np.array([j]), cache).logits[0] for j in range(first, len(ids))]
    # in a batch: prefix and path in one causal forward
    batch = target.forward(ids, np.arange(len(ids)), target.new_cache(32)).logits[first:]
    nodes = nodes[first - p:]
    for k, node in enumerate(nodes):
        np.testing.assert_array_equal(alone[k], batch[k], err_msg=f"path token {k}: alone vs batch")
        np.testing.assert_array_equal(alone[k], tree_logits[node], err_msg=f"node {node}: alone vs tree")


@pytest.mark.parametrize("q_lora", [True, False])    # q_a | kv_a stacked (the latents normed with q_a's), or q_proj
def test_a_batched_forward_gives_each_sequence_the_bits_of_its_own_forward(monkeypatch, q_lora):
    """``forward_batch``: a causal step and a tree, after caches of different lengths, in one
    forward, with separate caches and with two slots of one pool. Each one's logits, hidden states
    and new cache rows are bit for bit those of its own ``forward`` (the projections and the MoE
    over all rows, each sequence's cache writes and attention over its own rows and cache: the
    block-diagonal visibility); the unique routed experts are the numpy twin's
    (``NumpyTarget.forward_batch``) over the same rows. Two layers (dense, MoE): a pooled cache
    write lands in its own layer's rows."""
    from ddtree_numba.kernels import TILES
    from ddtree_numba.model import ModelConfig, random_target
    from ddtree_numba.model.target import Segment
    cfg = ModelConfig.tiny() if q_lora else ModelConfig.tiny(q_lora_rank=None)   # layer 0 dense, layer 1 MoE
    host = random_target(cfg, seed=6)
    target = CudaTarget.from_host(host, precision="bf16", gemm_tile=None if REAL_GPU else TILES["small"])
    rng = np.random.default_rng(3)
    V = target.config.vocab_size
    pool_obj = target.new_cache_pool(3, 12)
    for name in ("c_kv", "k_pe"):                            # poison: nothing but the new rows may be written
        arr = getattr(pool_obj, name)
        arr.copy_to_device(np.full(arr.shape, np.nan, np.float32))
    pool = pool_obj.caches                                   # slots 2 and 0: not in the segments' order
    segs, pooled, solo, host_segs = [], [], [], []
    for n, tree, slot in [(3, None, 2), (5, np.array([-1, 0, 0, 1], np.int32), 0)]:
        prefix = rng.integers(0, V, n).astype(np.int32)
        t = 2 if tree is None else len(tree)
        ids = rng.integers(0, V, t).astype(np.int32)
        pos = (n + (np.arange(t) if tree is None else np.array([0, 1, 1, 2]))).astype(np.int32)
        batched, alone, on_host = target.new_cache(12), target.new_cache(12), host.new_cache(12)
        target.forward(prefix, np.arange(n, dtype=np.int32), batched)
        host.forward(prefix, np.arange(n, dtype=np.int32), on_host)
        for cache in (alone, pool[slot]):                    # the same prefix rows, copied; NaN after them
            for name in ("c_kv", "k_pe"):
                rows = np.full(getattr(cache, name).shape, np.nan, np.float32)
                rows[:, :n] = getattr(batched, name).copy_to_host()[:, :n]
                getattr(cache, name).copy_to_device(rows)
            cache.length = n
        segs.append(Segment(ids, pos, batched, tree))
        pooled.append(Segment(ids, pos, pool[slot], tree))
        host_segs.append(Segment(ids, pos, on_host, tree))
        solo.append((alone, target.forward(ids, pos, alone, parents=tree, hidden_layer_ids=(0, 1))))
    # separate caches: the attention a launch set per sequence; one pool: one launch set for all
    import ddtree_numba.kernels as kernels
    attention, launches = kernels.enqueue_mla_attention, []
    monkeypatch.setattr(kernels, "enqueue_mla_attention",
                        lambda *a, **kw: launches.append(kw.get("seqs") is not None) or attention(*a, **kw))
    for batch in (segs, pooled):
        launches.clear()
        out = target.forward_batch(batch, hidden_layer_ids=(0, 1))
        assert launches == ([False, False] * 2 if batch is segs else [True] * 2)   # the pooled launch set was used
        for j, (seg, got, (cache, want)) in enumerate(zip(batch, out.outputs, solo)):
            np.testing.assert_array_equal(got.logits, want.logits, err_msg=f"sequence {j}")
            np.testing.assert_array_equal(got.hidden, want.hidden, err_msg=f"sequence {j}")
            assert seg.cache.length == cache.length
            for name in ("c_kv", "k_pe"):
                np.testing.assert_array_equal(getattr(seg.cache, name).copy_to_host()[:, :cache.length],
                                              getattr(cache, name).copy_to_host()[:, :cache.length], err_msg=name)
        np.testing.assert_array_equal(out.unique_experts, host.forward_batch(host_segs).unique_experts)
        for c in host_segs:
            c.cache.truncate(c.cache.length - len(c.ids))
    assert out.unique_experts.max() > 0                     # the MoE layer was counted
    for name in ("c_kv", "k_pe"):
        rows = getattr(pool_obj, name).copy_to_host()        # [slots, L, S, C or R]
        assert np.isnan(rows[1]).all(), name                 # the idle slot untouched
        for seg in pooled:
            assert np.isnan(rows[seg.cache.slot, :, seg.cache.length:]).all(), name   # nothing past the new rows


@pytest.mark.gpu
@pytest.mark.parametrize("pooled", [False, True])
def test_a_batched_forward_replayed_as_a_graph_gives_the_eager_bits(pooled):
    """``forward_batch(graph=True)``: the layout captured once (separate caches, or slots of one
    pool: one attention launch set) and replayed with the caches' lengths read on the device:
    at the captured lengths and at shorter ones, the eager bits of those lengths."""
    from ddtree_numba.model import ModelConfig, random_target
    from ddtree_numba.model.target import Segment
    host = random_target(ModelConfig.tiny(q_lora_rank=None), seed=2)       # the non-fused latent path
    target = CudaTarget.from_host(host)
    rng = np.random.default_rng(1)
    V = target.config.vocab_size
    pool = target.new_cache_pool(3, 16).caches if pooled else None
    caches, segs = [], []
    for j, (n, tree) in enumerate([(4, None), (6, np.array([-1, 0, 0, 1, 1], np.int32))]):
        cache = pool[2 - j] if pooled else target.new_cache(16)
        target.forward(rng.integers(0, V, n).astype(np.int32), np.arange(n, dtype=np.int32), cache)
        t = 3 if tree is None else len(tree)
        pos = (n + (np.arange(t) if tree is None else np.array([0, 1, 1, 2, 2]))).astype(np.int32)
        caches.append((cache, n))
        segs.append(Segment(rng.integers(0, V, t).astype(np.int32), pos, cache, tree))

    def run(graph, back):                        # the forward after rewinding each cache by ``back`` rows
        for c, n in caches:
            c.length = n - back
        out = target.forward_batch(segs, hidden_layer_ids=(1,), graph=graph)
        return out, [c.c_kv.copy_to_host()[:, n - back:c.length] for c, n in caches]

    for back in (0, 1, 0):
        (want, want_rows), (got, got_rows) = run(False, back), run(True, back)
        for g, w in zip(got.outputs, want.outputs):
            np.testing.assert_array_equal(g.logits, w.logits, err_msg=f"rewound {back}")
            np.testing.assert_array_equal(g.hidden, w.hidden, err_msg=f"rewound {back}")
        np.testing.assert_array_equal(got.unique_experts, want.unique_experts)
        for g, w in zip(got_rows, want_rows):
            np.testing.assert_array_equal(g, w)


def _stacked_and_split(q_lora_rank, unstack, precision, seed):
    """Two cuda targets of one random one-layer host model, the second with its layers unstacked
    by ``unstack(layer)``; each forwards three tokens into its own cache. -> (host, fused, split,
    (fused logits, split logits)); asserts the two give the same logits and cached latents."""
    import dataclasses
    from ddtree_numba.kernels import TILES
    from ddtree_numba.model import ModelConfig, random_target
    cfg = dataclasses.replace(ModelConfig.tiny(), num_hidden_layers=1, q_lora_rank=q_lora_rank)
    host = random_target(cfg, seed=seed)
    tile = None if REAL_GPU else TILES["small"]
    fused, split = (CudaTarget.from_host(host, precision=precision, gemm_tile=tile) for _ in range(2))
    for lw in split.layers:
        unstack(lw)
    ids, pos = np.array([3, 7, 1], np.int32), np.arange(3, dtype=np.int32)
    caches = fused.new_cache(8), split.new_cache(8)
    logits = tuple(t.forward(ids, pos, c).logits for t, c in zip((fused, split), caches))
    np.testing.assert_array_equal(*logits)
    for name in ("c_kv", "k_pe"):
        np.testing.assert_array_equal(getattr(caches[0], name).copy_to_host()[:, :3],
                                      getattr(caches[1], name).copy_to_host()[:, :3], err_msg=name)
    return host, fused, split, logits


def test_q_a_and_kv_a_in_one_gemm_give_the_bits_of_two():
    """A q_lora layer stacks q_a_proj over kv_a_proj_with_mqa (``DeviceLayer.qkv_a_proj``): one
    GEMM and one launch for both latent norms. Logits and cached latents equal the two-GEMM path
    (the layers unstacked) bit for bit: the GEMM's reduction contract, one norm's arithmetic."""
    _, fused, split, _ = _stacked_and_split(24, lambda lw: setattr(lw, "qkv_a_proj", None), "fp32", 4)
    assert all(lw.latent_path == "qkv_a" for lw in fused.layers)     # the path under test ran
    assert all(lw.latent_path == "apart" for lw in split.layers)
    # each workspace holds the buffers of its own path only
    assert fused.workspace(3).q_a.shape == fused.workspace(3).kv.shape == (1, 1)
    assert split.workspace(3).qkv_a.shape == (1, 1) and split.workspace(3).kv.shape == (4, 16 + 8)


def test_q_proj_and_kv_a_in_one_gemm_give_the_bits_of_two():
    """A layer without q_lora stacks q_proj over kv_a_proj_with_mqa (``DeviceLayer.q_kv_proj``):
    one GEMM writes the query and the kv latent side by side, and the latent's norm, the ropes and
    the query absorption read them from there. Logits and cached latents equal the two-GEMM path
    (the layers unstacked) bit for bit."""
    host, fused, split, (got, _) = _stacked_and_split(None, lambda lw: setattr(lw, "q_kv_proj", None), "bf16", 5)
    assert all(lw.latent_path == "q_kv" for lw in fused.layers)      # the path under test ran
    assert all(lw.latent_path == "apart" for lw in split.layers)
    # the numpy target (no stacking) agrees within the bf16 GEMMs' bound
    ids, pos = np.array([3, 7, 1], np.int32), np.arange(3, dtype=np.int32)
    np.testing.assert_allclose(got, host.forward(ids, pos, host.new_cache(8)).logits, rtol=0, atol=5e-2)
    ws_fused, ws_split = fused.workspace(3), split.workspace(3)
    assert ws_fused.q.shape == ws_fused.kv.shape == (1, 1) and ws_fused.q_kv.shape[0] == 4
    assert ws_split.q_kv.shape == (1, 1) and ws_split.kv.shape[0] == 4


@pytest.mark.gpu
def test_graph_replay_equals_eager():
    path = os.path.join(DATA, "v3_noaux_tc")
    target = load_cuda_target(path)
    tree = np.load(os.path.join(path, "tree.npz"))
    outs = []
    for graph in (False, True, True):                  # capture, then replay an existing graph
        cache = target.new_cache(32)
        target.forward(tree["prefix_ids"], tree["prefix_positions"], cache, graph=graph)
        outs.append(target.forward(tree["tree_ids"], tree["tree_positions"], cache,
                                   parents=tree["parents"], hidden_layer_ids=(0,), graph=graph))
    for o in outs[1:]:
        np.testing.assert_array_equal(o.logits, outs[0].logits)
        np.testing.assert_array_equal(o.hidden, outs[0].hidden)


def test_bad_inputs_name_the_problem():
    target = load_cuda_target(os.path.join(DATA, "v3_noaux_tc"))
    with pytest.raises(ValueError, match="DeviceMLACache"):
        target.forward(np.array([1], np.int32), np.array([0]), dd.load_target(
            os.path.join(DATA, "v3_noaux_tc")).new_cache(4))
    cache = target.new_cache(2)
    with pytest.raises(ValueError, match="cache overflow"):
        target.forward(np.array([1, 2, 3], np.int32), np.arange(3), cache)
    with pytest.raises(ValueError, match="out of range"):
        target.forward(np.array([1, 999], np.int32), np.arange(2), cache)
    assert isinstance(cache, DeviceMLACache) and len(cache) == 0


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("layer", [0, 1])
def test_non_finite_logits_name_the_layer_on_the_cuda_backend_too(layer):
    """The cuda target's host forward names the first layer whose output went non-finite, the
    last one too (whose hidden state is final-normed: its own output is read from the residual)."""
    from ddtree_numba.kernels import TILES
    from ddtree_numba.model import ModelConfig, random_target
    host = random_target(ModelConfig.tiny(), seed=1)
    host.layers[layer].o_proj = np.full_like(host.layers[layer].o_proj, 3e38)
    gpu = CudaTarget.from_host(host, gemm_tile=None if REAL_GPU else TILES["small"])
    with pytest.raises(ValueError, match=rf"target forward: the logits are not finite .*its layer {layer} is the first"):
        gpu.forward(np.array([1, 2], np.int32), np.arange(2, dtype=np.int32), gpu.new_cache(4))


def test_a_cuda_target_asks_for_its_pdl_mode_before_its_upload(monkeypatch):
    """The first ``CudaTarget`` picks the process's PDL mode by its hidden size
    (``_device.prefer_pdl_mode``, whose rules tests/test_kernel_registry.py holds), and does so
    before any of its upload's device work: ``from_host`` asks first, then ``__init__`` again."""
    import ddtree_numba.model.cuda_target as ct
    from ddtree_numba.model import ModelConfig, random_target
    calls = []
    real_layers = ct.device_layers_from_host
    monkeypatch.setattr(ct, "prefer_pdl_mode", lambda hidden: calls.append(("mode", hidden)))
    monkeypatch.setattr(ct, "device_layers_from_host",
                        lambda *a: calls.append(("upload",)) or real_layers(*a))
    host = random_target(ModelConfig.tiny(), seed=0)
    CudaTarget.from_host(host)
    hidden = host.config.hidden_size
    assert calls == [("mode", hidden), ("upload",), ("mode", hidden)]
