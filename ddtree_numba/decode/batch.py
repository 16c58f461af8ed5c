"""``generate_batch``: DDTree (or ``dflash`` / ``ar``) for several prompts at once, one round for
all of them (issue 17).

Shapes: S sequences, P_s prompt tokens of sequence s, N_s its tree's nodes, L draft depths.

Every sequence has its own caches and its own state (bonus token, pending drafter context,
round counter, ``RoundLog``); they advance in lockstep. A round drafts and builds each live
sequence's tree, then verifies every live sequence's tree in **one** target forward
(``forward_batch``: the projections and the MoE over all rows, the attention per sequence, so a
node sees its own sequence's cache and its own ancestors only), then accepts and compacts per
sequence. A sequence that is done (its stop token, or ``max_new_tokens``) leaves the batch and
costs nothing afterwards. Each sequence draws from ``round_seed(seed, its round)`` exactly as a
``generate`` of that prompt alone with the same ``seed`` does, so its tokens are the same alone or
batched (at any temperature, up to the backend's arithmetic: numpy's BLAS may round a row
differently in a larger matrix, which can only matter at an exact near-tie).

On the cuda backend ``CudaTarget.forward_batch`` is the same one forward: the GEMMs and the MoE
launched once over every live sequence's rows, each sequence's cache writes over its own rows,
and the attention of all of them in one launch set over a pool of caches (``new_cache_pool``: a
slot a sequence, each as large as the largest sequence needs); each sequence's bits are those of
its own forward. With a
device drafter (``CudaDrafter``) or ``ar``, every round runs on the GPU instead
(``decode.device_batch``: the sizes on the device, a round one CUDA graph). A target without
``forward_batch`` gets a forward per sequence in the same rounds (same tokens, no shared expert
reads, no unique-expert counts).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..model.protocols import Drafter, Target
from ..reference.accept import sample_post
from .dispatch import device_loop_applies
from .host import _StageTimer, _accept_and_compact, _draft_tree
from .rounds import RoundLog, check_generate_inputs, round_seed


@dataclass(frozen=True)
class BatchRound:
    """One batched round: ``sequences`` live, ``rows`` verified in its target forward (roots
    included), ``accepted`` the tree rows the sequences kept (each its root and accepted path: its
    acceptance length), summed, before a stop token or ``max_new_tokens`` cuts what is output,
    and ``unique_experts`` [layers] int32, the distinct routed experts the router picked over all
    rows (0 for dense layers; None when the target has no batched forward)."""

    sequences: int
    rows: int
    accepted: int
    unique_experts: np.ndarray | None


class BatchResult(list):
    """The ``GenerationResult`` of each prompt, in order (a list), plus ``rounds``: a
    ``BatchRound`` per batched round (the prefill not counted) and ``elapsed_s`` for the batch."""

    def __init__(self, results, rounds, elapsed_s):
        super().__init__(results)
        self.rounds = list(rounds)
        self.elapsed_s = float(elapsed_s)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens of every sequence over the batch's wall time."""
        return sum(len(r.tokens) for r in self) / self.elapsed_s if self.elapsed_s > 0 else float("nan")

    def __repr__(self) -> str:
        return (f"BatchResult({len(self)} sequences, {sum(len(r.tokens) for r in self)} tokens in "
                f"{len(self.rounds)} rounds, {self.tokens_per_s:.1f} tokens/s)")


@dataclass
class _Sequence:
    """One prompt's state between rounds."""

    log: RoundLog
    tcache: object
    dcache: object
    pending: np.ndarray          # [n, Y, M] target features the drafter has not seen yet
    start: int                   # cache rows committed
    bonus: int
    r: int = 0                   # rounds done
    done: bool = False


def generate_batch(target: Target, drafter: Drafter | None, prompts, max_new_tokens: int, method: str = "ddtree",
                   budget: int = 64, temperature: float = 0.0, seed: int = 0, stop_token_ids=(),
                   max_tokens: int | None = None, allow_long_context: bool = False, graph=None) -> BatchResult:
    """``generate`` for every prompt of ``prompts`` (a non-empty list of 1-D token-id arrays, of any
    lengths), their rounds batched; -> ``BatchResult``, a list of ``GenerationResult`` in the
    prompts' order. The other arguments are ``generate``'s, applied to every prompt (``max_tokens``:
    cache rows per sequence). Each sequence's tokens equal ``generate`` of its prompt alone with the
    same arguments (``ar``'s at temperature 0).

    A device target with cache pools (``CudaTarget``) with a device drafter (``CudaDrafter``), or
    ``ar``, runs every round on the GPU (``decode.device_batch``; results with ``loop='device'``):
    ``graph`` as ``generate``'s (None: each round one CUDA graph where it can be captured). Any
    other pair runs the rounds from the host (``loop='host'``; ``graph`` must be None)."""
    if isinstance(prompts, np.ndarray) and prompts.ndim == 1 or not isinstance(prompts, (list, tuple)):
        raise ValueError("prompts must be a list of prompts (1-D token-id arrays), got "
                         f"{type(prompts).__name__}")
    if not prompts:
        raise ValueError("prompts is empty: generate_batch needs at least one prompt")
    args = []
    for s, prompt in enumerate(prompts):
        try:
            args.append(check_generate_inputs(target, drafter, prompt, max_new_tokens, method, budget, temperature,
                                              seed, max_tokens, stop_token_ids, allow_long_context))
        except ValueError as err:
            raise ValueError(f"prompts[{s}]: {err}") from None
    t_start = time.perf_counter()
    if _on_device(target, drafter, method):
        return _generate_batch_device(target, drafter, args, method, budget, temperature, seed, graph, t_start)
    if graph is not None:
        raise ValueError("graph is for a batch whose rounds run on the GPU: a cuda target with a cuda drafter "
                         "(or method='ar'); leave it None here")
    timer = _StageTimer()
    layers = () if method == "ar" else tuple(drafter.target_layer_ids)
    vocab = target.config.vocab_size
    batched = hasattr(target, "forward_batch")
    seqs, rounds = [], []
    # a target with cache pools (cuda) gives every sequence a slot of one: one attention launch set
    # a verify for all of them; each slot as large as the largest sequence needs
    decoding = [a for a in args if a.n_new > 0]
    pool = (iter(target.new_cache_pool(len(decoding), max(a.max_tokens for a in decoding)).caches)
            if decoding and hasattr(target, "new_cache_pool") else None)
    for a in args:
        log = RoundLog(method, int(a.prompt.shape[0]), a.n_new, a.stops)
        tcache = (next(pool) if pool else target.new_cache(a.max_tokens)) if a.n_new > 0 else None
        dcache = drafter.new_cache(a.max_tokens) if a.n_new > 0 and method != "ar" else None
        seqs.append(_Sequence(log, tcache, dcache, None, int(a.prompt.shape[0]), -1, done=a.n_new == 0))
    live = [s for s in seqs if not s.done]
    if live:                                          # the prefill: every prompt in one forward
        with timer("prefill"):
            outs = _verify(target, batched, [(args[i].prompt, np.arange(s.start, dtype=np.int32), s.tcache, None)
                                             for i, s in enumerate(seqs) if not s.done], layers)[0]
        for s, out in zip(live, outs):
            s.log.target_forwards += 1
            s.pending = out.hidden                                           # [P, Y, M]
            s.bonus = int(sample_post(out.logits[-1:], temperature, round_seed(seed, 0))[0])
            s.done = s.log.bonus_ends(s.bonus)
    while True:
        live = [s for s in seqs if not s.done]
        if not live:
            break
        trees = []
        for s in live:                                # drafts and trees, one per live sequence
            s.r += 1
            trees.append(_draft_tree(drafter, s.pending, s.bonus, s.dcache, method, budget, vocab,
                                     s.tcache.capacity - s.start, timer, s.log))
        with timer("verify"):                         # every live sequence's tree in one forward
            segs = [(np.concatenate([[s.bonus], tree.tokens]).astype(np.int32),
                     s.start + np.concatenate([[0], tree.depths]).astype(np.int32),
                     s.tcache, tree.parents if method == "ddtree" else None) for s, tree in zip(live, trees)]
            outs, unique = _verify(target, batched, segs, layers)
        accepted = 0
        for s, tree, out in zip(live, trees, outs):
            s.log.target_forwards += 1
            _, keep, new_bonus, s.pending = _accept_and_compact(out, tree, s.tcache, s.start, temperature,
                                                                round_seed(seed, s.r), timer)
            s.start += len(keep)
            accepted += len(keep)
            if s.log.commit([s.bonus] + [int(tree.tokens[j - 1]) for j in keep[1:]], tree.num_nodes):
                s.done = True
                continue
            s.bonus = new_bonus
            s.done = s.log.bonus_ends(s.bonus)
        rounds.append(BatchRound(len(live), sum(seg[0].shape[0] for seg in segs), accepted, unique))
    elapsed = time.perf_counter() - t_start
    results = [s.log.result(timer.times, elapsed, loop="host", stage_clock="host") for s in seqs]
    return BatchResult(results, rounds, elapsed)


def _on_device(target, drafter, method: str) -> bool:
    """Whether a batch of this pair runs every round on the GPU (``decode.device_batch``): where
    ``generate`` would run its device loop, and the target has cache pools."""
    return device_loop_applies(target, drafter, method) and hasattr(target, "pooled_launch")


def _generate_batch_device(target, drafter, args, method, budget, temperature, seed, graph, t_start):
    from .device_batch import generate_batch_device      # (numba.cuda only when a GPU batch runs)
    decoding = [a for a in args if a.n_new > 0]
    logs, rounds, times = ([], [], {}) if not decoding else generate_batch_device(
        target, drafter, decoding, method=method, budget=budget, temperature=temperature, seed=seed, graph=graph)
    elapsed = time.perf_counter() - t_start
    it = iter(logs)
    results = [(next(it) if a.n_new > 0 else RoundLog(method, int(a.prompt.shape[0]), 0, a.stops))
               .result(times, elapsed, loop="device", stage_clock="host") for a in args]
    return BatchResult(results, [BatchRound(*r) for r in rounds], elapsed)


def _verify(target, batched: bool, segs, layers):
    """One target forward over the segments (ids, positions, cache, parents) when the target has
    ``forward_batch``, else one forward each. -> (outputs, unique experts [layers] or None)."""
    if batched:
        from ..model.target import Segment
        res = target.forward_batch([Segment(*seg) for seg in segs], hidden_layer_ids=layers)
        return res.outputs, res.unique_experts
    return [target.forward(ids, pos, cache, parents=parents, hidden_layer_ids=layers)
            for ids, pos, cache, parents in segs], None


