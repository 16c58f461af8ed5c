"""The decode loop driven from the host: every stage is a call, trees are host ``Tree``s.

Shapes: P prompt tokens, N tree nodes besides the root, L = B-1 draft depths, V vocab,
Y target layers the drafter reads, M hidden size, n accepted nodes (root included).

Every round is the seven steps of docs/DESIGN.md §1 over the reference stage
functions, for a target and drafter of either backend (the target's ``forward`` and the
drafter's ``draft`` take and return numpy). ``method`` only picks the tree: ``ddtree`` the
``budget`` best rank paths (K = min(budget, V)), ``dflash`` the single path of the drafter's argmax
at every depth (K = 1, verified causally), ``ar`` no tree at all (one token per target forward).
Timing is a thin ``_StageTimer`` around the stage calls.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from ..reference.accept import follow_tree, sample_post
from ..reference.topk import topk_logprobs
from ..reference.tree_build import build_tree
from ..model.protocols import Drafter, Target
from ..tree import Tree
from .rounds import STAGES, GenerationResult, RoundLog, RoundTrace, round_seed

_ROOT_ONLY = Tree(tokens=np.zeros(0, np.int32), depths=np.zeros(0, np.int32),
                  parents=np.array([-1], np.int32), ranks=np.zeros(0, np.int32),
                  scores=np.zeros(0, np.float64))                        # the ``ar`` "tree"


@dataclass
class _StageTimer:
    """Seconds per stage, accumulated around the stage calls (host wall clock)."""

    times: dict = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))

    @contextmanager
    def __call__(self, stage: str):
        t0 = time.perf_counter()
        yield
        self.times[stage] += time.perf_counter() - t0


def _draft_tree(drafter, pending, bonus, dcache, method, budget, vocab, free, timer, log) -> Tree:
    """One round's tree: the root alone for ``ar``; else the drafter's distributions [L, V], their
    top-K [L, K] and the build (``dflash``: the argmax chain), at most free - 1 nodes (the cache's
    room besides the root)."""
    if method == "ar":
        return _ROOT_ONLY
    with timer("draft"):
        logits_d = drafter.draft(pending, bonus, dcache)                    # [L, V]
    log.drafter_forwards += 1
    chain = method == "dflash"
    if not chain:                       # a tree of budget nodes reaches no depth past budget
        logits_d = logits_d[:budget]    # (decode.device.tree_depths): the same tree from these rows
    with timer("topk"):
        lp, ids = topk_logprobs(logits_d, 1 if chain else min(budget, vocab))  # [min(L, budget), K]
    with timer("build"):
        return build_tree(lp, ids, min(logits_d.shape[0] if chain else budget, free - 1))


def _accept_and_compact(res, tree, tcache, start, temperature, seed, timer):
    """Steps 5-7 of a round on the verify forward's output ``res``: the target's choices post
    [N+1], the accepted nodes keep [n] and the next bonus token, the cache rows of keep compacted
    to start.. and the features the drafter reads next, res.hidden[keep] [n, Y, M]."""
    with timer("accept"):
        post = sample_post(res.logits, temperature, seed)                  # [N+1]
        keep, new_bonus = follow_tree(tree, post)                          # [n], int
    with timer("compact"):
        tcache.compact(start, keep)
    return post, keep, new_bonus, res.hidden[keep]


def generate_host(target: Target, drafter: Drafter | None, *, prompt, n_new, method, budget, temperature, seed,
                  stops, max_tokens, progress, trace=False) -> GenerationResult:
    """The body of ``decode.generate`` for the host loop, on checked arguments (prompt [P] int32,
    n_new >= 0, stops a set of ids)."""
    timer = _StageTimer()
    t_start = time.perf_counter()
    layers = () if method == "ar" else tuple(drafter.target_layer_ids)
    vocab = target.config.vocab_size
    log = RoundLog(method, int(prompt.shape[0]), n_new, stops, progress)
    if n_new > 0:
        tcache = target.new_cache(max_tokens)
        dcache = drafter.new_cache(max_tokens) if method != "ar" else None
        p = prompt.shape[0]
        with timer("prefill"):
            res = target.forward(prompt, np.arange(p, dtype=np.int32), tcache, hidden_layer_ids=layers)
            bonus = int(sample_post(res.logits[-1:], temperature, round_seed(seed, 0))[0])
        log.target_forwards += 1
        pending = res.hidden                                                # [P, Y, M] not yet drafted on
        start, r = p, 0
        while not log.bonus_ends(bonus):
            r += 1
            free = tcache.capacity - start                                   # >= 2 here (see checks)
            root = np.array([bonus], np.int32)
            tree = _draft_tree(drafter, pending, bonus, dcache, method, budget, vocab, free, timer, log)
            with timer("verify"):
                res = target.forward(
                    np.concatenate([root, tree.tokens]),                     # [N+1]
                    start + np.concatenate([[0], tree.depths]).astype(np.int32),
                    tcache, parents=tree.parents if method == "ddtree" else None,
                    hidden_layer_ids=layers)
            log.target_forwards += 1
            post, keep, new_bonus, pending = _accept_and_compact(res, tree, tcache, start, temperature,
                                                                 round_seed(seed, r), timer)
            if trace:
                log.traces.append(RoundTrace(start, bonus, tree, post, keep))
            start += len(keep)
            accepted = [bonus] + [int(tree.tokens[j - 1]) for j in keep[1:]]
            if log.commit(accepted, tree.num_nodes):
                break
            bonus = new_bonus
    return log.result(timer.times, time.perf_counter() - t_start, loop="host", stage_clock="host",
                      trace=trace)
