"""The decode loop with every round on the GPU (cuda target + a drafter with ``draft_device``).

The round of DESIGN.md section 1, as device work on one stream: draft (``draft_device``) ->
top-K -> tree build (``TreeBuffers``) -> verify inputs (a glue kernel) -> verify forward
(``forward_device``) -> ``sample_post`` -> ``follow_tree`` -> cache compaction and the drafter's
next context rows (glue kernels) -> one small copy to the host: the accepted count, the new
bonus, the tree size and the accepted tokens. The host only decides when to stop.

Same tokens and statistics as ``decode.generate``'s host loop (which it is called from);
``stage_times`` are CUDA-event times (host wall clock under the simulator, which has no events).
"""

from __future__ import annotations

import time

import numpy as np
from numba import config as numba_config
from numba import cuda

from ._device import ceil_div
from .kernels._round import (THREADS, _after_accept_kernel, _gather_features_kernel,
                             _verify_inputs_kernel)
from .kernels.accept import follow_tree, sample_post
from .kernels.topk import topk_logprobs
from .kernels.tree_build import TreeBuffers, build_tree

SIM = numba_config.ENABLE_CUDASIM


class _EventTimer:
    """Per-stage device time: events recorded between the stages' launches, read once a round
    (after the round's one sync). The simulator has no events: host time after a sync."""

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


def device_rounds_supported(target, drafter, method) -> bool:
    """The GPU-resident loop runs a cuda target with a device drafter (or none, for ``ar``)."""
    return hasattr(target, "forward_device") and (method == "ar" or hasattr(drafter, "draft_device"))


def generate_device(target, drafter, prompt, n_new, method, budget, temperature, seed, stops,
                    max_tokens, progress, graph=False):
    """The body of ``decode.generate`` for ``device_rounds_supported`` pairs; returns the
    fields of ``GenerationResult`` as a dict."""
    from .decode import STAGES, commit_tokens, round_seed
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

    tcache = target.new_cache(max_tokens)
    tbufs = TreeBuffers.allocate(max(cap, 1), stream)              # ar: an empty "tree"
    ws = target.workspace(tbufs.capacity + 1)                      # verify rows
    wp = target.workspace(p)                                       # prefill rows
    if cap == 0:
        tbufs.n_nodes.copy_to_device(np.zeros(1, np.int32), stream=stream)
    post = cuda.device_array(tbufs.capacity + 1, np.int32, stream=stream)
    keep = cuda.device_array(tbufs.capacity + 1, np.int32, stream=stream)
    info = cuda.device_array(2, np.int32, stream=stream)
    bonus = cuda.device_array(1, np.int32, stream=stream)
    n_ctx = cuda.device_array(1, np.int32, stream=stream)          # drafter's new context rows
    report = cuda.device_array(3 + tbufs.capacity, np.int32, stream=stream)
    if method != "ar":
        dcache = drafter.new_cache(max_tokens)
        Y, M = len(layers), cfg.hidden_size
        features = cuda.device_array((max(p, cap + 1), Y * M), np.float32, stream=stream)
        layer_ids = cuda.to_device(np.array(layers, np.int32), stream=stream)
        lp = cuda.device_array((L, K), np.float32, stream=stream)
        ids = cuda.device_array((L, K), np.int32, stream=stream)

    def gather(hidden, rows_keep, n_rows, rows):
        """features[j] = the drafter's layers of hidden row rows_keep[j], j < n_rows[0]."""
        grid = (rows, ceil_div(features.shape[1], THREADS))
        _gather_features_kernel[grid, (1, THREADS), stream](hidden, layer_ids, rows_keep, n_rows, features)

    out, acc, sizes = [], [], []
    forwards = draft_calls = 0
    stopped = False
    # prefill: the prompt, its last row's token, and the drafter's first context rows
    timer.mark()
    wp.ids.copy_to_device(np.pad(prompt, (0, wp.rows - p)).astype(np.int32), stream=stream)
    wp.positions.copy_to_device(np.arange(wp.rows, dtype=np.int32), stream=stream)
    wp.parents.copy_to_device(np.arange(-1, wp.rows - 1, dtype=np.int32), stream=stream)
    wp.meta.copy_to_device(np.array([0, p], np.int32), stream=stream)
    target.forward_device(wp, tcache, layers, graph=graph, stream=stream)
    sample_post(wp.logits[p - 1:p], temperature, round_seed(seed, 0), out=bonus, stream=stream)
    if method != "ar":
        prefill_keep = cuda.to_device(np.arange(p, dtype=np.int32), stream=stream)
        n_ctx.copy_to_device(np.array([p], np.int32), stream=stream)
        gather(wp.hidden, prefill_keep, n_ctx, p)
    timer.mark("prefill")
    bonus_h = int(bonus.copy_to_host(stream=stream)[0])
    timer.collect()
    forwards += 1
    tcache.length = start = p
    r = 0
    while True:
        if len(out) + 1 >= n_new or bonus_h in stops:
            out.append(bonus_h)
            stopped = bonus_h in stops
            if progress is not None:
                progress(len(out))
            break
        r += 1
        free = tcache.capacity - start
        if method != "ar":
            nodes = min(cap, free - 1)
            logits_d = drafter.draft_device(features, n_ctx, bonus, dcache, graph=graph, stream=stream)
            draft_calls += 1
            timer.mark("draft")
            topk_logprobs(logits_d, K, out=(lp, ids), stream=stream)
            timer.mark("topk")
            build_tree(lp, ids, nodes, out=tbufs, stream=stream)
            timer.mark("build")
        grid = ceil_div(ws.rows, THREADS)
        _verify_inputs_kernel[grid, THREADS, stream](
            bonus, tbufs.tokens, tbufs.depths, tbufs.parents, tbufs.n_nodes, start,
            ws.ids, ws.positions, ws.parents, ws.meta)
        target.forward_device(ws, tcache, layers, graph=graph, stream=stream)
        forwards += 1
        timer.mark("verify")
        sample_post(ws.logits[:tbufs.capacity + 1], temperature, round_seed(seed, r), out=post,
                    stream=stream)
        follow_tree(tbufs, post, out=(keep, info), stream=stream)
        _after_accept_kernel[ceil_div(tbufs.capacity + 1, THREADS), THREADS, stream](
            keep, info, tbufs.tokens, tbufs.n_nodes, start, tcache._start_n, n_ctx, bonus, report)
        timer.mark("accept")
        tcache.enqueue_compact(stream, n_max=tbufs.capacity + 1, keep=keep)
        if method != "ar":
            gather(ws.hidden, keep, n_ctx, tbufs.capacity + 1)
        timer.mark("compact")
        rep = report.copy_to_host(stream=stream)                   # the round's one sync
        timer.collect()
        n, new_bonus, n_tree = int(rep[0]), int(rep[1]), int(rep[2])
        acc.append(n)
        sizes.append(n_tree)
        start += n
        tcache.length = start
        stopped = commit_tokens(out, [bonus_h] + [int(x) for x in rep[3:2 + n]], stops, n_new)
        if progress is not None:
            progress(len(out))
        if stopped or len(out) == n_new:
            break
        bonus_h = new_bonus
    return dict(tokens=out, acc=acc, sizes=sizes, forwards=forwards, draft_calls=draft_calls,
                stopped=stopped, stage_times=dict(timer.times))
