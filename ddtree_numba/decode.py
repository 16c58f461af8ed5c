"""The decode loops: DDTree (DESIGN.md section 1), the DFlash chain, and plain autoregressive.

Shapes: P prompt tokens, N tree nodes besides the root, L = B-1 draft depths, V vocab,
Y target layers the drafter reads, M hidden size, n accepted nodes (root included).

Every round is the same seven steps over the reference stage functions; ``method`` only picks
the tree: ``ddtree`` the ``budget`` best rank paths (K = min(budget, V)), ``dflash`` the single
path of the drafter's argmax at every depth (K = 1, verified causally), ``ar`` no tree at all
(one token per target forward). Timing is a thin ``_StageTimer`` around the stage calls.

A drafter is anything with ``block_size``, ``target_layer_ids``, ``new_cache(max_tokens)``
(an object with ``length``) and ``draft(features [n, Y, M], bonus, cache) -> logits [L, V]``;
``ddtree_numba.model.drafter.Drafter`` is the DFlash one.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from ._checks import check_int
from .reference.accept import follow_tree, sample_post, splitmix64
from .reference.topk import topk_logprobs
from .reference.tree_build import build_tree
from .tree import Tree

METHODS = ("ddtree", "dflash", "ar")
STAGES = ("prefill", "draft", "topk", "build", "verify", "accept", "compact")
_ROOT_ONLY = Tree(tokens=np.zeros(0, np.int32), depths=np.zeros(0, np.int32),
                  parents=np.array([-1], np.int32), ranks=np.zeros(0, np.int32),
                  scores=np.zeros(0, np.float64))                        # the ``ar`` "tree"


@dataclass(frozen=True, eq=False)
class RoundTrace:
    """One round for notebooks: the tree drafted after ``bonus`` at ``start``, the target's choice
    ``post`` [N+1] at every node, and the accepted path ``keep`` [n] (node ids, keep[0] = 0)."""

    start: int
    bonus: int
    tree: Tree
    post: np.ndarray
    keep: np.ndarray


@dataclass(frozen=True, eq=False)
class GenerationResult:
    """What ``generate`` produced and how.

    tokens              [n] int32   generated tokens (prompt excluded), cut at max_new_tokens or
                                    just after the first stop token
    acceptance_lengths  [R] int32   per verify round, the tokens that round's target forward
                                    accepted, *bonus included*: the round's root (the bonus token
                                    decided by the previous forward) plus the drafted tokens accepted
                                    after it (= len(keep); 1 for ``ar``). A last round cut short by
                                    max_new_tokens or a stop token still counts every token it
                                    accepted, so sum(acceptance_lengths) may exceed len(tokens);
                                    len(tokens) / target_forwards is the output-side measure
    accepted_depths     [R] int32   drafted tokens accepted per round (acceptance length - 1)
    tree_sizes          [R] int32   drafted nodes verified per round (root not counted)
    target_forwards     int         target forwards, the prefill included
    drafter_forwards    int         drafter forwards (0 for ``ar``)
    stage_times         dict        seconds per stage (prefill, draft, topk, build, verify, accept,
                                    compact), wall clock around each stage call
    elapsed_s           float       wall clock of the whole call
    traces              tuple | None  RoundTrace per round when ``trace=True``
    """

    method: str
    prompt_len: int
    tokens: np.ndarray
    acceptance_lengths: np.ndarray
    accepted_depths: np.ndarray
    tree_sizes: np.ndarray
    target_forwards: int
    drafter_forwards: int
    stage_times: dict
    elapsed_s: float
    stopped: bool
    traces: tuple | None = None

    @property
    def mean_acceptance_length(self) -> float:
        return float(self.acceptance_lengths.mean()) if self.acceptance_lengths.size else 0.0

    @property
    def forwards_saved(self) -> int:
        """Target forwards autoregressive decoding would need for these tokens (one each, the
        prefill producing the first) minus the forwards used."""
        return int(self.tokens.shape[0]) - self.target_forwards

    def summary(self, file=sys.stdout) -> str:
        """Mean acceptance length, forwards saved and tokens/s; printed to ``file`` (None: not
        printed) and returned."""
        n = int(self.tokens.shape[0])
        rate = n / self.elapsed_s if self.elapsed_s > 0 else float("inf")
        stages = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in self.stage_times.items() if v > 0)
        text = (f"{self.method}: {n} tokens in {self.target_forwards} target forwards "
                f"({len(self.acceptance_lengths)} rounds + prefill), mean acceptance length "
                f"{self.mean_acceptance_length:.2f}, forwards saved {self.forwards_saved} "
                f"({n / max(self.target_forwards, 1):.2f} tokens/forward), {rate:.1f} tokens/s"
                f"\n  stages: {stages}")
        if file is not None:
            print(text, file=file)
        return text


@dataclass
class _StageTimer:
    """Seconds per stage, accumulated around the stage calls (host wall clock: numpy backend)."""

    times: dict = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))

    @contextmanager
    def __call__(self, stage: str):
        t0 = time.perf_counter()
        yield
        self.times[stage] += time.perf_counter() - t0


def commit_tokens(out: list, tokens, stops, n_new: int) -> bool:
    """Append a round's tokens to ``out`` up to and including the first stop token, and no
    further than ``n_new`` tokens in all; True when a stop token ended generation."""
    for tok in tokens:
        out.append(tok)
        if tok in stops:
            return True
        if len(out) == n_new:
            return False
    return False


def round_seed(seed: int, r: int) -> int:
    """The sampling seed of round r (0 = the prefill): splitmix64 of (seed, r), so rounds draw
    independent tokens and ``sample_post``'s draws stay a pure function of (seed, round, node, token)."""
    with np.errstate(over="ignore"):
        return int(splitmix64(np.uint64(seed) ^ splitmix64(np.uint64(r))))


def _check_generate_inputs(target, drafter, prompt_ids, max_new_tokens, method, budget, temperature,
                           seed, max_tokens):
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method != "ar" and drafter is None:
        raise ValueError(f"method {method!r} needs a drafter")
    prompt = np.asarray(prompt_ids)
    if prompt.ndim != 1:
        raise ValueError(f"prompt_ids must be 1-D, got shape {prompt.shape}")
    if prompt.shape[0] == 0:
        raise ValueError("prompt_ids is empty: generation needs at least one prompt token")
    if not np.issubdtype(prompt.dtype, np.integer):
        raise ValueError(f"prompt_ids must hold integers, got dtype {prompt.dtype}")
    vocab = target.config.vocab_size
    if prompt.min() < 0 or prompt.max() >= vocab:
        bad = int(prompt[(prompt < 0) | (prompt >= vocab)][0])
        raise ValueError(f"prompt token id {bad} is out of range [0, {vocab})")
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 0)
    budget = check_int("budget", budget, 0)
    check_int("seed", seed, 0, 2**64 - 1)
    temperature = float(temperature)
    if not (np.isfinite(temperature) and temperature >= 0.0):
        raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
    p = prompt.shape[0]
    if max_tokens is None:
        tree_rows = 1 + (0 if method == "ar" else max(budget, drafter.block_size - 1))
        max_tokens = p + max_new_tokens + tree_rows
    max_tokens = check_int("max_tokens", max_tokens, 1)
    if p > max_tokens:
        raise ValueError(f"prompt of {p} tokens is longer than the cache ({max_tokens} rows)")
    if p + max_new_tokens > max_tokens:
        raise ValueError(f"prompt ({p}) + max_new_tokens ({max_new_tokens}) exceed the cache "
                         f"({max_tokens} rows)")
    return prompt.astype(np.int32), max_new_tokens, budget, temperature, max_tokens


def generate(target, drafter, prompt_ids, max_new_tokens: int, method: str = "ddtree",
             budget: int = 64, temperature: float = 0.0, seed: int = 0, stop_token_ids=(),
             max_tokens: int | None = None, trace: bool = False, progress=None,
             graph: bool = False) -> GenerationResult:
    """Generate up to ``max_new_tokens`` after ``prompt_ids`` with ``method``.

    ``ddtree``: DESIGN.md section 1 with a tree of ``budget`` nodes; ``dflash``: the drafter's
    argmax chain; ``ar``: one token per target forward (``drafter`` may be None). At
    ``temperature`` 0 all three give the same tokens; above it every node is sampled from the
    target with a seeded generator (``round_seed``), which keeps the target's distribution exact.
    Generation ends after exactly ``max_new_tokens`` tokens or at the first of
    ``stop_token_ids`` (kept, as autoregressive decoding would emit it). ``max_tokens``: cache
    rows (default: enough for the prompt, the new tokens and one tree); a prompt that does not
    fit raises ``ValueError``. ``progress``: a callable, called as ``progress(len(tokens so far))``
    after each round and when the last token is out (a progress bar's hook).

    On the cuda backend with a device drafter (``CudaDrafter``; none for ``ar``) every round
    stays on the GPU (``decode_cuda``): the host reads back only the accepted tokens, and
    ``stage_times`` are CUDA-event times; ``graph=True`` replays the target's and drafter's
    forwards as CUDA graphs. ``trace=True`` (host trees per round) uses the host loop.
    """
    prompt, n_new, budget, temperature, max_tokens = _check_generate_inputs(
        target, drafter, prompt_ids, max_new_tokens, method, budget, temperature, seed, max_tokens)
    stops = {int(s) for s in stop_token_ids}
    from .decode_cuda import device_rounds_supported, generate_device
    if n_new > 0 and not trace and device_rounds_supported(target, drafter, method):
        t_start = time.perf_counter()
        d = generate_device(target, drafter, prompt, n_new, method, budget, temperature, seed, stops,
                            max_tokens, progress, graph=graph)
        acc = np.asarray(d["acc"], np.int32)
        return GenerationResult(
            method=method, prompt_len=int(prompt.shape[0]), tokens=np.asarray(d["tokens"], np.int32),
            acceptance_lengths=acc, accepted_depths=acc - 1, tree_sizes=np.asarray(d["sizes"], np.int32),
            target_forwards=d["forwards"], drafter_forwards=d["draft_calls"],
            stage_times=d["stage_times"], elapsed_s=time.perf_counter() - t_start, stopped=d["stopped"])
    timer = _StageTimer()
    t_start = time.perf_counter()
    layers = () if method == "ar" else tuple(drafter.target_layer_ids)
    vocab = target.config.vocab_size

    out, acc, sizes, traces = [], [], [], []
    forwards, draft_calls, stopped = 0, 0, False
    if n_new > 0:
        tcache = target.new_cache(max_tokens)
        dcache = drafter.new_cache(max_tokens) if method != "ar" else None
        p = prompt.shape[0]
        with timer("prefill"):
            res = target.forward(prompt, np.arange(p, dtype=np.int32), tcache, hidden_layer_ids=layers)
            bonus = int(sample_post(res.logits[-1:], temperature, round_seed(seed, 0))[0])
        forwards += 1
        pending = res.hidden                                                # [P, Y, M] not yet drafted on
        start, r = p, 0
        while True:
            # the bonus is decided: emit it alone if it ends generation
            if len(out) + 1 >= n_new or bonus in stops:
                out.append(bonus)
                stopped = bonus in stops
                if progress is not None:
                    progress(len(out))
                break
            r += 1
            free = tcache.capacity - start                                   # >= 2 here (see checks)
            root = np.array([bonus], np.int32)
            if method == "ar":
                tree = _ROOT_ONLY
            else:
                with timer("draft"):
                    logits_d = drafter.draft(pending, bonus, dcache)        # [L, V]
                draft_calls += 1
                chain = method == "dflash"
                with timer("topk"):
                    lp, ids = topk_logprobs(logits_d, 1 if chain else min(budget, vocab))  # [L, K]
                with timer("build"):
                    nodes = min(logits_d.shape[0] if chain else budget, free - 1)
                    tree = build_tree(lp, ids, nodes)
            with timer("verify"):
                res = target.forward(
                    np.concatenate([root, tree.tokens]),                     # [N+1]
                    start + np.concatenate([[0], tree.depths]).astype(np.int32),
                    tcache, parents=tree.parents if method == "ddtree" else None,
                    hidden_layer_ids=layers)
            forwards += 1
            with timer("accept"):
                post = sample_post(res.logits, temperature, round_seed(seed, r))  # [N+1]
                keep, new_bonus = follow_tree(tree, post)                   # [n], int
            with timer("compact"):
                tcache.compact(start, keep)
                pending = res.hidden[keep]                                  # [n, Y, M]
            acc.append(len(keep))
            sizes.append(tree.num_nodes)
            if trace:
                traces.append(RoundTrace(start, bonus, tree, post, keep))
            start += len(keep)
            stopped = commit_tokens(out, [bonus] + [int(tree.tokens[j - 1]) for j in keep[1:]],
                                    stops, n_new)
            if progress is not None:
                progress(len(out))
            if stopped or len(out) == n_new:
                break
            bonus = new_bonus

    acc = np.asarray(acc, np.int32)
    return GenerationResult(
        method=method, prompt_len=int(prompt.shape[0]), tokens=np.asarray(out, np.int32),
        acceptance_lengths=acc, accepted_depths=acc - 1, tree_sizes=np.asarray(sizes, np.int32),
        target_forwards=forwards, drafter_forwards=draft_calls, stage_times=dict(timer.times),
        elapsed_s=time.perf_counter() - t_start, stopped=stopped,
        traces=tuple(traces) if trace else None)
