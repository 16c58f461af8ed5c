"""The decode loop with every round on the GPU: a ``DeviceTarget`` and (unless ``ar``) a
``DeviceDrafter`` (``model.protocols``; the cuda backend's ``CudaTarget`` / ``CudaDrafter``).

The round of docs/DESIGN.md §1, as device work on one stream: draft
(``draft_device``) -> top-K -> tree build (``TreeBuffers``; the heap kernel, or the level kernel
from ``LEVEL_BUILD_FROM`` nodes) -> verify inputs (a glue kernel) ->
verify forward (``forward_device``) -> ``sample_post`` -> ``follow_tree`` -> cache compaction and
the drafter's next context rows (glue kernels) -> one small copy to the host: the accepted count,
the new bonus, the tree size and the accepted tokens. The host only decides when to stop.

Same tokens and statistics as the host loop; ``stage_times`` are CUDA-event times (host wall
clock after a sync under the simulator, which has no events). The glue kernels below move a
round's results from one stage's device buffers to the next stage's; they do no arithmetic (the
stages themselves are the twinned kernels of ``ddtree_numba.kernels``).

Shapes: N tree nodes besides the root (capacity C), T workspace rows (>= C + 1), Y hidden layers
the drafter reads, M hidden size, P prompt tokens, L = B-1 draft depths, K ranks per depth.
"""

from __future__ import annotations

import math
import time
import weakref

import numpy as np
from numba import config as numba_config
from numba import cuda, int32, uint64

from .. import kernels as kn
from .._device import (cached, capture_graph, capture_graphs, ceil_div, destroy_graph, device_function,
                       grid_dependency_after, replay_graph)
from ..model.protocols import DeviceDrafter, DeviceTarget
from .rounds import STAGES, GenerationResult, RoundLog, check_graph, round_seed

SIM = numba_config.ENABLE_CUDASIM
THREADS = 128
# From this tree capacity on, a round builds its tree with the level-synchronous kernel, else with
# the heap kernel (the same tree, bit for bit). On the demo drafter's real draft (V 264, L 15; H200,
# 63d9b74) the level build took 98.8 / 116.7 / 165.9 / 456.6 µs at budgets 16 / 64 / 256 / 1024
# and the heap build 26.1 / 75.7 / 312.7 / 1,505: a real draft makes 2-4 levels select, the level
# build's costly step, which pays only once the heap's pop chain is long.
LEVEL_BUILD_FROM = 256


# -- glue kernels ----------------------------------------------------------------------------------
# The round's state lives on the device, so one captured graph replays every round:
# state [3] int32 = (cache rows before the round, round number, cache rows allowed), and
# budget [1] int32 the round's tree budget: set for round 1 by the prefill, then for the next
# round at the end of each (``_after_accept_kernel``), so a round starts with no launch of its own.

@cached
@cuda.jit
def _verify_inputs_kernel(bonus, tokens, depths, tree_parents, n_nodes, state, ids, positions,
                          parents, meta, report):
    """The verify forward's inputs for the tree after ``bonus`` at cache row start = state[0]:
    ids = [bonus, tokens], positions = start + [0, depths], parents = the tree's, then a chain
    over the unused rows; meta = (start, N + 1); the report's non-finite flag cleared.
    ``n_nodes`` [1] int32 device (0: no tree)."""
    grid_dependency_after((bonus, tokens, depths, tree_parents, n_nodes, state, ids, positions, parents, meta, report))
    i = cuda.grid(1)
    t = n_nodes[0] + 1
    start = state[0]
    if i < ids.shape[0]:
        if i == 0:
            ids[0] = bonus[0]
            positions[0] = start
            parents[0] = -1
            meta[0] = start
            meta[1] = t
            report[3] = 0
        elif i < t:
            ids[i] = tokens[i - 1]
            positions[i] = start + depths[i - 1]
            parents[i] = tree_parents[i]
        else:
            ids[i] = 0
            positions[i] = 0
            parents[i] = i - 1


@cached
@cuda.jit
def _nonfinite_kernel(x, n_rows, bit, x2, n_rows2, bit2, report):
    """report[3] |= bit when a live row of x (rows < n_rows[0]) holds NaN or infinity, and
    (grid z = 1) bit2 for x2's rows < n_rows2[0]: forwards' logits (bit 1: the target's, bit 2:
    the drafter's), both checked in one launch. Every thread that writes writes the same value,
    and the kernels that write report[3] run one after another on the stream."""
    grid_dependency_after((x, n_rows, bit, x2, n_rows2, bit2, report))   # PDL (_device.py)
    i, c = cuda.grid(2)
    second = cuda.blockIdx.z == 1
    a = x2 if second else x
    if i < (n_rows2[0] if second else n_rows[0]) and c < a.shape[1]:
        v = a[i, c]
        if math.isnan(v) or math.isinf(v):
            report[3] = report[3] | (bit2 if second else bit)


@device_function
def gather_feature(hidden, layer_ids, keep, j, col, features, row0):
    """features[j, y*M + c] = hidden[layer_ids[y], row0 + keep[j], c] for col = y*M + c: a target
    hidden state of an accepted node (verified at row row0 + keep[j]), a column of the drafter's
    next context row j."""
    if col < features.shape[1]:
        M = hidden.shape[2]
        y = col // M
        features[j, col] = hidden[layer_ids[y], row0 + keep[j], col - y * M]


@device_function
def _gather_block(hidden, layer_ids, keep, n, features):
    """A gather block (grid y >= 1) of the kernels below: features[j] = the drafter's layers of
    hidden row keep[j] for j = the block's x < n, columns (y - 1) * blockDim + thread. (Reads the
    block's indices: callers in this module only, for the simulator's ``cuda``.)"""
    j = cuda.blockIdx.x
    if j < n:
        gather_feature(hidden, layer_ids, keep, j, (cuda.blockIdx.y - 1) * cuda.blockDim.x + cuda.threadIdx.x,
                       features, 0)


@cached
@cuda.jit
def _after_accept_kernel(keep, info, tokens, n_nodes, state, start_n, n_new, bonus, report, cap, budget,
                         hidden, layer_ids, features):
    """After ``follow_tree``, blocks of grid y = 0 (thread j over the x blocks): start_n = (start,
    n) for the cache compaction, n_new = n context rows for the drafter, bonus = the new bonus,
    state = (start + n, round + 1, _): the next round's start and number, and its tree budget,
    min(cap, rows allowed - its start - 1): as many nodes as still fit; report = [n, new bonus, N,
    non-finite flag, accepted tokens...] for the host (``tokens[keep[j] - 1]``, j = 1 .. n-1).
    Only thread 0 reads or writes ``state``. Blocks of y >= 1 (a grid of as many x blocks as
    nodes, none for ``ar``): features[j] = the drafter's layers of hidden row keep[j] for j < n,
    columns (y - 1) * blockDim + thread, the drafter's next context rows."""
    grid_dependency_after((keep, info, tokens, n_nodes, state, start_n, n_new, bonus, report, cap, budget, hidden,
                           layer_ids, features))
    n = info[0]
    if cuda.blockIdx.y > 0:
        _gather_block(hidden, layer_ids, keep, n, features)
        return
    j = cuda.grid(1)
    if j == 0:
        start = state[0]
        start_n[0] = start
        start_n[1] = n
        state[0] = start + n
        state[1] += 1
        budget[0] = max(0, min(cap, state[2] - start - n - 1))
        n_new[0] = n
        bonus[0] = info[1]
        report[0] = n
        report[1] = info[1]
        report[2] = n_nodes[0]
    elif j < n:
        report[3 + j] = tokens[keep[j] - 1]


# The prefill's inputs, staged by the host in one page-locked buffer and copied with one copy:
# PREFILL_HEAD uint32 = (state: P, 1, rows allowed; round 1's budget; the seed, low and high
# halves; the first draw's seed, the same; P), then the prompt's P ids.
PREFILL_HEAD = 9


@cached
@cuda.jit
def _prefill_inputs_kernel(staged, state_budget, seeds, ids, positions, parents, meta, report, n_ctx, seq):
    """A prefill's inputs from its staged buffer (``PREFILL_HEAD``): state_budget and seeds
    [2] uint64 as staged; the forward's ids = the prompt padded with 0, positions = 0 .., parents
    = a chain, meta = (0, P); the report's non-finite flags cleared; n_ctx = P (the drafter's first
    context rows); seq [1, 4] = (0, 1, P - 1, 0): ``sample_post``'s table drawing row P - 1 alone."""
    grid_dependency_after((staged, state_budget, seeds, ids, positions, parents, meta, report, n_ctx, seq))
    i = cuda.grid(1)
    p = int32(staged[8])
    if i < ids.shape[0]:
        ids[i] = int32(staged[PREFILL_HEAD + i]) if i < p else 0
        positions[i] = i
        parents[i] = i - 1
    if i == 0:
        for k in range(4):
            state_budget[k] = int32(staged[k])
        for k in range(2):
            seeds[k] = (uint64(staged[5 + 2 * k]) << uint64(32)) | uint64(staged[4 + 2 * k])
        meta[0] = 0
        meta[1] = p
        report[3] = 0
        n_ctx[0] = p
        seq[0, 0] = 0
        seq[0, 1] = 1
        seq[0, 2] = p - 1
        seq[0, 3] = 0


@cached
@cuda.jit
def _prefill_tail_kernel(post, meta, bonus, report, hidden, layer_ids, keep, features):
    """After the prefill's forward and its draw (``post`` [T], row P - 1 drawn, P = meta[1]): the
    bonus, in ``bonus`` [1] and in report[1] for the host; blocks of grid y >= 1 (none for ``ar``):
    features[j] = the drafter's layers of hidden row keep[j] for j < P, the drafter's first
    context rows."""
    grid_dependency_after((post, meta, bonus, report, hidden, layer_ids, keep, features))   # PDL (_device.py)
    p = meta[1]
    if cuda.blockIdx.y > 0:
        _gather_block(hidden, layer_ids, keep, p, features)
    elif cuda.grid(1) == 0:
        bonus[0] = post[p - 1]
        report[1] = post[p - 1]


# -- the loop --------------------------------------------------------------------------------------

class _EventTimer:
    """Per-stage device time: events recorded between the stages' launches, read once a round
    (after the round's one sync). The simulator has no events: host time after a sync."""

    clock = "host_after_sync" if SIM else "cuda_events"

    def __init__(self, stream, stages):
        self.stream, self.times, self.marks = stream, dict.fromkeys(stages, 0.0), []

    def mark(self, stage=None):
        if SIM:
            self.stream.synchronize()
            self.marks.append((stage, time.perf_counter()))
        else:
            ev = cuda.event()
            ev.record(self.stream)
            self.marks.append((stage, ev))

    def collect(self, in_flight: int = 0):
        """After a sync: add the intervals between marks to their stages (a mark names the
        stage that ends at it). The last ``in_flight`` marks belong to a round launched ahead,
        not yet done: they wait for the next collect."""
        done = len(self.marks) - in_flight
        for (_, a), (stage, b) in zip(self.marks[:done - 1], self.marks[1:done]):
            self.times[stage] += (b - a) if SIM else cuda.event_elapsed_time(a, b) * 1e-3
        self.marks = self.marks[max(done - 1, 0):]


TARGET_BIT, DRAFTER_BIT = 1, 2      # report[3]: whose logits went non-finite


def _check_finite(report, what: str, stream) -> None:
    """The non-finite flags report[3] (a host copy, or the device array), as a ``ValueError``."""
    flag = report[3] if isinstance(report, np.ndarray) else report[3:4].copy_to_host(stream=stream)[0]
    for bit, model in ((DRAFTER_BIT, "drafter"), (TARGET_BIT, "target")):
        if flag & bit:
            raise ValueError(f"{model} forward: its logits in {what} are not finite (NaN or inf); the host "
                             "loop (trace=True) names the first layer whose output is not")


def _drain(stream) -> None:
    """Wait for the work on ``stream`` before an error propagates, unless the stream is broken:
    then the first error is the one to see."""
    try:
        stream.synchronize()
    except Exception:
        pass


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def tree_depths(block_size: int, cap: int) -> int:
    """The draft depths a round reads, min(L, cap) (L = block_size - 1; cap the tree's nodes, L
    for ``dflash``'s chain): a best-first tree of cap nodes holds none deeper than cap, since a
    node at depth d is popped after its d - 1 ancestors (docs/DESIGN.md §1), so the logits of
    depths past it are never read: the same tree from the first min(L, cap) rows, and a drafter
    with ``partial_depths`` skips the rest."""
    return min(block_size - 1, cap)


def depths_kwargs(drafter, depths: int) -> dict:
    """The keyword a drafter's ``draft_device`` / ``draft_batch_device`` takes to draft ``depths``
    rows only: ``{"depths": depths}`` where it has ``partial_depths``, else none (its logits give
    all L rows; the loops read the first ``depths``)."""
    return {"depths": depths} if getattr(drafter, "partial_depths", False) else {}


def accepted_rows_max(block_size: int, cap: int) -> int:
    """The most rows a round accepts: a path of min(L, cap) tree nodes (``tree_depths``; L =
    block_size - 1 draft depths, cap the budget) and its root. A drafter with a device prefill
    drafts over no more context rows than these, so its launches are sized for them."""
    return tree_depths(block_size, cap) + 1


class DeviceRound:
    """Everything one decode configuration keeps on the device between rounds, and the round's
    CUDA graph: the caches, the tree buffers, the round's state and scratch.

    A configuration is (drafter, method, K ranks, cap tree nodes, cache rows, feature rows), the
    last two rounded up to powers of two. The verify and draft workspaces are the models' own
    (``target.workspace``, ``drafter.workspace``), shared with other configurations: a round
    carries nothing in them from one round to the next, and the scratch they pointed at when the
    graph was captured is held here, so the graph's pointers stay valid if a larger cache makes
    the models allocate a new one. Generations with the same configuration reuse it (caches
    reset, graph replayed): ``rounds_for`` keeps the last few per target.
    """

    def __init__(self, target: DeviceTarget, drafter: DeviceDrafter | None, method: str, K: int, cap: int,
                 capacity: int, feature_rows: int):
        cfg = target.config
        # weak: _ROUNDS is keyed weakly by the target, and the drafter refers to it too
        self.target = weakref.proxy(target)
        self.drafter = None if drafter is None else weakref.proxy(drafter)
        self.drafter_ref = None if drafter is None else weakref.ref(drafter)
        self.method = method
        self.K, self.cap, self.capacity = K, cap, capacity
        self.layers = () if method == "ar" else tuple(drafter.target_layer_ids)
        self.graphs = {}                     # mode (True | "stages") -> (temperature, [(stage, graph)])
        self.prefill_graphs = {}             # prefill workspace rows -> (temperature, the prefill's graph)
        self.generations = 0                 # prefills so far (the caches are reset from the second)
        self.held = ()                       # scratch the graph points at (see the class docstring)
        i32 = lambda n: cuda.device_array(n, np.int32)              # noqa: E731
        self.tcache = target.new_cache(capacity)
        self.tbufs = kn.TreeBuffers.allocate(max(cap, 1), 0)         # ar: an empty "tree"
        self.tbufs.n_nodes.copy_to_device(np.zeros(1, np.int32))
        self.ws = target.workspace(self.tbufs.capacity + 1)           # verify rows
        self.post, self.keep = i32(self.tbufs.capacity + 1), i32(self.tbufs.capacity + 1)
        self.info, self.bonus, self.start_n, self.n_ctx = i32(2), i32(1), i32(2), i32(1)
        self.report = i32(4 + self.tbufs.capacity)   # [n, bonus, N, non-finite flags, tokens...]
        # two page-locked host copies of the report: the host reads one round's while the next
        # round, launched ahead, copies into the other
        self.host_reports = tuple(cuda.pinned_array(self.report.shape, np.int32) for _ in range(2))
        # views of two arrays, so that a prefill sets each pair with one copy
        self.state_budget = i32(4)
        self.state = self.state_budget[0:3]  # (cache rows, round, rows allowed): the glue kernels'
        self.budget = self.state_budget[3:4]  # this round's tree budget
        self.seeds = cuda.device_array(2, np.uint64)
        self.seed = self.seeds[0:1]          # the generation's seed
        self.round_seed = self.seeds[1:2]    # this round's (the prefill's: round_seed(seed, 0))
        # a prefill's inputs: staged in page-locked memory, one copy, spread by _prefill_inputs_kernel
        self.staged_host = cuda.pinned_array(PREFILL_HEAD + capacity, np.uint32)
        self.staged = cuda.device_array(PREFILL_HEAD + capacity, np.uint32)
        self.prefill_seq = cuda.device_array((1, 4), np.int32)   # sample_post's table: row P - 1 alone
        self.prefill_posts = {}              # prefill workspace rows -> its draws' buffer [T] int32
        self.level_scratch = None            # the level build's, from LEVEL_BUILD_FROM nodes
        if method != "ar":
            # the depths a tree can reach (a node at depth d comes after its d - 1 ancestors in pop
            # order): the drafter's logits and the top-K over those rows only
            L, V = tree_depths(drafter.block_size, cap), cfg.vocab_size
            self.draft_kw = depths_kwargs(drafter, L)
            self.dcache = drafter.new_cache(capacity)
            self.draft_rows = cuda.to_device(np.array([L], np.int32))   # every draft's L rows
            self.features = cuda.device_array((feature_rows, len(self.layers) * cfg.hidden_size), np.float32)
            self.layer_ids = cuda.to_device(np.array(self.layers, np.int32))
            self.rows_in_order = cuda.to_device(np.arange(feature_rows, dtype=np.int32))   # the prefill's keep
            self.lp = cuda.device_array((L, K), np.float32)
            self.ids = cuda.device_array((L, K), np.int32)
            self.topk_scratch = kn.TopKScratch.allocate(L, V, K, 0)  # between its slice blocks and merge
            self.level_scratch = kn.LevelScratch.allocate(L, cap, 0) if cap >= LEVEL_BUILD_FROM else None
        # A drafter with a device prefill (``prefill_device``) takes the prompt's context rows in
        # the prefill; then a round's draft sees at most the rows a round accepts (a path of
        # min(L, cap) nodes and its root), and its launches are sized for those, not the prompt
        self.drafter_prefill = method != "ar" and hasattr(drafter, "prefill_device")
        self.draft_features = (None if method == "ar" else
                               self.features[:accepted_rows_max(drafter.block_size, cap)] if self.drafter_prefill
                               else self.features)
        # the gather of the drafter's next context rows in _after_accept_kernel, and of its first
        # in _prefill_tail_kernel (stand-ins of the kernels' types for ar: no gather blocks)
        self.feature_args = ((self.ws.hidden, self.info, self.ws.logits) if method == "ar" else
                             (self.ws.hidden, self.layer_ids, self.features))
        self.first_feature_args = ((self.info, self.info, self.ws.logits) if method == "ar" else
                                   (self.layer_ids, self.rows_in_order, self.features))

    def flag_nonfinite(self, logits, n_rows, bit, stream, second=None):
        """report[3] |= bit if a live row of ``logits`` is not finite; ``second`` = (logits2,
        n_rows2, bit2): the same for another forward's logits, in the same launch."""
        x2, n2, bit2 = (logits, n_rows, bit) if second is None else second
        grid = (ceil_div(max(logits.shape[0], x2.shape[0]), 4), ceil_div(max(logits.shape[1], x2.shape[1]), 64),
                1 if second is None else 2)
        _nonfinite_kernel[grid, (4, 64), stream](logits, n_rows, bit, x2, n2, bit2, self.report)

    def prefill(self, prompt, max_tokens: int, temperature: float, seed: int, graph: bool, stream) -> None:
        """Reset the caches and the round state, run the prompt, sample its bonus (in ``bonus`` and
        report[1]) and gather the drafter's first context rows (enqueued; the caller syncs). The
        host stages the inputs and makes one copy; the rest is ``enqueue_prefill``, with ``graph``
        one CUDA graph a prefill workspace, captured on its first use (again when the temperature
        changes, as the round's graph is)."""
        target, p = self.target, prompt.shape[0]
        self.tcache.reset()
        if self.method != "ar" and self.generations and not self.drafter_prefill:
            self.dcache.reset()               # a kept configuration (a drafter prefill resets it on the device)
        staged = self.staged_host             # (free: the previous generation ended with a sync)
        staged[0:4] = (p, 1, max_tokens, max(0, min(self.cap, max_tokens - p - 1)))   # round 1 next, its budget
        staged[4:8].view(np.uint64)[:] = (seed, round_seed(seed, 0))
        staged[8] = p
        staged[PREFILL_HEAD:PREFILL_HEAD + p] = prompt
        self.staged.copy_to_device(staged, stream=stream)
        wp = target.workspace(p)
        if not graph:
            self.enqueue_prefill(wp, temperature, stream)
        else:
            temp, exe = self.prefill_graphs.get(wp.rows, (None, None))
            if exe is None or temp != temperature:      # (the draw's temperature is an argument of the graph)
                if exe is not None:
                    destroy_graph(exe)
                # capture_graph warms up on its own stream: the staged inputs must be in first.
                # The warm-up run and the capture write the same rows, the prompt's.
                stream.synchronize()
                exe = capture_graph(lambda s: self.enqueue_prefill(wp, temperature, s))
                self.prefill_graphs[wp.rows] = (temperature, exe)
                if not any(h is wp.mla_scratch for h in self.held):
                    self.held += (wp.mla_scratch,)
            replay_graph(exe, stream)
        self.tcache.length = p
        self.generations += 1

    def enqueue_prefill(self, wp, temperature: float, stream) -> None:
        """The prefill's device work from its staged inputs (``self.staged``), every size read from
        the device (capturable): the inputs spread to the workspace ``wp`` and the round state,
        the forward, the non-finite check, the draw of row P - 1, the bonus and the drafter's
        first context rows (taken into its cache here by a drafter with ``prefill_device``)."""
        _prefill_inputs_kernel[ceil_div(wp.rows, THREADS), THREADS, stream](
            self.staged, self.state_budget, self.seeds, wp.ids, wp.positions, wp.parents, wp.meta, self.report,
            self.n_ctx, self.prefill_seq)
        self.target.forward_device(wp, self.tcache, self.layers, stream=stream)
        self.flag_nonfinite(wp.logits, wp.n_rows, TARGET_BIT, stream)
        post = self.prefill_posts.get(wp.rows)
        if post is None:
            post = self.prefill_posts[wp.rows] = cuda.device_array(wp.rows, np.int32)
        kn.sample_post(wp.logits, temperature, 0, out=post, seed_device=self.round_seed, seqs=self.prefill_seq,
                       stream=stream)
        gather = 0 if self.method == "ar" else ceil_div(self.features.shape[1], THREADS)
        _prefill_tail_kernel[(wp.rows, 1 + gather), THREADS, stream](post, wp.meta, self.bonus, self.report,
                                                                     wp.hidden, *self.first_feature_args)
        if self.drafter_prefill:             # the prompt's context rows into the drafter's cache
            self.drafter.prefill_device(self.features, self.n_ctx, self.dcache, stream=stream)

    def enqueue_round(self, temperature: float, stream, mark=lambda stage: None) -> None:
        """One round, every size read from the device (so it can be captured): draft -> top-K ->
        build -> verify -> accept -> compaction -> the drafter's next context rows, and the
        report the host reads. ``mark(stage)`` is called after each stage (eager runs time them)."""
        ws, tbufs, n_out = self.ws, self.tbufs, self.tbufs.capacity + 1
        if temperature > 0:                   # (the arg-max draws no random numbers)
            kn.enqueue_round_seed(self.seed, self.state[1:2], self.round_seed, stream=stream)
        if self.method != "ar":
            logits_d = self.drafter.draft_device(self.draft_features, self.n_ctx, self.bonus, self.dcache,
                                                 stream=stream, **self.draft_kw)[:self.lp.shape[0]]
            mark("draft")
            kn.topk_logprobs(logits_d, self.K, out=(self.lp, self.ids), scratch=self.topk_scratch, stream=stream)
            mark("topk")
            if self.level_scratch is not None:
                kn.build_tree_levels(self.lp, self.ids, self.cap, out=tbufs, scratch=self.level_scratch,
                                     budget_device=self.budget, stream=stream)
            else:
                kn.build_tree(self.lp, self.ids, self.cap, out=tbufs, budget_device=self.budget, stream=stream)
            mark("build")
        _verify_inputs_kernel[ceil_div(ws.rows, THREADS), THREADS, stream](
            self.bonus, tbufs.tokens, tbufs.depths, tbufs.parents, tbufs.n_nodes, self.state,
            ws.ids, ws.positions, ws.parents, ws.meta, self.report)          # (clears the flags)
        self.target.forward_device(ws, self.tcache, self.layers, stream=stream)
        self.flag_nonfinite(ws.logits, ws.n_rows, TARGET_BIT, stream,   # and the draft's, in one launch
                            second=None if self.method == "ar" else (logits_d, self.draft_rows, DRAFTER_BIT))
        mark("verify")
        kn.sample_post(ws.logits[:n_out], temperature, 0, out=self.post, seed_device=self.round_seed,
                       stream=stream)
        kn.follow_tree(tbufs, self.post, out=(self.keep, self.info), stream=stream)
        # (with a drafter, also the accepted nodes' hidden states: its next context rows)
        gather = 0 if self.method == "ar" else ceil_div(self.features.shape[1], THREADS)
        _after_accept_kernel[(n_out if gather else ceil_div(n_out, THREADS), 1 + gather), THREADS, stream](
            self.keep, self.info, tbufs.tokens, tbufs.n_nodes, self.state, self.start_n, self.n_ctx,
            self.bonus, self.report, self.cap, self.budget, *self.feature_args)
        mark("accept")
        self.tcache.enqueue_compact(self.start_n, self.keep, n_max=n_out, stream=stream)
        mark("compact")

    def close(self) -> None:
        """Free the graphs (a configuration dropped by ``rounds_for``; its buffers go with it)."""
        for _, parts in self.graphs.values():
            for _, exe in parts:
                destroy_graph(exe)
        for _, exe in self.prefill_graphs.values():
            destroy_graph(exe)
        self.graphs, self.prefill_graphs = {}, {}

    def replays(self, mode, temperature: float) -> list:
        """[(stage, graph)] to replay for a round in ``mode`` at ``temperature``; [] when none
        was captured for them."""
        temp, parts = self.graphs.get(mode, (None, []))
        return parts if mode and temp == temperature else []

    def capture(self, mode, temperature: float) -> None:
        """Capture ``enqueue_round`` (not run: the caller has just run the same launches eagerly,
        which compiled every kernel and made every scratch): mode True as one CUDA graph, mode
        "stages" as one graph per stage (replayed in order with events between: each stage's
        device time)."""
        for _, old in self.graphs.pop(mode, (None, []))[1]:     # captured at another temperature
            destroy_graph(old)
        if mode == "stages":
            names = []
            exes = capture_graphs(lambda s, cut: self.enqueue_round(temperature, s,
                                                                    lambda stage: (names.append(stage), cut())))
            parts = [(stage, exe) for stage, exe in zip(names, exes) if exe is not None]
        else:
            parts = [("round", capture_graph(lambda s: self.enqueue_round(temperature, s), warm_up=False))]
        self.graphs[mode] = (temperature, parts)
        self.held += (self.ws.mla_scratch,) + (() if self.method == "ar" else
                                               (self.drafter.workspace(self.draft_features.shape[0]).scratch,))


_ROUNDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # target -> {key: DeviceRound}
KEPT_ROUNDS = 16                      # configurations kept per target (least recently used dropped)


def rounds_for(target, drafter, method: str, K: int, cap: int, max_tokens: int, feature_rows: int,
               keep: bool) -> DeviceRound:
    """The ``DeviceRound`` of this configuration: a kept one (``keep``: ``reusable``), else a new
    one."""
    capacity, feature_rows = _pow2(max_tokens), _pow2(feature_rows)
    if not keep:
        return DeviceRound(target, drafter, method, K, cap, capacity, feature_rows)
    kept = _ROUNDS.setdefault(target, {})
    key = (id(drafter), method, K, cap, capacity, feature_rows)
    dr = kept.pop(key, None)
    if dr is not None and drafter is not None and dr.drafter_ref() is not drafter:
        dr.close()                            # a new drafter at a dropped one's id
        dr = None
    if dr is None:
        dr = DeviceRound(target, drafter, method, K, cap, capacity, feature_rows)
        while len(kept) >= KEPT_ROUNDS:
            kept.pop(next(iter(kept))).close()
    kept[key] = dr                        # most recently used last
    return dr


def reusable(drafter, method: str) -> bool:
    """Whether this pair's ``DeviceRound`` can serve later calls: no drafter (``ar``), or one whose
    ``draft_device`` never syncs or allocates after its first call and whose cache ``reset()``s
    (it says so with ``capturable = True``, as ``CudaDrafter`` does)."""
    return method == "ar" or bool(getattr(drafter, "capturable", False))


def capturable(drafter, method: str) -> bool:
    """Whether a round of this pair can be captured as a CUDA graph: ``reusable`` on a real GPU
    (the simulator cannot capture)."""
    return not SIM and reusable(drafter, method)


def generate_device(target: DeviceTarget, drafter: DeviceDrafter | None, *, prompt, n_new, method, budget,
                    temperature, seed, stops, max_tokens, progress, graph=None) -> GenerationResult:
    """The body of ``decode.generate`` for a device target (and drafter), on checked arguments
    (prompt [P] int32, n_new >= 1, stops a set of ids).

    ``graph``: True replays each round as one CUDA graph (the first round of a new configuration
    runs eagerly, then is captured), timed as a whole (``stage_times["round"]``); "stages": one
    graph per stage, replayed in order with events between (each stage's device time, for
    profiling); False: every stage launched from Python; None: True whenever ``capturable``.
    Rounds run one ahead of the host (docs/DECODE.md "Rounds in flight"); when a stop token ends
    the generation, the round already launched ahead runs unread: it is in neither the forward
    counts nor ``stage_times``.
    """
    t_start = time.perf_counter()
    check_graph(graph)
    can = capturable(drafter, method)
    if graph is None:
        graph = can
    elif graph and not can:
        raise ValueError("graph=True needs a real GPU and a drafter whose draft can be captured "
                         "(capturable = True, as CudaDrafter); the CUDA simulator cannot capture graphs"
                         if not SIM else "graph=True needs a real GPU: the CUDA simulator cannot capture graphs")
    stream = cuda.stream()
    timer = _EventTimer(stream, STAGES)
    chain = method == "dflash"
    L = 0 if method == "ar" else drafter.block_size - 1
    K = 1 if chain else min(budget, target.config.vocab_size)
    cap = 0 if method == "ar" else (L if chain else budget)       # tree nodes at most
    p = prompt.shape[0]
    log = RoundLog(method, p, n_new, stops, progress)
    dr = rounds_for(target, drafter, method, K, cap, max_tokens, max(p, cap + 1), keep=reusable(drafter, method))

    timer.mark()
    try:
        dr.prefill(prompt, max_tokens, temperature, seed, graph, stream)
    except BaseException:
        _drain(stream)                # (its staged copy may be in flight: the next call rewrites the buffer)
        raise
    timer.mark("prefill")
    first = dr.report.copy_to_host(dr.host_reports[0], stream=stream)     # [_, bonus, _, flags, ...]
    stream.synchronize()
    bonus_h = int(first[1])
    _check_finite(first, "the prefill", stream)
    timer.collect()
    log.target_forwards += 1
    start = p
    # tokens a round can commit at most; then the next bonus may end the generation (bonus_ends)
    most = 1 if method == "ar" else L + 1
    launched = 0

    def launch(parts):
        """Enqueue one round (its graphs, or its launches) and the copy of its report into a
        host buffer; returns (host report, event recorded after the copy, eager?, timer marks made)."""
        nonlocal launched
        marks = len(timer.marks)
        for stage, exe in parts:
            replay_graph(exe, stream)
            timer.mark(stage)
        if not parts:
            dr.enqueue_round(temperature, stream, timer.mark)
        host = dr.host_reports[launched % 2]
        launched += 1
        dr.report.copy_to_host(host, stream=stream)
        done = cuda.event()
        done.record(stream)
        return host, done, not parts, len(timer.marks) - marks

    # Rounds in flight: the next round is launched before the host reads this one's report
    # (every size a round needs is on the device), so the GPU does not wait while the host
    # commits tokens. Not while a first eager round is still to be captured (graph modes), and
    # only when the round before cannot end the generation by length; if a stop token ends it
    # instead, the round ahead runs to no purpose and is waited for below (its report unread).
    ahead = None
    try:
        while not log.bonus_ends(bonus_h):
            parts = dr.replays(graph, temperature)
            current = ahead if ahead is not None else launch(parts)
            ahead = launch(parts) if (parts or not graph) and len(log.tokens) + most + 1 < n_new else None
            host, done, eager, _ = current
            done.synchronize()                                          # the round's one wait
            timer.collect(in_flight=0 if ahead is None else ahead[3])
            rep = host.copy()
            if method != "ar":
                log.drafter_forwards += 1
            log.target_forwards += 1
            n, new_bonus, n_tree = int(rep[0]), int(rep[1]), int(rep[2])
            _check_finite(rep, f"round {log.target_forwards - 1}", stream)
            if graph and eager:
                dr.capture(graph, temperature)    # after a first eager round: everything is compiled
            start += n
            dr.tcache.length = start
            if log.commit([bonus_h] + [int(x) for x in rep[4:3 + n]], n_tree):
                break
            bonus_h = new_bonus
    except BaseException:
        _drain(stream)                # a round in flight (the configuration is reused)
        raise
    stream.synchronize()              # a round launched ahead past the end (the configuration is reused)
    return log.result(timer.times, time.perf_counter() - t_start, loop="device", stage_clock=timer.clock)
