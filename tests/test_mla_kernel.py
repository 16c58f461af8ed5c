"""Tree-verify MLA attention (kernels/mla.py) against the twin, and bit for bit against itself:
a tree node equals the same token decoded alone over its root-to-node path."""

import numpy as np
import pytest

from conftest import FP32_MODE_REL
from numba import config, cuda

from ddtree_numba import kernels as kn
from ddtree_numba import reference as ref
from ddtree_numba.kernels.mla import _SIM_TILES, MLAScratch, enqueue_mla_attention

pytestmark = pytest.mark.kernels


def rel_err(got, want):
    assert np.isfinite(got).all(), "non-finite output"
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


def random_parents(rng, n):
    """A tree of n nodes, node 0 the root, parents[i] < i (deep and bushy mixed)."""
    parents = np.full(n, -1, np.int32)
    for i in range(1, n):
        parents[i] = i - 1 if rng.random() < 0.4 else rng.integers(0, i)
    return parents


def tree_from_build(rng, n_nodes):
    """The parents of a real DDTree build over random draft log-probs (N = n_nodes - 1)."""
    lp, ids = ref.topk_logprobs(rng.standard_normal((4, 50)).astype(np.float32) * 2, 6)
    return ref.build_tree(lp, ids, n_nodes - 1).parents


def bf16_bits(a):
    """float32 -> bfloat16 bits (uint16), round to nearest even."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def widen(w):
    if w.dtype == np.uint16:
        return (w.astype(np.uint32) << 16).view(np.float32)
    return w.astype(np.float32)


def inputs(rng, t, s0, h, d, r, c, dv, wdtype=np.float32):
    s = s0 + t
    q_nope = rng.standard_normal((t, h, d)).astype(np.float32)                 # [T, H, D]
    q_pe = rng.standard_normal((t, h, r)).astype(np.float32)                   # [T, H, R]
    c_kv = rng.standard_normal((s, c)).astype(np.float32)                      # [S, C]
    k_pe = rng.standard_normal((s, r)).astype(np.float32)                      # [S, R]
    k_pe[rng.integers(0, s)] *= 8                                              # an outlier key
    w = (rng.standard_normal((h * (d + dv), c)) * 0.7).astype(np.float32)      # [H*(D+Dv), C]
    if wdtype == np.uint16:
        w = bf16_bits(w)
    elif wdtype == np.float16:
        w = w.astype(np.float16)
    return q_nope, q_pe, c_kv, k_pe, w


# (T, s0, H, D, R, C, Dv, tree): tree None = causal, "build" = a DDTree build, "random" = random parents
CASES = [
    (4, 0, 2, 3, 2, 5, 3, None),
    (6, 7, 3, 4, 3, 7, 5, None),
    (9, 5, 2, 5, 2, 6, 4, "build"),
    (8, 0, 3, 3, 4, 9, 2, "random"),
    (7, 11, 1, 2, 0, 5, 3, "random"),       # no rope part (R = 0)
    (34, 1, 1, 2, 2, 3, 2, "random"),       # two mask words per query
    # more heads than one softmax pass takes on a GPU (past 32 tokens 4 groups of 32 lanes, else
    # 16 of 8): the next pass's scores in flight beside the shuffled maxima (the simulator's 2
    # groups of 4 lanes take several passes in the cases above already)
    *(pytest.param(case, marks=pytest.mark.skipif(config.ENABLE_CUDASIM, reason="a GPU's softmax groups"))
      for case in ((33, 2, 5, 2, 2, 3, 2, "random"), (3, 5, 20, 2, 2, 3, 2, None))),
]


@pytest.mark.parametrize("case", CASES)
def test_matches_twin(rng, case):
    t, s0, h, d, r, c, dv, tree = case
    q_nope, q_pe, c_kv, k_pe, w = inputs(rng, t, s0, h, d, r, c, dv)
    parents = None if tree is None else (tree_from_build(rng, t) if tree == "build" else random_parents(rng, t))
    mask = ref.mla_mask(s0, t, parents)                                        # [T, S]
    scale = 0.41
    got = kn.mla_attention_absorbed(q_nope, q_pe, c_kv, k_pe, w, mask, scale)
    want = ref.mla_attention_absorbed(q_nope, q_pe, c_kv, k_pe, w, mask, scale)
    assert got.shape == want.shape == (t, h, dv) and got.dtype == np.float32
    assert rel_err(got, want) <= FP32_MODE_REL


@pytest.mark.parametrize("wdtype", [np.float16, np.uint16])
def test_half_weights_match_twin_on_widened_weights(rng, wdtype):
    t, s0, h, d, r, c, dv = 5, 4, 2, 3, 2, 6, 4
    q_nope, q_pe, c_kv, k_pe, w = inputs(rng, t, s0, h, d, r, c, dv, wdtype)
    mask = ref.mla_mask(s0, t, random_parents(rng, t))
    got = kn.mla_attention_absorbed(q_nope, q_pe, c_kv, k_pe, w, mask, 0.5)
    want = ref.mla_attention_absorbed(q_nope, q_pe, c_kv, k_pe, widen(w), mask, 0.5)
    assert rel_err(got, want) <= FP32_MODE_REL
    w_uk_t, w_uv = ref.absorption_weights(w, h, d)
    assert w_uk_t.dtype == w_uv.dtype == w.dtype
    assert w_uk_t.shape == (h, c, d) and w_uv.shape == (h, dv, c)
    assert w_uk_t.flags.c_contiguous and w_uv.flags.c_contiguous


def test_device_arrays_in_device_array_out(rng):
    t, s0, h, d, r, c, dv = 3, 2, 2, 2, 2, 4, 3
    q_nope, q_pe, c_kv, k_pe, w = inputs(rng, t, s0, h, d, r, c, dv)
    mask = ref.mla_mask(s0, t)
    out = cuda.to_device(np.full((t, h, dv), np.nan, np.float32))
    res = kn.mla_attention_absorbed(*(cuda.to_device(a) for a in (q_nope, q_pe, c_kv, k_pe, w, mask)),
                                    0.7, out=out)
    assert res is out
    want = ref.mla_attention_absorbed(q_nope, q_pe, c_kv, k_pe, w, mask, 0.7)
    assert rel_err(out.copy_to_host(), want) <= FP32_MODE_REL


# -- the core enqueue: against float64 numpy, rows past t untouched, tile shapes ------------

def core_inputs(rng, tq, s_cap, h, c, r):
    q_lat = rng.standard_normal((tq, h * c)).astype(np.float32)                # [Tq, H*C]
    q_pe = rng.standard_normal((tq, h * r)).astype(np.float32)                 # [Tq, H*R]
    c_kv = rng.standard_normal((s_cap, c)).astype(np.float32)                  # [S_cap, C]
    k_pe = rng.standard_normal((s_cap, r)).astype(np.float32)                  # [S_cap, R]
    return q_lat, q_pe, c_kv, k_pe


def run_core(q_lat, q_pe, c_kv, k_pe, bits, s0, t, scale, out=None, tiles=None):
    tq, c = q_lat.shape[0], c_kv.shape[1]
    h = q_lat.shape[1] // c
    out_d = cuda.to_device(np.full((tq, h * c), np.nan, np.float32) if out is None else out)
    scratch = MLAScratch(tq, h, c_kv.shape[0] + 3, c)   # wider than the cache: the row stride differs
    enqueue_mla_attention(cuda.to_device(q_lat), cuda.to_device(q_pe), cuda.to_device(c_kv),
                          cuda.to_device(k_pe), out_d, vis_bits=cuda.to_device(bits),
                          meta=cuda.to_device(np.array([s0, t], np.int32)), scale=scale, scratch=scratch,
                          tiles=tiles)
    return out_d.copy_to_host()


def core_twin(q_lat, q_pe, c_kv, k_pe, bits, s0, t, scale):
    """The live rows of the device tier's numpy twin, ``reference.mla.enqueue_mla_attention``
    (float64, rounded once), for a launch of these arguments."""
    out = np.full(q_lat.shape, np.nan, np.float32)
    ref.enqueue_mla_attention(q_lat, q_pe, c_kv, k_pe, out, vis_bits=bits, meta=np.array([s0, t], np.int32),
                              scale=scale)
    assert np.isnan(out[t:]).all()                          # the twin writes no row past t either
    return out[:t]


@pytest.mark.parametrize("tiles", [None, _SIM_TILES[0][1]])   # None: the batch tiles at 30 rows
def test_core_matches_float64_and_leaves_rows_past_t_untouched(rng, tiles):
    h, c, r, s0, t, tq = 3, 7, 3, 6, 7, 10                  # Tq = 10 rows allocated, t = 7 live
    q_lat, q_pe, c_kv, k_pe = core_inputs(rng, tq, s0 + t + 4, h, c, r)   # 4 stale rows past the step
    parents = random_parents(rng, t)
    bits = np.zeros((tq, 1), np.uint32)
    bits[:t] = ref.visibility_bits(parents)
    bits[t:] = 0xFFFFFFFF                                   # garbage in the dead rows
    scale = 1.7                                             # peaky: some visible p underflow
    got = run_core(q_lat, q_pe, c_kv, k_pe, bits, s0, t, scale, tiles=tiles)
    want = core_twin(q_lat, q_pe, c_kv, k_pe, bits, s0, t, scale)
    assert rel_err(got[:t], want) <= FP32_MODE_REL
    assert np.isnan(got[t:]).all()                          # rows i >= t never written


def bits_of(a):
    return a.view(np.uint32)


@pytest.fixture(autouse=True)
def float32_chains(monkeypatch):
    """Every test here runs the float32 kernels unless it asks for the tensor-core ones (``mma``)."""
    import importlib
    mod = importlib.import_module("ddtree_numba.kernels.mla")
    monkeypatch.setattr(mod, "MMA_SCORES", False)
    monkeypatch.setattr(mod, "MMA_PV", False)


@pytest.fixture
def mma(request, monkeypatch):
    """The tensor-core switches the test's parameter names (indirect): 'scores' sets
    ``kernels.mla.MMA_SCORES``, 'both' that and ``MMA_PV``; '' neither. True if any is on."""
    import importlib
    mod = importlib.import_module("ddtree_numba.kernels.mla")
    monkeypatch.setattr(mod, "MMA_SCORES", request.param in ("scores", "both"))
    monkeypatch.setattr(mod, "MMA_PV", request.param == "both")
    monkeypatch.setattr(mod, "MMA_PV_LATENT", 1)            # the tests' latents are narrow
    return bool(request.param)


@pytest.mark.parametrize("shape,mma", [("build", ""), ("random", ""), ("chain", ""), ("random", "scores"),
                                       ("build", "both")], indirect=["mma"])
def test_tree_node_is_bit_identical_to_the_token_decoded_alone(rng, shape, mma):
    """Node i of a tree vs the same query alone (Tq = 1, other tiles) over a cache holding the
    prefix then its ancestors contiguously: the same key values in the same order at other
    positions, so the same bits. Also with the scores, and p @ c_kv, on tensor cores
    (``MMA_SCORES``, ``MMA_PV``), whose bf16 operands put the output within a bf16-sized distance
    of float64, not float32's."""
    from ddtree_numba.kernels.mla import KEY_CHUNK
    h, c, r, n = 2, 6, 3, 10
    s0 = KEY_CHUNK + 1          # a chunk wholly in the prefix: the tree's tokens share it two a block
    parents = {"build": lambda: tree_from_build(rng, n), "random": lambda: random_parents(rng, n),
               "chain": lambda: np.arange(-1, n - 1, dtype=np.int32)}[shape]()
    q_lat, q_pe, c_kv, k_pe = core_inputs(rng, n, s0 + n + 1, h, c, r)
    scale = 0.9
    tree_out = run_core(q_lat, q_pe, c_kv, k_pe, ref.visibility_bits(parents), s0, n, scale)
    vis = ref.visibility(parents)
    scattered = 0
    for i in range(n):
        path = np.flatnonzero(vis[i])                                      # ancestors and i, ascending
        scattered += int(path[-1] - path[0] + 1 != len(path))
        s_ar = s0 + len(path) - 1                                          # cached rows before the token
        ar_ckv = np.concatenate([c_kv[:s0], c_kv[s0 + path], np.full((1, c), 9.0, np.float32)])
        ar_kpe = np.concatenate([k_pe[:s0], k_pe[s0 + path], np.full((1, r), 9.0, np.float32)])
        for tiles in ((None, _SIM_TILES[1][1]) if i % 3 == 0 else (None,)):
            alone = run_core(q_lat[i:i + 1], q_pe[i:i + 1], ar_ckv, ar_kpe, np.ones((1, 1), np.uint32),
                             s_ar, 1, scale, tiles=tiles)
            np.testing.assert_array_equal(bits_of(alone[0]), bits_of(tree_out[i]), err_msg=f"node {i}")
    if shape != "chain":
        assert scattered, "no node had scattered ancestors: the test would prove nothing"
    want = core_twin(q_lat, q_pe, c_kv, k_pe, ref.visibility_bits(parents), s0, n, scale)
    assert rel_err(tree_out, want) <= (3e-2 if mma else FP32_MODE_REL)


@pytest.mark.parametrize("mma", ["", "scores"], indirect=True)
def test_blocks_of_keys_no_row_sees_are_skipped_and_the_output_is_the_twins(rng, mma):
    """A bushy tree of 40 nodes after 32 cached rows: most blocks of new keys are seen by none of
    the block's query rows (above the diagonal, and beside it: a node sees the root, at most its
    parent, and itself), so the scores kernels skip them (``_block_sees_new_keys``). The output is
    the twin's, and with the float32 chains the bits do not depend on the tiles (which skip
    other blocks)."""
    h, c, r, s0, t = 1, 5, 2, 32, 40
    parents = np.array([-1] + [i - 1 if i % 5 == 0 else 0 for i in range(1, t)], np.int32)
    q_lat, q_pe, c_kv, k_pe = core_inputs(rng, t, s0 + t, h, c, r)
    bits = ref.visibility_bits(parents)
    got = run_core(q_lat, q_pe, c_kv, k_pe, bits, s0, t, 0.8)
    want = core_twin(q_lat, q_pe, c_kv, k_pe, bits, s0, t, 0.8)
    assert rel_err(got, want) <= (3e-2 if mma else FP32_MODE_REL)
    if not mma:
        other = run_core(q_lat, q_pe, c_kv, k_pe, bits, s0, t, 0.8, tiles=_SIM_TILES[1][1])
        np.testing.assert_array_equal(bits_of(other), bits_of(got))


def scores_only(q_lat, q_pe, c_kv, k_pe, bits, s0, t, scale):
    """The scores launch alone (``_mla_launches``' first) over a NaN scratch: [t*H, s0 + t]."""
    import importlib
    mla = importlib.import_module("ddtree_numba.kernels.mla")
    c = c_kv.shape[1]
    h = q_lat.shape[1] // c
    scratch = MLAScratch(t, h, c_kv.shape[0] + 3, c)
    scratch.scores.copy_to_device(np.full(scratch.scores.shape, np.nan, np.float32))
    launches = mla._mla_launches(*(cuda.to_device(a) for a in (q_lat, q_pe, c_kv, k_pe)),
                                 cuda.to_device(np.zeros((t, h * c), np.float32)), vis_bits=cuda.to_device(bits),
                                 meta=cuda.to_device(np.array([s0, t], np.int32)), scale=scale, scratch=scratch)
    launches[0][1]()
    return scratch.scores.copy_to_host()[:t * h, :s0 + t]


@pytest.mark.parametrize("mma", ["", "scores"], indirect=True)
def test_scores_kernels_skip_exactly_the_blocks_no_row_sees(rng, mma, monkeypatch):
    """Each scores kernel's blocks, by its own tile: a block of new keys none of its rows sees
    (brute force over ``reference.visibility``) is left unwritten (NaN), and every other block
    is written with the bits it has when every row sees every key. A tree of 40 nodes: two mask
    words a row, blocks that start inside a word. The tensor-core kernel at 16 x 16 blocks (two
    warps) on every device: the H200's tile for 80 rows (64 x 32) leaves no block blind."""
    import importlib
    mla = importlib.import_module("ddtree_numba.kernels.mla")
    monkeypatch.setattr(mla, "_MMA_TILE", (2, 1, 1, 1))
    h, c, r, s0, t = 2, 8, 4, 5, 40
    parents = random_parents(rng, t)
    vis = ref.visibility(parents)                               # [t, t]: node i sees node j
    bits = ref.visibility_bits(parents)                         # [t, 2]
    q_lat, q_pe, c_kv, k_pe = core_inputs(rng, t, s0 + t, h, c, r)
    got = scores_only(q_lat, q_pe, c_kv, k_pe, bits, s0, t, 0.6)
    full = scores_only(q_lat, q_pe, c_kv, k_pe, np.full_like(bits, 0xFFFFFFFF), s0, t, 0.6)
    if mma:
        br, bk = mla._mma_block(*mla._mma_tile(t * h))
    else:
        br, bk = mla._tiles(t * h, c)[0][:2]
    skipped = live_new = 0
    for r0 in range(0, t * h, br):
        for n0 in range(0, s0 + t, bk):
            rows, keys = slice(r0, min(r0 + br, t * h)), slice(n0, min(n0 + bk, s0 + t))
            tokens = np.arange(r0 // h, (rows.stop - 1) // h + 1)
            blind = n0 >= s0 and not vis[np.ix_(tokens, np.arange(keys.start - s0, keys.stop - s0))].any()
            if blind:
                skipped += 1
                assert np.isnan(got[rows, keys]).all(), (r0, n0)
            else:
                live_new += n0 >= s0
                np.testing.assert_array_equal(got[rows, keys].view(np.uint32), full[rows, keys].view(np.uint32))
    assert skipped and live_new, "the tree must have blind and seen blocks of new keys"


def test_batch_row_is_bit_identical_alone_and_among_more_rows(rng):
    """A causal batch of t tokens inside launches of Tq = t and Tq = 3t (other tiles)."""
    h, c, r, s0, t = 3, 5, 2, 4, 6
    q_lat, q_pe, c_kv, k_pe = core_inputs(rng, 3 * t, s0 + 3 * t, h, c, r)
    causal = ref.visibility_bits(np.arange(-1, 3 * t - 1, dtype=np.int32))
    small = run_core(q_lat[:t], q_pe[:t], c_kv, k_pe, causal[:t, :1], s0, t, 0.6)
    big = run_core(q_lat, q_pe, c_kv, k_pe, causal, s0, t, 0.6)
    np.testing.assert_array_equal(bits_of(small), bits_of(big[:t]))
    assert np.isnan(big[t:]).all()


@pytest.mark.parametrize("mma", ["", "both"], indirect=True)
def test_sequences_in_one_launch_get_the_bits_of_their_own_launches(rng, mma):
    """``seqs``: three sequences (a causal step, two trees; different cached lengths) in one
    launch set over a pool of four cache slots, the slots not in row order. Each sequence's rows
    equal its own launch's bits; a row of no sequence is left unwritten."""
    from ddtree_numba.kernels.mla import KEY_CHUNK
    h, c, r, cap = 2, 6, 3, 2 * KEY_CHUNK + 12
    layout = [(2, KEY_CHUNK + 5, None), (5, 3, "random"), (4, 2 * KEY_CHUNK + 4, "build")]   # (t, s0, tree)
    slots = [2, 0, 3]
    pool_ckv = rng.standard_normal((4, cap, c)).astype(np.float32)        # [slots, S_cap, C]
    pool_kpe = rng.standard_normal((4, cap, r)).astype(np.float32)
    total = sum(t for t, _, _ in layout) + 1                              # one spare row at the end
    q_lat, q_pe, _, _ = core_inputs(rng, total, 1, h, c, r)
    bits = np.zeros((total, 1), np.uint32)
    seqs, alone, row0 = [], [], 0
    for (t, s0, tree), slot in zip(layout, slots):
        parents = {None: lambda: np.arange(-1, t - 1, dtype=np.int32), "random": lambda: random_parents(rng, t),
                   "build": lambda: tree_from_build(rng, t)}[tree]()
        bits[row0:row0 + t] = ref.visibility_bits(parents)
        alone.append(run_core(q_lat[row0:row0 + t], q_pe[row0:row0 + t], pool_ckv[slot], pool_kpe[slot],
                              bits[row0:row0 + t], s0, t, 0.8))
        seqs.append((s0, t, row0, slot))
        row0 += t
    out = cuda.to_device(np.full((total, h * c), np.nan, np.float32))
    enqueue_mla_attention(cuda.to_device(q_lat), cuda.to_device(q_pe), cuda.to_device(pool_ckv),
                          cuda.to_device(pool_kpe), out, vis_bits=cuda.to_device(bits),
                          meta=cuda.to_device(np.zeros(2, np.int32)), scale=0.8,
                          scratch=MLAScratch(total, h, cap, c), seqs=cuda.to_device(np.array(seqs, np.int32)),
                          max_rows=max(t for t, _, _ in layout))
    got = out.copy_to_host()
    for (_, t, row0, _), want in zip(seqs, alone):
        np.testing.assert_array_equal(bits_of(got[row0:row0 + t]), bits_of(want))
    assert np.isnan(got[-1]).all()
    twin = np.full(got.shape, np.nan, np.float32)                         # the numpy twin, pooled the same way
    ref.enqueue_mla_attention(q_lat, q_pe, pool_ckv, pool_kpe, twin, vis_bits=bits, meta=np.zeros(2, np.int32),
                              scale=0.8, seqs=np.array(seqs, np.int32))
    assert rel_err(got[:-1], twin[:-1]) <= (3e-2 if mma else FP32_MODE_REL)
    assert np.isnan(twin[-1]).all()


# -- bad input -------------------------------------------------------------------------------

def test_bad_inputs_raise(rng):
    t, s0, h, d, r, c, dv = 3, 2, 2, 2, 2, 4, 3
    q_nope, q_pe, c_kv, k_pe, w = inputs(rng, t, s0, h, d, r, c, dv)
    mask = ref.mla_mask(s0, t)
    call = kn.mla_attention_absorbed

    def raises(match, *args):
        with pytest.raises(ValueError, match=match):
            call(*args)

    hidden = mask.copy()
    hidden[1, 0] = False
    raises("query 1 does not see every cached row", q_nope, q_pe, c_kv, k_pe, w, hidden, 0.5)
    blind = ref.mla_mask(0, t)
    blind[2] = False
    raises("query 2 sees no key", q_nope, q_pe, c_kv[s0:], k_pe[s0:], w, blind, 0.5)
    raises("mask must have dtype bool", q_nope, q_pe, c_kv, k_pe, w, mask.astype(np.float32), 0.5)
    raises("mask has shape", q_nope, q_pe, c_kv, k_pe, w, mask[:, 1:], 0.5)
    raises("k_pe has shape", q_nope, q_pe, c_kv, k_pe[:, :1], w, mask, 0.5)
    raises("q_pe has shape", q_nope, q_pe[:2], c_kv, k_pe, w, mask, 0.5)
    raises("kv_b_weight has 9 rows", q_nope, q_pe, c_kv, k_pe, w[:9], mask, 0.5)
    raises("kv_b_weight must", q_nope, q_pe, c_kv, k_pe, w.astype(np.float64), mask, 0.5)
    raises("q_nope must have dtype float32", q_nope.astype(np.float64), q_pe, c_kv, k_pe, w, mask, 0.5)
    raises("fewer than the 3 new tokens", q_nope, q_pe, c_kv[:2], k_pe[:2], w, mask[:, :2], 0.5)
    raises("scale must be finite", q_nope, q_pe, c_kv, k_pe, w, mask, float("nan"))
    raises("scale must be a number", q_nope, q_pe, c_kv, k_pe, w, mask, "big")


# -- the scores and p @ c_kv on tensor cores (kernels.mla.MMA_SCORES, MMA_PV) ------------------

@pytest.mark.parametrize("c,r", [(16, 8), (64, 16)])          # one channel chunk; two (64 + 16)
def test_mma_scores_within_the_twins_bound_and_a_row_alone_equals_it_in_the_batch(rng, monkeypatch, c, r):
    """``MMA_SCORES``: each score within ``reference.mla.mma_scores``'s bound of bf16 operands
    summed exactly (a fragment or chunk mistake is far outside it), every key up to s0 + t
    written when every row sees every key, and a query row launched alone over the same keys
    gets the bits it has among four. With a mask that shows no new key, a block of keys wholly
    past s0 is not computed (its scores stay as they were), and the rest are the same bits."""
    import importlib
    from ddtree_numba.reference.mla import mma_scores
    mla = importlib.import_module("ddtree_numba.kernels.mla")
    monkeypatch.setattr(mla, "MMA_SCORES", True)
    h, s0, t, scale = 2, 14, 4, 0.37
    s_cap = s0 + t
    q_lat, q_pe, c_kv, k_pe = core_inputs(rng, t, s_cap, h, c, r)

    def scores_of(ql, qp, ckv, kpe, s0_, t_, word=0xFFFFFFFF):
        """The scores launch alone, every mask word ``word``."""
        return scores_only(ql, qp, ckv, kpe, np.full((t_, -(-t_ // 32)), word, np.uint32), s0_, t_, scale)

    got = scores_of(q_lat, q_pe, c_kv, k_pe, s0, t)             # [t*H, S]
    want, bound = mma_scores(q_lat.reshape(t, h, c), q_pe.reshape(t, h, r), c_kv, k_pe, scale)
    assert np.isfinite(got).all()
    assert (np.abs(got.reshape(t, h, -1) - want) <= bound).all()
    alone = scores_of(q_lat[2:3], q_pe[2:3], c_kv, k_pe, s_cap - 1, 1)
    np.testing.assert_array_equal(alone.view(np.uint32), got[2 * h:3 * h].view(np.uint32))
    # blind: no row sees a new key, and the keys span a block wholly past s0 (the block's keys
    # follow the tile, so the cache is sized by it)
    keys = mla._mma_block(*mla._mma_tile(t * h))[1]
    s0_b = keys + 3
    ql_b, qp_b, ckv_b, kpe_b = core_inputs(rng, keys + 1, s0_b + keys + 1, h, c, r)
    seen = scores_of(ql_b, qp_b, ckv_b, kpe_b, s0_b, keys + 1)
    blind = scores_of(ql_b, qp_b, ckv_b, kpe_b, s0_b, keys + 1, word=0)
    past = 2 * keys                                             # the first block wholly past s0_b
    assert np.isfinite(seen).all()
    assert np.isnan(blind[:, past:]).all()
    np.testing.assert_array_equal(blind[:, :past].view(np.uint32), seen[:, :past].view(np.uint32))


@pytest.mark.parametrize("h,c,tile", [(3, 20, None), (10, 20, None), (10, 70, (2, 2, 2))])
def test_mma_pv_within_the_twins_bound_chunk_by_chunk(rng, monkeypatch, h, c, tile):
    """``MMA_PV``: o_part and l_part of every (token, chunk) within ``reference.mla.mma_pv``'s
    bound of the chunk's p (the softmax's, read back) over its visible keys gathered in visible
    order; a tree whose nodes see scattered keys, chunks cut inside the prefix and the tree, tokens
    sharing the prefix chunks two a block (the last block with one), and heads in one block with
    unused columns (H 3) or over two blocks (H 10; the simulator's blocks take 8); and a tile of
    the GPU's shape (two warps, two channel tiles a warp, two head tiles a token, a thread a
    channel; C 70: two channel blocks, a warp of the second idle)."""
    import importlib
    from ddtree_numba.reference.mla import mma_pv
    mla = importlib.import_module("ddtree_numba.kernels.mla")
    monkeypatch.setattr(mla, "MMA_PV", True)
    monkeypatch.setattr(mla, "MMA_PV_LATENT", 1)            # the test's latent is narrow
    if tile is not None:
        monkeypatch.setattr(mla, "_MMA_PV_TILE", tile)
    r, t = 4, 9
    s0 = mla.KEY_CHUNK + 6                                # the prefix alone spans two chunks
    q_lat, q_pe, c_kv, k_pe = core_inputs(rng, t, s0 + t, h, c, r)
    parents = random_parents(rng, t)
    bits = ref.visibility_bits(parents)
    vis = np.concatenate([np.ones((t, s0), bool), ref.visibility(parents)], axis=1)     # [t, S]
    scratch = MLAScratch(t, h, s0 + t, c)
    launches = mla._mla_launches(*(cuda.to_device(a) for a in (q_lat, q_pe, c_kv, k_pe)),
                                 cuda.to_device(np.zeros((t, h * c), np.float32)), vis_bits=cuda.to_device(bits),
                                 meta=cuda.to_device(np.array([s0, t], np.int32)), scale=0.8, scratch=scratch)
    names = [name for name, _ in launches]
    assert names == ["scores", "softmax", "pv prefix", "pv tail", "combine"], names   # tokens share prefix chunks
    for _, go in launches[:2]:
        go()                                              # scores, softmax: p in scratch.scores
    p = scratch.scores.copy_to_host()
    scratch.o_part.copy_to_device(np.full(scratch.o_part.shape, np.nan, np.float32))
    scratch.l_part.copy_to_device(np.full(scratch.l_part.shape, np.nan, np.float32))
    for _, go in launches[2:4]:
        go()                                              # p @ c_kv: the prefix chunks, then the rest
    o_part, l_part = scratch.o_part.copy_to_host(), scratch.l_part.copy_to_host()
    kc = mla.KEY_CHUNK
    chunks = 0
    for i in range(t):
        keys = np.flatnonzero(vis[i])
        for k in range(-(-len(keys) // kc)):
            ks = keys[k * kc:(k + 1) * kc]
            rows = i * h + np.arange(h)
            o, l, ob, lb = mma_pv(p[rows][:, ks], c_kv[ks])
            assert (np.abs(o_part[k, rows] - o) <= ob).all(), (i, k)
            assert (np.abs(l_part[k, rows] - l) <= lb).all(), (i, k)
            chunks += 1
    assert chunks >= 2 * t                                # every token's keys span several chunks


def test_visible_scans_over_many_mask_words(rng):
    """``_visible_count`` and ``_visible_position`` (every kernel's mask scans, which load a
    row's words ``_WORDS`` at a time) against numpy, over rows of 2 * _WORDS + 3 words: three
    batches, the last partial, one row empty and one full."""
    import importlib
    import types
    mla = importlib.import_module("ddtree_numba.kernels.mla")
    w = 2 * mla._WORDS + 3
    bits = rng.integers(0, 2**32, size=(4, w), dtype=np.uint64).astype(np.uint32)    # [rows, W]
    bits[1] = 0
    bits[2] = 0xFFFFFFFF
    bits[3, : w - 1] = 0                                      # one key, in the last word
    s0 = 7
    seen = [s0 + np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")) for row in bits]
    n_max = s0 + 32 * w

    def scan(vis_bits, s0, count, pos):
        i = cuda.blockIdx.x
        if cuda.threadIdx.x == 0:
            count[i] = _visible_count(vis_bits, i, s0)
        cuda.syncthreads()
        for j in range(cuda.threadIdx.x, count[i], cuda.blockDim.x):
            pos[i, j] = _visible_position(vis_bits, i, j, s0)

    # compiled with kernels/mla.py's globals, as its own kernels are (the simulator swaps its
    # ``cuda`` for the launch there, which the device functions' local arrays need)
    scan = cuda.jit(types.FunctionType(scan.__code__, vars(mla)))
    count = cuda.to_device(np.zeros(4, np.int64))
    pos = cuda.to_device(np.full((4, n_max), -9, np.int64))
    scan[4, 4](cuda.to_device(bits), s0, count, pos)
    count, pos = count.copy_to_host(), pos.copy_to_host()
    for i in range(4):
        assert count[i] == s0 + len(seen[i]), i
        np.testing.assert_array_equal(pos[i, :count[i]], np.concatenate([np.arange(s0), seen[i]]), err_msg=str(i))
