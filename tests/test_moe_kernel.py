"""MoE kernels (routing, counting sort, grouped experts, shared experts, combine) vs their twins."""

import numpy as np
import pytest

from conftest import FP32_MODE_REL
from numba import cuda

from ddtree_numba import kernels as kn
from ddtree_numba import reference as ref
from ddtree_numba.reference.moe import expert_work_items, work_item_capacity
from ddtree_numba.kernels.moe import (MoEBuffers, MoERoute, enqueue_moe_block, _enqueue_moe_combine,
                                      _enqueue_moe_sort)

pytestmark = pytest.mark.kernels

METHODS = ("greedy", "group_limited_greedy", "noaux_tc")
SCORINGS = ("softmax", "sigmoid")


def _rel_err(got, want):
    return float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30))


def _bf16(a):
    """float32 -> bfloat16 bits (uint16), rounded to nearest even."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _widen_bf16(u):
    return (u.astype(np.uint32) << 16).view(np.float32)


def _routing_gaps(logits, bias, scoring, method, n_group):
    """Per row: the smallest relative gap between choice values and between group scores
    (float64) -- routing ids are exact only away from near-ties."""
    l64 = logits.astype(np.float64)
    if scoring == "softmax":
        z = np.exp(l64 - l64.max(-1, keepdims=True))
        s = z / z.sum(-1, keepdims=True)
    else:
        s = 1 / (1 + np.exp(-l64))
    c = s + (bias if method == "noaux_tc" else 0)
    def rel_gaps(v):
        v = np.sort(v, -1)
        return (np.diff(v, axis=-1) / np.abs(v[:, 1:]).clip(1e-30)).min(-1)

    gaps = rel_gaps(c)
    if method != "greedy" and n_group > 1:
        g = c.reshape(len(c), n_group, -1)
        gs = g.max(-1) if method == "group_limited_greedy" else np.sort(g, -1)[..., -2:].sum(-1)
        gaps = np.minimum(gaps, rel_gaps(gs))
    return gaps


def _well_separated_inputs(rng, T, M, E, scoring, method, n_group, gap=1e-4):
    """x [T, M], gate [E, M], bias [E] whose routing has no near-ties (rows redrawn until so)."""
    gate = (rng.standard_normal((E, M)) / np.sqrt(M)).astype(np.float32)
    bias = (rng.standard_normal(E) * 0.1).astype(np.float32)
    x = (rng.standard_normal((T, M)) * 2).astype(np.float32)
    for _ in range(200):
        bad = _routing_gaps(ref.linear(x, gate), bias, scoring, method, n_group) < gap
        if not bad.any():
            return x, gate, bias
        x[bad] = (rng.standard_normal((int(bad.sum()), M)) * 2).astype(np.float32)
    raise AssertionError("could not draw well-separated routing inputs")


@pytest.mark.parametrize("scoring", SCORINGS)
@pytest.mark.parametrize("method", METHODS)
def test_routing_matches_twin(rng, scoring, method):
    T, M, E, G, TG, K = 9, 37, 16, 4, 2, 3
    x, gate, bias = _well_separated_inputs(rng, T, M, E, scoring, method, G)
    args = (bias, scoring, method, G, TG, K, True, 2.5)
    ids, w = kn.moe_route(x, gate, *args)
    ids_r, w_r = ref.moe_route(x, gate, *args)
    np.testing.assert_array_equal(ids, ids_r)
    assert _rel_err(w, w_r) <= FP32_MODE_REL
    # without normalisation, with a bf16 router
    args = (bias, scoring, method, G, TG, K, False, 1.5)
    gate16 = _bf16(gate)
    ids, w = kn.moe_route(x, gate16, *args)
    ids_r, w_r = ref.moe_route(x, _widen_bf16(gate16), *args)
    np.testing.assert_array_equal(ids, ids_r)
    assert _rel_err(w, w_r) <= FP32_MODE_REL
    # device arrays in, filled device outputs back
    out = (cuda.to_device(np.full((T, K), -1, np.int32)), cuda.to_device(np.zeros((T, K), np.float32)))
    got = kn.moe_route(cuda.to_device(x), cuda.to_device(gate16), cuda.to_device(bias), *args[1:], out=out)
    assert got is out
    np.testing.assert_array_equal(out[0].copy_to_host(), ids_r)


def test_routing_with_more_experts_than_threads_and_one_group(rng):
    T, M, E, K = 5, 20, 40, 6  # E > threads: strided loops in every phase
    for scoring, method, G, TG in (("sigmoid", "noaux_tc", 1, 1), ("softmax", "greedy", 1, 1),
                                   ("softmax", "group_limited_greedy", 8, 3)):
        x, gate, bias = _well_separated_inputs(rng, T, M, E, scoring, method, G)
        args = (bias, scoring, method, G, TG, K, True, 1.0)
        ids, w = kn.moe_route(x, gate, *args)
        ids_r, w_r = ref.moe_route(x, gate, *args)
        np.testing.assert_array_equal(ids, ids_r)
        assert _rel_err(w, w_r) <= FP32_MODE_REL


@pytest.mark.parametrize("scoring", SCORINGS)
@pytest.mark.parametrize("method", METHODS)
def test_exact_ties_go_to_the_lower_id(scoring, method):
    E, G = 8, 4
    gate = np.eye(E, dtype=np.float32)  # logits = x exactly, on both sides
    x = np.array([[1, 3, 0, 3, 2, 3, 0, 1],     # experts 1, 3, 5 tie at the top
                  [2, 2, 2, 2, 2, 2, 2, 2],     # everything ties
                  [0, 5, 5, 0, 1, 1, 4, 4]],    # groups (1,2) and (6,7) tie on max and on sum
                 np.float32)
    bias = np.zeros(E, np.float32)
    ids, w = kn.moe_route(x, gate, bias, scoring, method, G, 2, 2, False, 1.0)
    ids_r, w_r = ref.moe_route(x, gate, bias, scoring, method, G, 2, 2, False, 1.0)
    np.testing.assert_array_equal(ids, ids_r)
    assert _rel_err(w, w_r) <= FP32_MODE_REL
    want = [[1, 3], [0, 1], [1, 2]]  # greedy and group_limited_greedy (groups 0, 1 win the ties)
    if method == "noaux_tc":  # groups by their two best: row 0 keeps groups 2, 0; row 2 depends on scores
        want = [[1, 5], [0, 1], [1, 6] if scoring == "sigmoid" else [1, 2]]
    np.testing.assert_array_equal(ids, want)


def test_group_ties_keep_the_lower_group():
    E, G = 8, 4
    gate = np.eye(E, dtype=np.float32)
    # group maxima 3, 3, 3, 1: keep groups 0 and 1 of the tied three; expert 5 (group 2) loses
    x = np.array([[3, 0, 0, 3, 3, 2, 1, 0]], np.float32)
    ids, _ = kn.moe_route(x, gate, None, "sigmoid", "group_limited_greedy", G, 2, 3, False, 1.0)
    np.testing.assert_array_equal(ids, [[0, 3, 1]])
    np.testing.assert_array_equal(ids, ref.moe_route(x, gate, None, "sigmoid", "group_limited_greedy",
                                                     G, 2, 3, False, 1.0)[0])


def test_routing_rejects_bad_input(rng):
    x = np.zeros((2, 4), np.float32)
    gate = np.zeros((8, 4), np.float32)
    with pytest.raises(ValueError, match="scoring_func"):
        kn.moe_route(x, gate, None, "relu", "greedy", 1, 1, 2, False, 1.0)
    with pytest.raises(ValueError, match="topk_method"):
        kn.moe_route(x, gate, None, "softmax", "best", 1, 1, 2, False, 1.0)
    with pytest.raises(ValueError, match="e_score_correction_bias"):
        kn.moe_route(x, gate, None, "sigmoid", "noaux_tc", 2, 1, 2, False, 1.0)
    with pytest.raises(ValueError, match="n_group"):
        kn.moe_route(x, gate, None, "softmax", "group_limited_greedy", 3, 1, 2, False, 1.0)
    with pytest.raises(ValueError, match="top_k"):
        kn.moe_route(x, gate, None, "softmax", "greedy", 1, 1, 9, False, 1.0)
    with pytest.raises(ValueError, match="gate_weight"):
        kn.moe_route(x, np.zeros((8, 5), np.float32), None, "softmax", "greedy", 1, 1, 2, False, 1.0)
    with pytest.raises(ValueError, match="x must have dtype float32"):
        kn.moe_route(x.astype(np.float64), gate, None, "softmax", "greedy", 1, 1, 2, False, 1.0)


def _distinct_ids(rng, T, E, K):
    return np.stack([rng.choice(E, K, replace=False) for _ in range(T)]).astype(np.int32)


@pytest.mark.parametrize("n,item_rows,E", [(0, 8, 6), (1, 8, 6), (13, 16, 6), (37, 8, 6), (37, 8, 70)])
def test_counting_sort_invariants(rng, n, item_rows, E):
    """The counting sort against the twin's grouping. E 70: experts past the first threads' own
    (each thread counts a chunk of the experts), some of them left empty."""
    _check_counting_sort(rng, n, item_rows, E)


def _check_counting_sort(rng, n, item_rows, E=6):
    R, K = 37, 3  # R > 32: more than one bitmap word
    # experts 0..4 only (expert 5 stays empty); expert 4 in every third row (a crowded one)
    # (with E > 6, the rows also pick among the experts past 5, leaving some of them empty too)
    top = 5 if E == 6 else E - 2
    ids = np.stack([np.append(rng.choice(4, K - 1, replace=False), 4) if r % 3 == 0
                    else rng.choice(top, K, replace=False) for r in range(R)]).astype(np.int32)
    w = rng.standard_normal((R, K)).astype(np.float32)
    bufs = MoEBuffers(R, E, K, 4, 4)
    bufs.token_slot.copy_to_device(np.full((R, K), -1, np.int32))
    bufs.items.copy_to_device(np.full(bufs.items.shape, -1, np.int32))
    _enqueue_moe_sort(cuda.to_device(ids), cuda.to_device(w), bufs, cuda.to_device(np.array([n], np.int32)),
                      item_rows=item_rows)
    off = bufs.offsets.copy_to_host()
    items = bufs.items.copy_to_host()                          # every entry written: the used ones, then empties
    np.testing.assert_array_equal(items, expert_work_items(off, item_rows, len(items) // 3))
    assert bufs.item_rows == item_rows and len(bufs.work_items()) == 3 * work_item_capacity(E, R * K, item_rows)
    st = bufs.slot_token.copy_to_host()[: n * K]
    sw = bufs.slot_weight.copy_to_host()[: n * K]
    ts = bufs.token_slot.copy_to_host()
    live = ids[:n]
    np.testing.assert_array_equal(off, np.concatenate([[0], np.cumsum(np.bincount(live.ravel(), minlength=E))]))
    for e in range(E):
        toks = st[off[e]:off[e + 1]]
        np.testing.assert_array_equal(toks, np.flatnonzero((live == e).any(1)))  # tokens ascending
    for r in range(n):
        slots = ts[r]
        assert (np.diff(slots) > 0).all()                     # ascending slot = ascending expert
        np.testing.assert_array_equal(st[slots], r)
        experts = np.searchsorted(off, slots, side="right") - 1
        np.testing.assert_array_equal(experts, np.sort(live[r]))
        np.testing.assert_array_equal(sw[slots], w[r][np.argsort(live[r])])
    assert (ts[n:] == -1).all()                                # rows past n untouched


def _expert_weights(rng, E, I, M, dtype=np.float32):
    g = (rng.standard_normal((E, I, M)) / np.sqrt(M)).astype(np.float32)
    u = (rng.standard_normal((E, I, M)) / np.sqrt(M)).astype(np.float32)
    d = (rng.standard_normal((E, M, I)) / np.sqrt(I)).astype(np.float32)
    if dtype == "bf16":
        return tuple(_bf16(a) for a in (g, u, d))
    return tuple(a.astype(dtype) for a in (g, u, d))


def _widen(a):
    return _widen_bf16(a) if a.dtype == np.uint16 else a.astype(np.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, "bf16"])
def test_moe_experts_and_swiglu_mlp_match_twins(rng, dtype):
    T, M, E, I, K = 5, 66, 4, 9, 2  # M > 64: two reduction chunks in the gate/up GEMM
    x = rng.standard_normal((T, M)).astype(np.float32)
    ids = _distinct_ids(rng, T, E, K)
    w = rng.uniform(0.1, 1, (T, K)).astype(np.float32)
    g, u, d = _expert_weights(rng, E, I, M, dtype)
    want = ref.moe_experts(x, ids, w, _widen(g), _widen(u), _widen(d))
    got = kn.moe_experts(x, ids, w, g, u, d)
    assert _rel_err(got, want) <= FP32_MODE_REL
    got2 = kn.swiglu_mlp(x, g[1], u[1], d[1])
    assert _rel_err(got2, ref.swiglu_mlp(x, _widen(g[1]), _widen(u[1]), _widen(d[1]))) <= FP32_MODE_REL


def test_moe_experts_with_no_rows_or_no_experts_per_token(rng):
    g, u, d = _expert_weights(rng, 3, 4, 5)
    assert kn.moe_experts(np.zeros((0, 5), np.float32), np.zeros((0, 2), np.int32),
                          np.zeros((0, 2), np.float32), g, u, d).shape == (0, 5)
    x = rng.standard_normal((2, 5)).astype(np.float32)
    got = kn.moe_experts(x, np.zeros((2, 0), np.int32), np.zeros((2, 0), np.float32), g, u, d)
    np.testing.assert_array_equal(got, ref.moe_experts(x, np.zeros((2, 0), np.int32),
                                                       np.zeros((2, 0), np.float32), g, u, d))


def test_moe_experts_rejects_bad_input(rng):
    x = np.zeros((3, 4), np.float32)
    g, u, d = _expert_weights(rng, 4, 5, 4)
    w = np.ones((3, 2), np.float32)
    with pytest.raises(ValueError, match="repeats"):
        kn.moe_experts(x, np.array([[0, 1], [2, 2], [1, 3]], np.int32), w, g, u, d)
    with pytest.raises(ValueError, match="topk_ids must lie"):
        kn.moe_experts(x, np.array([[0, 1], [2, 4], [1, 3]], np.int32), w, g, u, d)
    with pytest.raises(ValueError, match="down"):
        kn.moe_experts(x, np.zeros((3, 2), np.int32), w, g, u, d[:, :, :3])
    with pytest.raises(ValueError, match="up has dtype"):
        kn.moe_experts(x, np.array([[0, 1]] * 3, np.int32), w, g, u.astype(np.float16), d)


def _block_case(rng, R, n, dtype="bf16", shared=True):
    M, E, I, Is, K, G = 24, 8, 12, 20, 3, 4
    route = MoERoute("sigmoid", "noaux_tc", G, 2, K, True, 2.5)
    m, gate, bias = _well_separated_inputs(rng, R, M, E, route.scoring_func, route.topk_method, G)
    m[n:] = np.nan  # rows past n must not be read into anything that is written
    x = rng.standard_normal((R, M)).astype(np.float32)
    x[n:] = np.nan
    g, u, d = _expert_weights(rng, E, I, M, dtype)
    sh = _expert_weights(rng, 1, Is, M, dtype) if shared else None
    sh = tuple(a[0] for a in sh) if shared else (None, None, None)
    bufs = MoEBuffers(R, E, K, M, I, Is if shared else 0)
    return route, m, x, gate, bias, (g, u, d), sh, bufs


def _run_block(route, m, x, gate, bias, experts, sh, bufs, n, concurrent=False, tile=None, offsets=None):
    stream = cuda.stream()
    dx = cuda.to_device(x, stream=stream)
    dev = [None if a is None else cuda.to_device(a, stream=stream) for a in (m, gate, bias, *experts, *sh)]
    names = ("gate", "bias", "experts_gate", "experts_up", "experts_down", "shared_gate", "shared_up", "shared_down")
    enqueue_moe_block(dev[0], dx, **dict(zip(names, dev[1:])), route=route, bufs=bufs, precision="fp32",
                      n_rows=cuda.to_device(np.array([n], np.int32), stream=stream), concurrent=concurrent,
                      tile=tile, offsets=offsets, stream=stream)
    return dx.copy_to_host(stream=stream)


def test_shared_experts_on_a_side_stream_give_the_same_bits(rng):
    """``concurrent``: the shared experts on the buffers' side stream, forked and joined around
    the routed ones, add the same bits as in line (a GPU also checks that the join orders the
    combine after them: run on a non-default stream, the block's one)."""
    R, n = 6, 5
    route, m, x, gate, bias, experts, sh, bufs = _block_case(rng, R, n, "bf16", True)
    inline = _run_block(route, m, x, gate, bias, experts, sh, bufs, n)
    side = _run_block(route, m, x, gate, bias, experts, sh, bufs, n, concurrent=True)
    first = bufs.side.stream
    _run_block(route, m, x, gate, bias, experts, sh, bufs, n, concurrent=True)
    assert bufs.side.stream is first is not None                  # one side stream for the buffers
    np.testing.assert_array_equal(side, inline)
    assert not np.isnan(side[:n]).any()


@pytest.mark.parametrize("shared", [True, False])
def test_moe_block_matches_twin_composition_and_leaves_other_rows(rng, shared):
    R, n = 11, 9
    route, m, x, gate, bias, (g, u, d), sh, bufs = _block_case(rng, R, n, "bf16", shared)
    got = _run_block(route, m, x, gate, bias, (g, u, d), sh, bufs, n)
    ids, w = ref.moe_route(m[:n], gate, bias, "sigmoid", "noaux_tc", 4, 2, 3, True, 2.5)
    y = ref.moe_experts(m[:n], ids, w, _widen(g), _widen(u), _widen(d))
    if shared:
        y = y + ref.swiglu_mlp(m[:n], *(_widen(a) for a in sh))
    want = x[:n] + y
    assert _rel_err(got[:n], want) <= FP32_MODE_REL
    np.testing.assert_array_equal(got[n:].view(np.uint32), x[n:].view(np.uint32))  # untouched
    # the routing the block used is the twin's
    np.testing.assert_array_equal(bufs.topk_ids.copy_to_host()[:n], ids)
    # the device tier's twin of its name (the same composition with the kernel's GEMM precision)
    twin = x.copy()
    ref.enqueue_moe_block(m, twin, gate=gate, bias=bias, experts_gate=g, experts_up=u, experts_down=d,
                          shared_gate=sh[0], shared_up=sh[1], shared_down=sh[2], route=route,
                          n_rows=np.array([n], np.int32), precision="fp32")
    assert _rel_err(got[:n], twin[:n]) <= FP32_MODE_REL and _rel_err(twin[:n], want) <= FP32_MODE_REL
    np.testing.assert_array_equal(twin[n:].view(np.uint32), x[n:].view(np.uint32))
    # ``offsets=``: the sort's expert offsets go there instead (a batched forward keeps a layer's),
    # the block's bits unchanged; the twin's offsets count the same rows an expert
    kept = bufs.offsets.copy_to_host()
    E = kept.shape[0] - 1
    np.testing.assert_array_equal(np.diff(kept), np.bincount(ids.ravel(), minlength=E))
    out = cuda.to_device(np.full(E + 1, -1, np.int32))
    bufs.offsets.copy_to_device(np.full(E + 1, -7, np.int32))
    again = _run_block(route, m, x, gate, bias, (g, u, d), sh, bufs, n, offsets=out)
    np.testing.assert_array_equal(again.view(np.uint32), got.view(np.uint32))
    np.testing.assert_array_equal(out.copy_to_host(), kept)
    assert (bufs.offsets.copy_to_host() == -7).all()             # bufs' own left alone
    twin_offsets = np.full(E + 1, -1, np.int32)
    ref.enqueue_moe_block(m, x.copy(), gate=gate, bias=bias, experts_gate=g, experts_up=u, experts_down=d,
                          shared_gate=sh[0], shared_up=sh[1], shared_down=sh[2], route=route,
                          n_rows=np.array([n], np.int32), precision="fp32", offsets=twin_offsets)
    np.testing.assert_array_equal(twin_offsets, kept)


def test_tall_experts_share_the_gate_up_tile_and_match_the_twin(rng, monkeypatch):
    """Past 32 typical rows an expert (36 here: 48 rows x top-3 over 8 experts, 18, doubled) the
    gate|up takes linear's ``_TALL_SWIGLU`` (on a GPU, with bf16 weights in whole 16-byte pieces,
    the cp.async ring ``_EXPERT_RING``) and the down the same tile (its work items are that
    tile's 16 rows): the block's down launch takes it; the block still adds the twin's experts.
    Few rows: the down chooses its own (on a GPU both take the 8-row ring ``_FEW_EXPERT_RING``).
    (No launch counts as small or narrow here: on a GPU these tiny matrices would take those
    tiles.)"""
    import importlib
    moe_mod, lin = importlib.import_module("ddtree_numba.kernels.moe"), importlib.import_module("ddtree_numba.kernels.linear")
    monkeypatch.setattr(lin, "_SMALL_WEIGHTS", 0)
    monkeypatch.setattr(lin, "_NARROW_COLS", 0)
    launched = []                                  # (gate|up?, the tile the launch takes)
    real = moe_mod._enqueue_grouped_linear

    def spy(x, w, out, items, max_rows, *, precision, w_up=None, tile=None, tile_rows=None, live_groups=None,
            **kw):
        launched.append((w_up is not None, lin._grouped_tile(x, w, max_rows, precision=precision, w_up=w_up,
                                                               tile_rows=tile_rows, live_groups=live_groups,
                                                               tile=tile)))
        return real(x, w, out, items, max_rows, precision=precision, w_up=w_up, tile=tile, tile_rows=tile_rows,
                    live_groups=live_groups, **kw)

    monkeypatch.setattr(moe_mod, "_enqueue_grouped_linear", spy)
    lin._choose.cache_clear()
    try:
        _tall_experts_case(rng, moe_mod, lin)
    finally:
        lin._choose.cache_clear()                  # no tile chosen without small or narrow launches stays cached
    tall = lin._TALL_SWIGLU if lin._SIM else lin._EXPERT_RING
    # the down (12 inputs: not whole 16-byte pieces) takes the gate|up's tile without its ring
    assert launched == [(True, tall), (False, tall._replace(NS=0) if isinstance(tall, lin._Staged) else tall)]


def _tall_experts_case(rng, moe_mod, lin):
    R, n = 48, 41
    route, m, x, gate, bias, (g, u, d), sh, bufs = _block_case(rng, R, n, "bf16", False)
    dm, dg, du, dd = (cuda.to_device(a) for a in (m, g, u, d))
    tall = lin._TALL_SWIGLU if lin._SIM else lin._EXPERT_RING
    assert moe_mod._expert_tiles(dm, dg, du, dd, bufs, "fp32") == (tall, tall)
    few = MoEBuffers(2, 8, 3, 24, 12)
    if lin._SIM:                                   # few rows: the down chooses its own
        assert moe_mod._expert_tiles(dm, dg, du, dd, few, "fp32")[1] is None
    else:                                          # ... unless the gate|up rings (8-row items)
        assert moe_mod._expert_tiles(dm, dg, du, dd, few, "fp32") == (lin._FEW_EXPERT_RING,) * 2
    # 30 typical rows: a gate|up of one row tile a warp (8-row work items); where the down's own
    # choice is a staged tile of taller blocks (the simulator's, from 24 rows), it takes the gate|up's
    mid = MoEBuffers(40, 8, 3, 24, 12)
    up, down = moe_mod._expert_tiles(dm, dg, du, dd, mid, "fp32")
    own = lin._grouped_tile(mid.act, dd, mid.max_rows, precision="fp32", **moe_mod._expert_tiling(mid))
    if isinstance(own, lin._Staged) and own != up:
        assert up != lin._TALL_SWIGLU and lin._rows_a_tile(own) > lin._rows_a_tile(up) and down == up
    got = _run_block(route, m, x, gate, bias, (g, u, d), sh, bufs, n)
    ids, w = ref.moe_route(m[:n], gate, bias, "sigmoid", "noaux_tc", 4, 2, 3, True, 2.5)
    want = x[:n] + ref.moe_experts(m[:n], ids, w, _widen(g), _widen(u), _widen(d))
    assert _rel_err(got[:n], want) <= FP32_MODE_REL
    assert bufs.item_rows == 16


def test_moe_block_sizes_its_expert_grids_by_its_own_sort(rng):
    """The buffers' last sort made taller work items (so fewer fit its grid); a block's grouped
    GEMMs must take the work items of the block's own sort, made for its 8-row tile, or the items
    past the stale grid are never multiplied (their rows keep the poison)."""
    R = n = 24                                     # 72 slots on 8 experts: some hold more than 8
    route, m, x, gate, bias, experts, sh, bufs = _block_case(rng, R, n, "bf16", False)
    stale = np.tile(np.arange(bufs.top_k, dtype=np.int32), (R, 1))
    _enqueue_moe_sort(cuda.to_device(stale), cuda.to_device(np.ones((R, bufs.top_k), np.float32)), bufs,
                      cuda.to_device(np.array([R], np.int32)), item_rows=1024)
    bufs.expert_out.copy_to_device(np.full(bufs.expert_out.shape, np.nan, np.float32))
    got = _run_block(route, m, x, gate, bias, experts, sh, bufs, n, tile=kn.TILES["small"])
    assert bufs.item_rows == 8 and len(bufs.work_items()) // 3 > work_item_capacity(8, R * 3, 1024)
    ids, w = ref.moe_route(m, gate, bias, "sigmoid", "noaux_tc", 4, 2, 3, True, 2.5)
    assert (np.bincount(ids.ravel(), minlength=8) > 8).any()      # an expert needs two items
    want = x + ref.moe_experts(m, ids, w, *(_widen(a) for a in experts))
    assert _rel_err(got, want) <= FP32_MODE_REL


def test_moe_block_row_alone_equals_row_in_batch_bit_for_bit(rng):
    R, r = 8, 5
    route, m, x, gate, bias, experts, sh, bufs = _block_case(rng, R, R, np.float32)
    batch = _run_block(route, m, x, gate, bias, experts, sh, bufs, R)
    small = MoEBuffers(1, *[getattr(bufs, f) for f in ("n_experts", "top_k", "hidden", "inter",
                                                      "shared_inter")])
    alone = _run_block(route, m[r:r + 1], x[r:r + 1], gate, bias, experts, sh, small, 1)
    np.testing.assert_array_equal(alone[0].view(np.uint32), batch[r].view(np.uint32))
    # elsewhere in the batch (rows reversed) with fewer live rows: row r sits at R - 1 - r = 2
    part = _run_block(route, m[::-1].copy(), x[::-1].copy(), gate, bias, experts, sh, bufs, R - 2)
    np.testing.assert_array_equal(part[R - 1 - r].view(np.uint32), batch[r].view(np.uint32))


def test_moe_route_config_checks():
    with pytest.raises(ValueError, match="topk_group"):
        MoERoute("softmax", "group_limited_greedy", 2, 3, 2, False, 1.0)
    with pytest.raises(ValueError, match="two best"):
        MoERoute("sigmoid", "noaux_tc", 4, 2, 2, True, 1.0).check_experts(4)
    with pytest.raises(ValueError, match="experts"):
        MoERoute("sigmoid", "greedy", 1, 1, 2, True, 1.0).check_experts(5000)


def test_work_items_cover_every_slot_once_in_runs_within_the_capacity(rng):
    """The twin of the sort's item table, against its definition: every slot of every expert in
    exactly one item, items of at most ``item_rows`` consecutive slots of one expert, experts and
    runs ascending; the worst cases fill ``work_item_capacity`` exactly, and more is refused."""
    for E, S, G in ((5, 0, 8), (5, 3, 8), (6, 40, 8), (64, 102, 16), (3, 70, 32)):
        for counts in (rng.multinomial(S, np.ones(E) / E), np.eye(E, dtype=int)[0] * S,
                       np.bincount(np.arange(S) % E, minlength=E)):
            offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
            cap = work_item_capacity(E, S, G)
            items = expert_work_items(offsets, G, cap).reshape(cap, 3)
            used = items[items[:, 2] > items[:, 1]]
            assert (items[len(used):] == 0).all()                            # then only empty ones
            slots = np.concatenate([np.arange(a, b) for _, a, b in used] + [np.zeros(0, int)])
            np.testing.assert_array_equal(slots, np.arange(S))              # each slot once, in order
            for e, a, b in used:
                assert offsets[e] <= a < b <= offsets[e + 1] and b - a <= G
                assert (a - offsets[e]) % G == 0
            assert len(used) == sum(-(-c // G) for c in counts)
    # the bound is reached: E experts of one slot each, and the rest in full runs
    E, G = 4, 8
    counts = np.array([1, 1, 1, 1 + 3 * G])
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    assert len(expert_work_items(offsets, G, work_item_capacity(E, counts.sum(), G))) == 3 * (E + 3)
    assert work_item_capacity(E, counts.sum(), G) == E + 3
    with pytest.raises(ValueError, match="need more than"):
        expert_work_items(offsets, G, E + 2)


def test_combine_sums_experts_in_ascending_id_whatever_the_pick_order():
    """Values chosen so that float32 addition order shows: 1 + 1e8 - 1e8 = 0 in ascending id,
    but 1 in the best-first order below."""
    R, E, K, M = 3, 5, 3, 2
    ids = np.array([[3, 4, 0], [4, 1, 3], [2, 0, 1]], np.int32)       # best first, not by id
    val = np.array([1.0, 1.0, 3.0, 1e8, -1e8], np.float32)              # expert e outputs val[e]
    bufs = MoEBuffers(R, E, K, M, 4)
    n_rows = cuda.to_device(np.array([R], np.int32))
    _enqueue_moe_sort(cuda.to_device(ids), cuda.to_device(np.ones((R, K), np.float32)), bufs, n_rows)
    off = bufs.offsets.copy_to_host()
    slot_expert = np.searchsorted(off, np.arange(R * K), side="right") - 1
    bufs.expert_out.copy_to_device(np.repeat(val[slot_expert][:, None], M, 1).astype(np.float32))
    out = cuda.to_device(np.full((R, M), np.nan, np.float32))
    _enqueue_moe_combine(bufs, None, out, n_rows, residual=False)
    want = np.zeros(R, np.float32)
    for r in range(R):
        for e in np.sort(ids[r]):
            want[r] = np.float32(want[r] + val[e])
    np.testing.assert_array_equal(out.copy_to_host(), np.repeat(want[:, None], M, 1))
    assert want[0] == 0  # ascending: 1 + 1e8 - 1e8 -> 0; best first (1e8 - 1e8 + 1) would give 1
