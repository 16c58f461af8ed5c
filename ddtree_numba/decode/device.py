"""The decode loop with every round on the GPU: a ``DeviceTarget`` and (unless ``ar``) a
``DeviceDrafter`` (``model.protocols``; the cuda backend's ``CudaTarget`` / ``CudaDrafter``).

The round of docs/DESIGN.md §1, as device work on one stream: draft
(``draft_device``) -> top-K -> tree build (``TreeBuffers``) -> verify inputs (a glue kernel) ->
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

import numpy as np
from numba import config as numba_config
from numba import cuda

from .. import kernels as kn
from .._device import ceil_div
from ..model.protocols import DeviceDrafter, DeviceTarget
from .rounds import STAGES, GenerationResult, RoundLog, round_seed

SIM = numba_config.ENABLE_CUDASIM
THREADS = 128


# -- glue kernels ----------------------------------------------------------------------------------

@cuda.jit
def _verify_inputs_kernel(bonus, tokens, depths, tree_parents, n_nodes, start, ids, positions,
                          parents, meta, report):
    """The verify forward's inputs for the tree after ``bonus`` at cache row ``start``:
    ids = [bonus, tokens], positions = start + [0, depths], parents = the tree's, then a chain
    over the unused rows; meta = (start, N + 1); the report's non-finite flag cleared.
    ``n_nodes`` [1] int32 device (0: no tree)."""
    i = cuda.grid(1)
    t = n_nodes[0] + 1
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


@cuda.jit
def _nonfinite_kernel(x, n_rows, bit, report):
    """report[3] |= bit when a live row of x (rows < n_rows[0]) holds NaN or infinity: x is a
    forward's logits (bit 1: the target's, bit 2: the drafter's). Every thread that writes writes
    the same value, and the kernels that write report[3] run one after another on the stream."""
    i, c = cuda.grid(2)
    if i < n_rows[0] and c < x.shape[1]:
        v = x[i, c]
        if math.isnan(v) or math.isinf(v):
            report[3] = report[3] | bit


@cuda.jit
def _after_accept_kernel(keep, info, tokens, n_nodes, start, start_n, n_new, bonus, report):
    """After ``follow_tree``: start_n = (start, n) for the cache compaction, n_new = n context
    rows for the drafter, bonus = the new bonus, and report = [n, new bonus, N, non-finite flag,
    accepted tokens...] for the host (``tokens[keep[j] - 1]``, j = 1 .. n-1)."""
    j = cuda.grid(1)
    n = info[0]
    if j == 0:
        start_n[0] = start
        start_n[1] = n
        n_new[0] = n
        bonus[0] = info[1]
        report[0] = n
        report[1] = info[1]
        report[2] = n_nodes[0]
    elif j < n:
        report[3 + j] = tokens[keep[j] - 1]


@cuda.jit
def _gather_features_kernel(hidden, layer_ids, keep, n_rows, features):
    """features[j, y*M + c] = hidden[layer_ids[y], keep[j], c] for j < n_rows[0]: the target's
    hidden states of the accepted nodes, the drafter's next context rows."""
    j, col = cuda.grid(2)
    M = hidden.shape[2]
    if j < n_rows[0] and col < features.shape[1]:
        y = col // M
        features[j, col] = hidden[layer_ids[y], keep[j], col - y * M]


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

    def collect(self):
        """After a sync: add the intervals between marks to their stages (a mark names the
        stage that ends at it)."""
        for (_, a), (stage, b) in zip(self.marks[:-1], self.marks[1:]):
            self.times[stage] += (b - a) if SIM else cuda.event_elapsed_time(a, b) * 1e-3
        self.marks = self.marks[-1:] if self.marks else []


TARGET_BIT, DRAFTER_BIT = 1, 2      # report[3]: whose logits went non-finite


def _check_finite(report, what: str, stream) -> None:
    """The non-finite flags report[3] (a host copy, or the device array), as a ``ValueError``."""
    flag = report[3] if isinstance(report, np.ndarray) else report[3:4].copy_to_host(stream=stream)[0]
    for bit, model in ((DRAFTER_BIT, "drafter"), (TARGET_BIT, "target")):
        if flag & bit:
            raise ValueError(f"{model} forward: its logits in {what} are not finite (NaN or inf); the host "
                             "loop (trace=True) names the first layer whose output is not")


def generate_device(target: DeviceTarget, drafter: DeviceDrafter | None, *, prompt, n_new, method, budget,
                    temperature, seed, stops, max_tokens, progress, graph=False) -> GenerationResult:
    """The body of ``decode.generate`` for a device target (and drafter), on checked arguments
    (prompt [P] int32, n_new >= 1, stops a set of ids)."""
    t_start = time.perf_counter()
    stream = cuda.stream()
    timer = _EventTimer(stream, STAGES)
    cfg = target.config
    V = cfg.vocab_size
    layers = () if method == "ar" else tuple(drafter.target_layer_ids)
    chain = method == "dflash"
    L = 0 if method == "ar" else drafter.block_size - 1
    K = 1 if chain else min(budget, V)
    cap = 0 if method == "ar" else (L if chain else budget)       # tree nodes at most
    p = prompt.shape[0]
    log = RoundLog(method, p, n_new, stops, progress)

    tcache = target.new_cache(max_tokens)
    tbufs = kn.TreeBuffers.allocate(max(cap, 1), stream)           # ar: an empty "tree"
    ws = target.workspace(tbufs.capacity + 1)                      # verify rows
    wp = target.workspace(p)                                       # prefill rows
    if cap == 0:
        tbufs.n_nodes.copy_to_device(np.zeros(1, np.int32), stream=stream)
    post = cuda.device_array(tbufs.capacity + 1, np.int32, stream=stream)
    keep = cuda.device_array(tbufs.capacity + 1, np.int32, stream=stream)
    info = cuda.device_array(2, np.int32, stream=stream)
    bonus = cuda.device_array(1, np.int32, stream=stream)
    start_n = cuda.device_array(2, np.int32, stream=stream)        # (start, n) of the compaction
    n_ctx = cuda.device_array(1, np.int32, stream=stream)          # drafter's new context rows
    report = cuda.device_array(4 + tbufs.capacity, np.int32, stream=stream)
    if method != "ar":
        dcache = drafter.new_cache(max_tokens)
        draft_rows = cuda.to_device(np.array([L], np.int32), stream=stream)   # every draft's L rows
        Y, M = len(layers), cfg.hidden_size
        features = cuda.device_array((max(p, cap + 1), Y * M), np.float32, stream=stream)
        layer_ids = cuda.to_device(np.array(layers, np.int32), stream=stream)
        lp = cuda.device_array((L, K), np.float32, stream=stream)
        ids = cuda.device_array((L, K), np.int32, stream=stream)
        topk_scratch = kn.TopKScratch.allocate(L, V, K, stream)   # between its two kernels

    def flag_nonfinite(logits, n_rows, bit):
        grid = (ceil_div(logits.shape[0], 4), ceil_div(logits.shape[1], 64))
        _nonfinite_kernel[grid, (4, 64), stream](logits, n_rows, bit, report)

    def gather(hidden, rows_keep, n_rows, rows):
        """features[j] = the drafter's layers of hidden row rows_keep[j], j < n_rows[0]."""
        grid = (rows, ceil_div(features.shape[1], THREADS))
        _gather_features_kernel[grid, (1, THREADS), stream](hidden, layer_ids, rows_keep, n_rows, features)

    # prefill: the prompt, its last row's token, and the drafter's first context rows
    timer.mark()
    wp.ids.copy_to_device(np.pad(prompt, (0, wp.rows - p)).astype(np.int32), stream=stream)
    wp.positions.copy_to_device(np.arange(wp.rows, dtype=np.int32), stream=stream)
    wp.parents.copy_to_device(np.arange(-1, wp.rows - 1, dtype=np.int32), stream=stream)
    wp.meta.copy_to_device(np.array([0, p], np.int32), stream=stream)
    target.forward_device(wp, tcache, layers, graph=graph, stream=stream)
    report[3:4].copy_to_device(np.zeros(1, np.int32), stream=stream)
    flag_nonfinite(wp.logits, wp.n_rows, TARGET_BIT)
    kn.sample_post(wp.logits[p - 1:p], temperature, round_seed(seed, 0), out=bonus, stream=stream)
    if method != "ar":
        prefill_keep = cuda.to_device(np.arange(p, dtype=np.int32), stream=stream)
        n_ctx.copy_to_device(np.array([p], np.int32), stream=stream)
        gather(wp.hidden, prefill_keep, n_ctx, p)
    timer.mark("prefill")
    bonus_h = int(bonus.copy_to_host(stream=stream)[0])
    _check_finite(report, "the prefill", stream)
    timer.collect()
    log.target_forwards += 1
    tcache.length = start = p
    r = 0
    while not log.bonus_ends(bonus_h):
        r += 1
        free = tcache.capacity - start
        if method != "ar":
            nodes = min(cap, free - 1)
            logits_d = drafter.draft_device(features, n_ctx, bonus, dcache, graph=graph, stream=stream)
            log.drafter_forwards += 1
            timer.mark("draft")
            kn.topk_logprobs(logits_d, K, out=(lp, ids), scratch=topk_scratch, stream=stream)
            timer.mark("topk")
            kn.build_tree(lp, ids, nodes, out=tbufs, stream=stream)
            timer.mark("build")
        grid = ceil_div(ws.rows, THREADS)
        _verify_inputs_kernel[grid, THREADS, stream](
            bonus, tbufs.tokens, tbufs.depths, tbufs.parents, tbufs.n_nodes, start,
            ws.ids, ws.positions, ws.parents, ws.meta, report)          # (clears the flags)
        if method != "ar":
            flag_nonfinite(logits_d, draft_rows, DRAFTER_BIT)
        target.forward_device(ws, tcache, layers, graph=graph, stream=stream)
        flag_nonfinite(ws.logits, ws.n_rows, TARGET_BIT)
        log.target_forwards += 1
        timer.mark("verify")
        kn.sample_post(ws.logits[:tbufs.capacity + 1], temperature, round_seed(seed, r), out=post,
                       stream=stream)
        kn.follow_tree(tbufs, post, out=(keep, info), stream=stream)
        _after_accept_kernel[ceil_div(tbufs.capacity + 1, THREADS), THREADS, stream](
            keep, info, tbufs.tokens, tbufs.n_nodes, start, start_n, n_ctx, bonus, report)
        timer.mark("accept")
        tcache.enqueue_compact(start_n, keep, n_max=tbufs.capacity + 1, stream=stream)
        if method != "ar":
            gather(ws.hidden, keep, n_ctx, tbufs.capacity + 1)
        timer.mark("compact")
        rep = report.copy_to_host(stream=stream)                   # the round's one sync
        timer.collect()
        n, new_bonus, n_tree = int(rep[0]), int(rep[1]), int(rep[2])
        _check_finite(rep, f"round {r}", stream)
        start += n
        tcache.length = start
        if log.commit([bonus_h] + [int(x) for x in rep[4:3 + n]], n_tree):
            break
        bonus_h = new_bonus
    return log.result(timer.times, time.perf_counter() - t_start, loop="device", stage_clock=timer.clock)
