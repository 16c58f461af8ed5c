"""Mixture-of-experts on the GPU; twins: ``reference.moe.moe_route``, ``moe_experts``, ``swiglu_mlp``.

Shapes: R rows (tokens; ``n_rows[0]`` of them live), M hidden size, E routed experts, G groups
(``n_group``), K experts per token, I expert intermediate size, Is shared-expert intermediate
size (I * n_shared_experts). A *slot* is one (token, expert) pair; there are n * K of them.

One MoE block (``enqueue_moe_block``), every step on the device, no host round trip:

1. router GEMM ``logits = m @ gate.T`` (``linear.enqueue_linear``)                  [R, E]
2. routing (``_route_kernel``, one block per row): softmax / sigmoid scores, + bias for
   noaux_tc, group selection, top-K with ties to the lower id (a rank count: expert e is
   the r-th pick iff exactly r experts beat it under (value desc, id asc)), weights
   normalised and scaled exactly as the twin orders the float operations.
3. counting sort (``_sort_kernel``, one block): a bitmap [E, ceil(R/32)] marks which tokens
   chose each expert; per-expert popcounts give ``offsets [E+1]``; a slot's position is
   offsets[e] + (tokens < r marked for e), so tokens ascend inside an expert and the
   result is the same for any thread count or timing (the only atomics are bit ORs).
4. grouped SwiGLU GEMM over the gathered token rows and grouped down GEMM
   (``linear._enqueue_grouped_linear``): a row of blocks for each work item, a run of an
   expert's slots as tall as the gate|up tile's rows, which the sort writes beside the offsets;
   an expert without rows gets no block.
5. shared experts through ``_enqueue_swiglu`` + ``enqueue_linear``.
6. combine (``_combine_kernel``): per token, out = 0; out = fma(y_e, w_e, out) over its
   experts in ascending id (= ascending slot, since slots are sorted by expert); + shared;
   x + that. The order is the twin's and never depends on the batch.

Batch invariance: every step reduces in an order fixed by E, K, M, I and the compiled thread
counts, never by the number of rows, so a row's output is bit-identical alone or in a batch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from numba import config, cuda, float32, int32, uint32

from .._checks import check_array, check_int, check_precision
from .._device import (SideStream, cached, ceil_div, device_function, float32_out, fma, grid_dependency_after,
                       is_device, launcher_result, rows_device, to_device)
from ..dtypes import STORAGE_DTYPES
from ._widen import KINDS
from ..reference.moe import work_item_capacity
from .linear import (_TALL_SWIGLU, _grouped_tile, _rows_a_tile, _Staged, _enqueue_grouped_linear, enqueue_linear,
                     _enqueue_swiglu)

ROUTER_PRECISION = "fp32"   # HF computes the router in float32 whatever the model's dtype
# The shared experts on a second stream, beside the routed ones (``enqueue_moe_block``; the same
# bits). Measured on the H200 (tools/moe_stages.py prints the block both ways, Moonlight shape):
# 119 -> 100 µs a block at 1 row, 326 -> 289 at 17, 549 -> 526 at 65, 1,472 -> 1,367 at 272.
CONCURRENT_SHARED = True

SIM = config.ENABLE_CUDASIM
# The simulator runs every thread as a Python thread: tiny blocks there, H200 sizes elsewhere.
ROUTE_THREADS = 8 if SIM else 128     # one block per token row; E_MAX / threads experts each
SORT_THREADS = 8 if SIM else 512      # the whole counting sort is one block
# (Routing and sorting in one launch, the routing's last row block to finish sorting every row,
# was measured on the H200 and not kept: route + sort µs in a graph at 1 / 17 / 65 rows, two
# launches 18.1 / 18.7 / 19.4, one launch 18.1 / 18.8 / 19.6; 69c74fd, 6ee5d65.)
COMBINE_THREADS = 16 if SIM else 128  # columns per block of the combine; grid y = rows
E_MAX = 1024                          # routed experts the routing kernel holds in shared memory

SCORING_FUNCS = ("softmax", "sigmoid")
TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")

if SIM:
    def _expf(v):
        """float32 exp (numpy: inf on overflow where math.exp raises)."""
        with np.errstate(over="ignore"):
            return np.float32(np.exp(np.float32(v)))
else:
    @device_function
    def _expf(v):
        """float32 exp (libdevice expf on a float32 argument)."""
        return float32(math.exp(v))


@dataclass(frozen=True)
class MoERoute:
    """The routing parameters of a MoE layer (the config keys of the same names)."""

    scoring_func: str             # "softmax" | "sigmoid"
    topk_method: str              # "greedy" | "group_limited_greedy" | "noaux_tc"
    n_group: int                  # G (ignored by greedy)
    topk_group: int               # groups kept (ignored by greedy)
    top_k: int                    # K, num_experts_per_tok
    norm_topk_prob: bool
    routed_scaling_factor: float

    def __post_init__(self):
        if self.scoring_func not in SCORING_FUNCS:
            raise ValueError(f"scoring_func {self.scoring_func!r} is not softmax or sigmoid")
        if self.topk_method not in TOPK_METHODS:
            raise ValueError(
                f"topk_method {self.topk_method!r} is not greedy, group_limited_greedy or noaux_tc")
        check_int("top_k", self.top_k, 1)
        if self.topk_method != "greedy":
            check_int("n_group", self.n_group, 1)
            check_int("topk_group", self.topk_group, 1, self.n_group)
        if not math.isfinite(float(self.routed_scaling_factor)):
            raise ValueError(f"routed_scaling_factor must be finite, got {self.routed_scaling_factor}")

    def check_experts(self, n_experts: int):
        """ValueError unless these parameters fit ``n_experts`` routed experts."""
        e = n_experts
        if e < 1 or e > E_MAX:
            raise ValueError(f"the routing kernel takes 1 to {E_MAX} experts, got {e}")
        if self.top_k > e:
            raise ValueError(f"top_k={self.top_k} exceeds the {e} experts")
        if self.topk_method != "greedy":
            if e % self.n_group:
                raise ValueError(f"{e} experts do not divide into n_group={self.n_group} equal groups")
            if self.topk_method == "noaux_tc" and e // self.n_group < 2:
                raise ValueError("noaux_tc scores a group by its two best experts: needs >= 2 experts per group")

    # kernel arguments: small ints, so one compiled kernel serves every layer
    @property
    def _scoring_code(self) -> int:
        return SCORING_FUNCS.index(self.scoring_func)

    @property
    def _method_code(self) -> int:
        return TOPK_METHODS.index(self.topk_method)


class MoEBuffers:
    """Every device buffer one MoE block needs, for up to ``max_rows`` tokens (allocated once;
    layers of the same shape share one). ``shared_inter`` = Is (0: no shared experts)."""

    def __init__(self, max_rows, n_experts, top_k, hidden, inter, shared_inter=0, *, stream=0):
        R, E, K, M, I = (check_int(n, v, 1) for n, v in (
            ("max_rows", max_rows), ("n_experts", n_experts), ("top_k", top_k), ("hidden", hidden),
            ("inter", inter)))
        Is = check_int("shared_inter", shared_inter, 0)
        W = ceil_div(R, 32)

        def arr(shape, dt):
            return cuda.device_array(shape, dt, stream=stream)

        self.max_rows, self.n_experts, self.top_k, self.hidden, self.inter = R, E, K, M, I
        self.shared_inter = Is
        self.logits = arr((R, E), np.float32)            # [R, E]    router logits
        self.topk_ids = arr((R, K), np.int32)            # [R, K]    chosen experts, best first
        self.topk_weights = arr((R, K), np.float32)      # [R, K]    their weights
        self.bitmap = arr((E, W), np.uint32)             # [E, W]    bit r%32 of word r//32: token r chose e
        self.word_prefix = arr((E, W), np.int32)         # [E, W]    tokens marked for e in words < w
        self.offsets = arr(E + 1, np.int32)              # [E+1]     expert e's slots: offsets[e] .. offsets[e+1]
        self.slot_token = arr(R * K, np.int32)           # [R*K]     slot -> token row
        self.slot_weight = arr(R * K, np.float32)        # [R*K]     slot -> routing weight
        self.token_slot = arr((R, K), np.int32)          # [R, K]    token -> its slots, ascending (= by expert id)
        # the grouped GEMMs' work items, (expert, first slot, end slot) triples: room for items of
        # as few as 8 rows (one mma row tile); the sort writes them for ``item_rows``
        self.items = arr(3 * work_item_capacity(E, R * K, 8), np.int32)   # [3*Y]
        self.item_rows = 8                               # the rows of an item in ``items`` (the last sort's)
        self._item_views = {}
        self.side = SideStream()                         # the shared experts' stream (``concurrent``)
        self.act = arr((R * K, I), np.float32)           # [R*K, I]  silu(gate) * up per slot
        self.expert_out = arr((R * K, M), np.float32)    # [R*K, M]  down projection per slot (unweighted)
        self.shared_act = arr((R, Is), np.float32) if Is else None   # [R, Is] shared SwiGLU activation
        self.shared_out = arr((R, M), np.float32) if Is else None    # [R, M]  shared-expert output
        self.zero_bias = cuda.to_device(np.zeros(E, np.float32), stream=stream)  # [E] stands in for no bias

    def work_items(self):
        """The part of ``items`` the last sort can have filled: [3 * Y] for Y the most work items
        of ``item_rows`` slots (``reference.moe.work_item_capacity``); made once a size."""
        view = self._item_views.get(self.item_rows)
        if view is None:
            capacity = work_item_capacity(self.n_experts, self.max_rows * self.top_k, self.item_rows)
            view = self._item_views[self.item_rows] = self.items[:3 * capacity]
        return view


# -- kernels ------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _route_kernel(threads):
    """One block per row r < n_rows[0]: logits [R, E] -> topk_ids [R, K], topk_weights [R, K].

    scoring 0 softmax / 1 sigmoid; method 0 greedy / 1 group_limited_greedy / 2 noaux_tc.
    """
    T = threads

    @cached
    @cuda.jit
    def kernel(logits, bias, scoring, method, n_group, topk_group, top_k, norm, scale, n_rows,
               topk_ids, topk_weights):
        grid_dependency_after((logits, bias, scoring, method, n_group, topk_group, top_k, norm, scale, n_rows,
                               topk_ids, topk_weights))
        r = cuda.blockIdx.x
        t = cuda.threadIdx.x
        E = logits.shape[1]
        # A thread's first logit and bias are loaded with n_rows, not after it: one trip to
        # memory on the block's chain instead of two (three for noaux_tc's bias). The grid is the
        # logits' rows, so row r exists whatever n_rows says.
        x_first = logits[r, t] if t < E else float32(0.0)
        b_first = bias[t] if t < bias.shape[0] else float32(0.0)
        if r >= n_rows[0]:  # the whole block leaves together, before any barrier
            return
        score = cuda.shared.array(E_MAX, float32)   # [E] scores (the weights come from these)
        choice = cuda.shared.array(E_MAX, float32)  # [E] what the top-K ranks (bias, group mask)
        gscore = cuda.shared.array(E_MAX, float32)  # [G] group scores
        gkeep = cuda.shared.array(E_MAX, int32)     # [G] 1: group kept
        red = cuda.shared.array(T, float32)
        chosen = cuda.shared.array(E_MAX, int32)    # [K] the picks, best first (thread 0 weighs them)
        neg_inf = float32(-math.inf)

        if scoring == 0:
            # softmax: max, then exp and a sum in a fixed order (strided per thread, then a tree)
            mx = neg_inf
            for e in range(t, E, T):
                mx = max(mx, x_first if e == t else logits[r, e])
            red[t] = mx
            cuda.syncthreads()  # every partial max is in
            s = T // 2
            while s > 0:
                if t < s:
                    red[t] = max(red[t], red[t + s])
                cuda.syncthreads()  # this level is done
                s //= 2
            mx = red[0]
            cuda.syncthreads()  # everyone has the max before red is reused
            acc = float32(0.0)
            for e in range(t, E, T):
                z = _expf((x_first if e == t else logits[r, e]) - mx)
                score[e] = z
                acc = acc + z
            red[t] = acc
            cuda.syncthreads()  # every partial sum is in
            s = T // 2
            while s > 0:
                if t < s:
                    red[t] = red[t] + red[t + s]
                cuda.syncthreads()
                s //= 2
            total = red[0]
            for e in range(t, E, T):
                score[e] = score[e] / total
        else:
            for e in range(t, E, T):
                score[e] = float32(1.0) / (float32(1.0) + _expf(-(x_first if e == t else logits[r, e])))
        for e in range(t, E, T):
            choice[e] = score[e] + (b_first if e == t else bias[e]) if method == 2 else score[e]
        cuda.syncthreads()  # scores and choices complete

        if method != 0:
            gsize = E // n_group
            for g in range(t, n_group, T):
                b1 = neg_inf
                b2 = neg_inf
                for e in range(g * gsize, (g + 1) * gsize):
                    v = choice[e]
                    if v > b1:
                        b2 = b1
                        b1 = v
                    elif v > b2:
                        b2 = v
                gscore[g] = b1 if (method == 1 or gsize == 1) else b1 + b2
            cuda.syncthreads()  # every group score is in
            for g in range(t, n_group, T):
                v = gscore[g]
                rank = 0
                for h in range(n_group):
                    o = gscore[h]
                    if o > v or (o == v and h < g):
                        rank += 1
                gkeep[g] = 1 if rank < topk_group else 0
            cuda.syncthreads()  # the kept groups are known
            for e in range(t, E, T):
                if gkeep[e // gsize] == 0:
                    choice[e] = neg_inf
            cuda.syncthreads()  # masked choices are in

        # top-K: e's rank = #experts before it under (choice desc, id asc); stop counting at K
        for e in range(t, E, T):
            v = choice[e]
            rank = 0
            for f in range(E):
                o = choice[f]
                if o > v or (o == v and f < e):
                    rank += 1
                    if rank >= top_k:
                        break
            if rank < top_k:
                topk_ids[r, rank] = e
                chosen[rank] = e
        cuda.syncthreads()  # the picks are in
        # (thread 0 reads them from shared memory: reading topk_ids back, each a dependent trip
        # to L2 after the other threads' stores, was 2 top_k of them in a chain)
        if t == 0:
            denom = float32(1.0)
            if norm != 0:
                wsum = float32(0.0)
                for k in range(top_k):
                    wsum = wsum + score[chosen[k]]
                denom = wsum + float32(1e-20)
            for k in range(top_k):
                w = score[chosen[k]]
                if norm != 0:
                    w = w / denom
                topk_weights[r, k] = w * scale

    return kernel


@functools.lru_cache(maxsize=None)
def _sort_kernel(threads):
    """One block: group the n * K slots of rows r < n_rows[0] by expert (tokens ascending).

    topk_ids [R, K] int32, topk_weights [R, K] f32 -> bitmap / word_prefix [E, W] (scratch),
    offsets [E+1], slot_token [R*K], slot_weight [R*K], token_slot [R, K] (ascending), items
    [3*Y] (the work items of ``item_rows`` slots, ``reference.moe.expert_work_items``).
    """
    T = threads

    @cached
    @cuda.jit
    def kernel(topk_ids, topk_weights, n_rows, bitmap, word_prefix, offsets, slot_token,
               slot_weight, token_slot, items, item_rows):
        grid_dependency_after((topk_ids, topk_weights, n_rows, bitmap, word_prefix, offsets, slot_token, slot_weight,
                               token_slot, items, item_rows))
        t = cuda.threadIdx.x
        n = n_rows[0]
        K = topk_ids.shape[1]
        E = bitmap.shape[0]
        nw = (n + 31) // 32
        tot = cuda.shared.array(T, int32)
        tot_items = cuda.shared.array(T, int32)

        for i in range(t, E * nw, T):  # clear the words live rows use
            bitmap[i // nw, i % nw] = uint32(0)
        cuda.syncthreads()  # cleared before anyone marks
        for p in range(t, n * K, T):
            rr = p // K
            e = topk_ids[rr, p - rr * K]
            cuda.atomic.or_(bitmap, (e, rr >> 5), uint32(1) << uint32(rr & 31))
        cuda.syncthreads()  # every mark is in

        # per-expert counts and word prefixes; thread t owns the experts [e0, e1)
        chunk = (E + T - 1) // T
        e0 = min(t * chunk, E)
        e1 = min(e0 + chunk, E)
        own = 0
        own_items = 0
        for e in range(e0, e1):
            c = 0
            for w in range(nw):
                word_prefix[e, w] = c
                c += cuda.popc(bitmap[e, w])
            offsets[e + 1] = c  # the count for now; the running offset below
            own += c
            own_items += (c + item_rows - 1) // item_rows
        tot[t] = own
        tot_items[t] = own_items
        cuda.syncthreads()  # every thread's total is in
        s = 1
        while s < T:  # inclusive scans of tot and tot_items (Hillis-Steele)
            v = tot[t - s] if t >= s else 0
            vi = tot_items[t - s] if t >= s else 0
            cuda.syncthreads()  # all reads of this step before its writes
            tot[t] += v
            tot_items[t] += vi
            cuda.syncthreads()  # all writes before the next step's reads
            s *= 2
        base = tot[t] - own
        y = tot_items[t] - own_items  # the first work item of this thread's experts
        if t == 0:
            offsets[0] = 0
        for e in range(e0, e1):  # expert e's work items: its slots in runs of item_rows
            c = offsets[e + 1]
            for first in range(base, base + c, item_rows):
                items[3 * y] = e
                items[3 * y + 1] = first
                items[3 * y + 2] = min(first + item_rows, base + c)
                y += 1
            base += c
            offsets[e + 1] = base
        for i in range(tot_items[T - 1] + t, items.shape[0] // 3, T):  # the unused items: empty
            items[3 * i] = 0
            items[3 * i + 1] = 0
            items[3 * i + 2] = 0
        cuda.syncthreads()  # offsets and prefixes are visible to the block

        for rr in range(t, n, T):  # one thread per token row
            w = rr >> 5
            below = (uint32(1) << uint32(rr & 31)) - uint32(1)
            for k in range(K):
                e = topk_ids[rr, k]
                pos = offsets[e] + word_prefix[e, w] + cuda.popc(bitmap[e, w] & below)
                slot_token[pos] = rr
                slot_weight[pos] = topk_weights[rr, k]
                i = k  # insert pos into the row's ascending list
                while i > 0 and token_slot[rr, i - 1] > pos:
                    token_slot[rr, i] = token_slot[rr, i - 1]
                    i -= 1
                token_slot[rr, i] = pos

    return kernel


@functools.lru_cache(maxsize=None)
def _combine_kernel(has_shared: bool, residual: bool):
    """For rows r < n_rows[0] and columns c: acc = 0; acc = fma(y[j, c], w[j], acc) for the
    row's slots j ascending (= its experts by ascending id); [+ shared[r, c]];
    out[r, c] = out[r, c] + acc (``residual``) or acc.
    expert_out [R*K, M], slot_weight [R*K], token_slot [R, K], shared_out [R, M], out [R, M]."""

    @cached
    @cuda.jit
    def kernel(expert_out, slot_weight, token_slot, shared_out, out, n_rows):
        grid_dependency_after((expert_out, slot_weight, token_slot, shared_out, out, n_rows))   # PDL (_device.py)
        c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        r = cuda.blockIdx.y
        if r >= n_rows[0] or c >= out.shape[1]:
            return
        acc = float32(0.0)
        for k in range(token_slot.shape[1]):
            j = token_slot[r, k]
            acc = fma(expert_out[j, c], slot_weight[j], acc)
        if has_shared:
            acc = acc + shared_out[r, c]
        if residual:
            out[r, c] = out[r, c] + acc
        else:
            out[r, c] = acc

    return kernel


# -- the device tier (device arrays only, no checks, no allocation; docs/DESIGN.md §3) ----------

def _enqueue_moe_route(logits, bias, route, *, topk_ids, topk_weights, n_rows, stream=0):
    """Route rows r < n_rows[0]; twin: ``reference.moe.moe_route`` after its router GEMM.

    logits [R, E] f32, bias [E] f32 (read by noaux_tc only), route ``MoERoute`` -> topk_ids [R, K]
    int32 (best first), topk_weights [R, K] f32."""
    _route_kernel(ROUTE_THREADS)[logits.shape[0], ROUTE_THREADS, stream](
        logits, bias, route._scoring_code, route._method_code, route.n_group, route.topk_group,
        route.top_k, int(bool(route.norm_topk_prob)), np.float32(route.routed_scaling_factor),
        n_rows, topk_ids, topk_weights)


def _enqueue_moe_sort(topk_ids, topk_weights, bufs, n_rows, *, item_rows=8, offsets=None, stream=0):
    """Counting sort of rows r < n_rows[0] by expert into ``bufs`` (offsets, slot_token,
    slot_weight, token_slot), and the grouped GEMMs' work items of ``item_rows`` slots (a
    multiple of 8; recorded as ``bufs.item_rows``, which sizes their grids); twins: the grouping
    of ``reference.moe.moe_experts``, ``reference.moe.expert_work_items``.

    topk_ids [R, K] int32 (distinct per row), topk_weights [R, K] f32; ``offsets`` [E + 1] int32
    device: where the experts' slot offsets go instead of ``bufs.offsets`` (nothing after the
    sort reads them: the grouped GEMMs and the combine go by the work items and the slots)."""
    if item_rows < 8 or item_rows % 8:
        raise ValueError(f"item_rows must be a positive multiple of 8 (an mma row tile), got {item_rows}")
    bufs.item_rows = item_rows
    _sort_kernel(SORT_THREADS)[1, SORT_THREADS, stream](
        topk_ids, topk_weights, n_rows, bufs.bitmap, bufs.word_prefix, bufs.offsets if offsets is None else offsets,
        bufs.slot_token, bufs.slot_weight, bufs.token_slot, bufs.items, item_rows)


def _enqueue_moe_experts(x, experts_gate, experts_up, experts_down, bufs, *, precision, tile=None, stream=0):
    """After ``_enqueue_moe_sort``: bufs.expert_out[j] = down_e(silu(gate_e(x[t])) * up_e(x[t]))
    for every slot j = (token t, expert e); twin: the experts of ``reference.moe.moe_experts``.

    x [R, M] f32, experts_gate / up [E, I, M], experts_down [E, M, I]; ``precision`` and ``tile``
    as in ``enqueue_linear``."""
    for _, launch in _expert_launches(x, experts_gate, experts_up, experts_down, bufs, precision, tile, stream):
        launch()


def _expert_tiling(bufs):
    """The grouped GEMMs' tile arguments: tiles sized for an expert's typical share (twice the
    balanced T*K/E rows), chunk splits for the experts that can hold rows."""
    typical = 2 * ceil_div(bufs.max_rows * bufs.top_k, bufs.n_experts)
    live = min(bufs.n_experts, bufs.max_rows * bufs.top_k)         # experts that can hold rows
    return dict(tile_rows=typical, live_groups=live)


def _expert_tiles(x, experts_gate, experts_up, experts_down, bufs, precision, tile=None):
    """(gate|up tile, down tile) of the grouped GEMMs: ``tile`` for both if forced; else the
    gate|up's chosen tile, and the down's own choice (None) unless the gate|up took linear's
    ``_TALL_SWIGLU`` or a cp.async ring (``_EXPERT_RING`` on a GPU), or the down's own choice is a
    staged tile of more rows than the gate|up's.
    Then the down takes the gate|up's tile too: the work items are that tile's rows (16 for
    ``_TALL_SWIGLU``), and a staged down (64-row blocks on the H200) would walk each with mostly
    padding (H200, Moonlight's experts at 272 rows: down 667 µs so, 358 µs at the shared tile)."""
    if tile is not None:
        return tile, tile
    tiling = _expert_tiling(bufs)
    up = _grouped_tile(x, experts_gate, bufs.max_rows, precision=precision, w_up=experts_up, **tiling)
    # the down's own choice, over the work items of the gate|up tile's rows (``_expert_item_rows``)
    own = _grouped_tile(bufs.act, experts_down, bufs.max_rows, precision=precision, **tiling)
    return up, _down_tile(up, own)


def _down_tile(up, own):
    """The experts' down tile (``_expert_tiles``' rule; benchmarks/gemm.py asks it too): the
    gate|up's tile ``up`` when that is linear's ``_TALL_SWIGLU`` or a cp.async ring (a down that
    cannot take the ring takes the tile without it), or when the down's own choice ``own`` is a
    staged tile of more rows; else None (the down's launch takes its own choice)."""
    if up == _TALL_SWIGLU or (isinstance(up, _Staged) and up.NS):
        return up
    return up if isinstance(own, _Staged) and _rows_a_tile(own) > _rows_a_tile(up) else None


def _expert_item_rows(x, experts_gate, experts_up, bufs, *, precision, tile=None):
    """The work-item size for ``_enqueue_moe_sort`` that gives each block of the gate|up tile
    (``tile`` if forced, else the chosen one) one row tile: the rows it multiplies at once."""
    up = _grouped_tile(x, experts_gate, bufs.max_rows, precision=precision, w_up=experts_up, tile=tile,
                       **_expert_tiling(bufs))
    return _rows_a_tile(up)


def _expert_launches(x, experts_gate, experts_up, experts_down, bufs, precision, tile, stream):
    """``_enqueue_moe_experts``'s two grouped GEMMs as (name, launch()) pairs: a row of blocks
    for each work item the ``_enqueue_moe_sort`` enqueued before the launch can have written
    (``bufs.work_items()``, read when the launch is made, after the sort's)."""
    up_tile, down_tile = _expert_tiles(x, experts_gate, experts_up, experts_down, bufs, precision, tile)
    grouped = dict(precision=precision, stream=stream, **_expert_tiling(bufs))
    return [
        ("experts gate|up", lambda: _enqueue_grouped_linear(x, experts_gate, bufs.act, bufs.work_items(), bufs.max_rows,
                                                            row_index=bufs.slot_token, w_up=experts_up, tile=up_tile,
                                                            **grouped)),
        ("experts down", lambda: _enqueue_grouped_linear(bufs.act, experts_down, bufs.expert_out, bufs.work_items(),
                                                         bufs.max_rows, tile=down_tile, **grouped)),
    ]


def _enqueue_moe_combine(bufs, shared_out, out, n_rows, *, residual, stream=0):
    """out[r] (+)= sum over r's experts ascending of w * expert_out [+ shared_out[r]], r < n_rows[0];
    twin: the weighted sum of ``reference.moe.moe_experts``.

    shared_out [R, M] f32 or None, out [R, M] f32."""
    kernel = _combine_kernel(shared_out is not None, bool(residual))
    grid = (ceil_div(out.shape[1], COMBINE_THREADS), bufs.max_rows)
    kernel[grid, COMBINE_THREADS, stream](
        bufs.expert_out, bufs.slot_weight, bufs.token_slot,
        bufs.expert_out if shared_out is None else shared_out, out, n_rows)


def enqueue_swiglu_mlp(x, gate_w, up_w, down_w, out, *, act, n_rows, precision, accumulate=False, tile=None,
                       norm=None, stream=0):
    """out[:n] (+)= down(silu(gate(x[:n])) * up(x[:n])) for n = n_rows[0]; twin:
    ``reference.moe.enqueue_swiglu_mlp`` (with ``accumulate`` it is the residual add x + mlp(m)).

    x [R, M] f32, gate_w / up_w [I, M], down_w [M, I], act [R, I] f32 scratch, out [R, M] f32.
    ``norm`` = (weight [M] f32, eps, scratch [R, M] f32): the MLP of the rows' RMSNorm, the norm
    launched into scratch before the gate|up (``linear.enqueue_linear``'s ``norm``); out may then
    be x itself (the residual: x += mlp(rms_norm(x)))."""
    _enqueue_swiglu(x, gate_w, up_w, act, n_rows, precision=precision, tile=tile, norm=norm, stream=stream)
    enqueue_linear(act, down_w, out, n_rows, precision=precision, accumulate=accumulate, tile=tile,
                   stream=stream)


def enqueue_moe_block(m, x, *, gate, bias, experts_gate, experts_up, experts_down, shared_gate=None,
                      shared_up=None, shared_down=None, route, bufs, n_rows, precision, tile=None,
                      concurrent=None, offsets=None, stream=0):
    """x[r] += routed(m[r]) + shared(m[r]) for r < n_rows[0] <= bufs.max_rows; 8 launches (6
    without shared experts). Twin: ``reference.moe.enqueue_moe_block`` (``reference.moe.moe_route``,
    the experts of ``moe_experts`` and ``swiglu_mlp`` for the shared ones, as the target's MoE layer
    adds them).

    m / x [>= max_rows, M] f32 (m post-attention-normed, x the residual stream), gate [E, M],
    bias [E] f32 or None, experts_gate / up [E, I, M], experts_down [E, M, I], shared_* [Is, M] /
    [M, Is] or None (then ``bufs.shared_inter`` may be 0), route ``MoERoute``, bufs
    ``MoEBuffers``, n_rows [1] int32 device; ``precision`` (the experts') and ``tile`` as in
    ``enqueue_linear``. The router GEMM is always 'fp32', as HF computes it in float32: a
    rounded router logit could pick another expert.

    ``concurrent`` (default ``CONCURRENT_SHARED``): the shared experts run on a second stream
    (``bufs.side``), forked from ``stream`` at the block's start and joined before the
    combine, so that a captured graph runs them beside the routed ones instead of after them.
    The same launches on the same inputs: the same bits.

    ``offsets`` [E + 1] int32 device, or None (``bufs.offsets``): where the counting sort leaves
    the routed experts' slot offsets, offsets[e + 1] - offsets[e] the rows routed to expert e (a
    batched forward keeps each layer's for its expert statistics)."""
    if concurrent is None:
        concurrent = CONCURRENT_SHARED
    concurrent = concurrent and shared_gate is not None
    side = bufs.side.fork(stream) if concurrent else None      # the shared experts start with the block ...
    launches = _moe_block_launches(m, x, gate=gate, bias=bias, experts_gate=experts_gate, experts_up=experts_up,
                                   experts_down=experts_down, shared_gate=shared_gate, shared_up=shared_up,
                                   shared_down=shared_down, route=route, bufs=bufs, n_rows=n_rows,
                                   precision=precision, tile=tile, stream=stream, shared_stream=side,
                                   offsets=offsets)
    for name, launch in launches:
        if concurrent and name == "combine":
            bufs.side.join(stream)            # ... and end before the combine reads shared_out
        launch()


def _moe_block_launches(m, x, *, gate, bias, experts_gate, experts_up, experts_down, shared_gate=None,
                        shared_up=None, shared_down=None, route, bufs, n_rows, precision, tile=None, stream=0,
                        shared_stream=None, offsets=None):
    """The launches of ``enqueue_moe_block`` (same arguments), in order, as (name, launch())
    pairs: ``tools/moe_stages.py`` times them one by one. The shared experts' go to
    ``shared_stream`` if given (the caller orders it), else to ``stream``."""
    sstream = stream if shared_stream is None else shared_stream
    item_rows = _expert_item_rows(m, experts_gate, experts_up, bufs, precision=precision, tile=tile)
    launches = [
        ("router", lambda: enqueue_linear(m, gate, bufs.logits, n_rows, precision=ROUTER_PRECISION, tile=tile,
                                          stream=stream)),
        ("route", lambda: _enqueue_moe_route(bufs.logits, bufs.zero_bias if bias is None else bias, route,
                                             topk_ids=bufs.topk_ids, topk_weights=bufs.topk_weights,
                                             n_rows=n_rows, stream=stream)),
        ("sort", lambda: _enqueue_moe_sort(bufs.topk_ids, bufs.topk_weights, bufs, n_rows, item_rows=item_rows,
                                           offsets=offsets, stream=stream)),
        *_expert_launches(m, experts_gate, experts_up, experts_down, bufs, precision, tile, stream),
    ]
    if shared_gate is not None:
        launches += [
            ("shared gate|up", lambda: _enqueue_swiglu(m, shared_gate, shared_up, bufs.shared_act, n_rows,
                                                       precision=precision, tile=tile, stream=sstream)),
            ("shared down", lambda: enqueue_linear(bufs.shared_act, shared_down, bufs.shared_out, n_rows,
                                                   precision=precision, tile=tile, stream=sstream)),
        ]
    launches.append(("combine", lambda: _enqueue_moe_combine(bufs, None if shared_gate is None else bufs.shared_out,
                                                             x, n_rows, residual=True, stream=stream)))
    return launches


# -- public launchers (twins in reference.moe) --------------------------------------------------

def _check_weight(name, w, ndim, shape=None):
    check_array(name, w, ndim, STORAGE_DTYPES, shape=shape)
    return KINDS[np.dtype(w.dtype)]


def moe_route(x, gate_weight, e_score_correction_bias, scoring_func, topk_method, n_group,
              topk_group, top_k, norm_topk_prob, routed_scaling_factor, *, out=None, stream=0):
    """Each token's experts and weights, on the GPU (router GEMM + one routing kernel).

    x [T, M] float32, gate_weight [E, M] (float32 / float16 / uint16 bf16 bits),
    e_score_correction_bias [E] float32 or None (noaux_tc needs it) -> topk_ids [T, K] int32
    (best first, ties to the lower id), topk_weights [T, K] float32. ``out``: a pair of
    device arrays ([T, K] int32, [T, K] float32) to fill; returned without a sync.
    """
    route = MoERoute(scoring_func, topk_method, n_group, topk_group, top_k, bool(norm_topk_prob),
                     routed_scaling_factor)
    check_array("x", x, 2, np.float32)
    _check_weight("gate_weight", gate_weight, 2, shape=(None, x.shape[1]))
    t, e = x.shape[0], gate_weight.shape[0]
    route.check_experts(e)
    if e_score_correction_bias is None:
        if topk_method == "noaux_tc":
            raise ValueError("noaux_tc routing needs e_score_correction_bias")
    else:
        check_array("e_score_correction_bias", e_score_correction_bias, 1, np.float32, shape=(e,))
    if out is None:
        ids = cuda.device_array((t, top_k), np.int32, stream=stream)
        weights = cuda.device_array((t, top_k), np.float32, stream=stream)
    else:
        ids, weights = out
        check_array("out[0]", ids, 2, np.int32, shape=(t, top_k))
        check_array("out[1]", weights, 2, np.float32, shape=(t, top_k))
    if t:
        n_rows = rows_device(t, stream)
        logits = cuda.device_array((t, e), np.float32, stream=stream)
        enqueue_linear(to_device(x, stream), to_device(gate_weight, stream), logits, n_rows,
                       precision=ROUTER_PRECISION, stream=stream)
        bias = (cuda.to_device(np.zeros(e, np.float32), stream=stream)
                if e_score_correction_bias is None else to_device(e_score_correction_bias, stream))
        _enqueue_moe_route(logits, bias, route, topk_ids=ids, topk_weights=weights, n_rows=n_rows,
                           stream=stream)
    if out is not None:
        return out
    if not is_device(x):
        return ids.copy_to_host(stream=stream), weights.copy_to_host(stream=stream)
    return ids, weights


def _check_mlp_weights(prefix, gate, up, down, ndim, m):
    lead = (None,) * (ndim - 2)
    kind = _check_weight(f"{prefix}gate", gate, ndim, shape=lead + (None, m))
    _check_weight(f"{prefix}up", up, ndim, shape=tuple(gate.shape))
    _check_weight(f"{prefix}down", down, ndim, shape=tuple(gate.shape[:-2]) + (m, gate.shape[-2]))
    if np.dtype(up.dtype) != np.dtype(gate.dtype):
        raise ValueError(f"{prefix}up has dtype {np.dtype(up.dtype).name} but {prefix}gate has "
                         f"{np.dtype(gate.dtype).name}; the SwiGLU GEMM reads both as one kind")
    return kind


def swiglu_mlp(x, gate_weight, up_weight, down_weight, *, precision="fp32", out=None, stream=0):
    """``down(silu(gate(x)) * up(x))`` on the GPU (two launches).

    x [T, M] float32, gate_weight / up_weight [I, M], down_weight [M, I] (float32 / float16 /
    uint16 bf16 bits; gate and up of one dtype) -> [T, M] float32. ``precision`` as in
    ``kernels.linear``.
    """
    check_precision(precision)
    check_array("x", x, 2, np.float32)
    t, m = x.shape
    _check_mlp_weights("", gate_weight, up_weight, down_weight, 2, m)
    y = float32_out(out, (t, m), stream)
    if t and m:
        act = cuda.device_array((t, gate_weight.shape[0]), np.float32, stream=stream)
        enqueue_swiglu_mlp(to_device(x, stream), to_device(gate_weight, stream),
                           to_device(up_weight, stream), to_device(down_weight, stream), y, act=act,
                           n_rows=rows_device(t, stream), precision=precision, stream=stream)
    return launcher_result(y, out, x, stream)


def moe_experts(x, topk_ids, topk_weights, gate_weights, up_weights, down_weights, *, precision="fp32",
                out=None, stream=0):
    """Weighted sum of each token's routed experts, summed in increasing expert id, on the GPU
    (counting sort, grouped SwiGLU and down GEMMs, combine).

    x [T, M] float32, topk_ids [T, K] int32 (distinct per row, in [0, E)), topk_weights [T, K]
    float32, gate_weights / up_weights [E, I, M], down_weights [E, M, I] -> [T, M] float32.
    ``precision`` as in ``kernels.linear``.
    """
    check_precision(precision)
    check_array("x", x, 2, np.float32)
    t, m = x.shape
    _check_mlp_weights("", gate_weights, up_weights, down_weights, 3, m)
    e, i = gate_weights.shape[0], gate_weights.shape[1]
    check_array("topk_ids", topk_ids, 2, np.int32, shape=(t, None))
    k = topk_ids.shape[1]
    check_array("topk_weights", topk_weights, 2, np.float32, shape=(t, k))
    if isinstance(topk_ids, np.ndarray) and topk_ids.size:
        if topk_ids.min() < 0 or topk_ids.max() >= e:
            raise ValueError(f"topk_ids must lie in [0, {e}), got values in "
                             f"[{topk_ids.min()}, {topk_ids.max()}]")
        srt = np.sort(topk_ids, axis=1)
        if (srt[:, 1:] == srt[:, :-1]).any():
            raise ValueError("topk_ids repeats an expert within a row")
    y = float32_out(out, (t, m), stream)
    if t and m:
        if k == 0:
            y.copy_to_device(np.zeros((t, m), np.float32), stream=stream)  # the twin's zeros
        else:
            bufs = MoEBuffers(t, e, k, m, i, stream=stream)
            n_rows = rows_device(t, stream)
            x_dev, gate_dev, up_dev = (to_device(a, stream) for a in (x, gate_weights, up_weights))
            _enqueue_moe_sort(to_device(topk_ids, stream), to_device(topk_weights, stream), bufs, n_rows,
                              item_rows=_expert_item_rows(x_dev, gate_dev, up_dev, bufs, precision=precision),
                              stream=stream)
            _enqueue_moe_experts(x_dev, gate_dev, up_dev, to_device(down_weights, stream),
                                 bufs, precision=precision, stream=stream)
            _enqueue_moe_combine(bufs, None, y, n_rows, residual=False, stream=stream)
    return launcher_result(y, out, x, stream)
