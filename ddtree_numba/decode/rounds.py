"""What the decode loops share: the methods, the stage names, the result, and the bookkeeping
of a round's output (docs/DESIGN.md §1).

Shapes: N tree nodes besides the root, n accepted nodes (root included), R verify rounds.
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass

import numpy as np

from .._checks import check_int, check_temperature
from ..reference.accept import round_seed  # noqa: F401  (decode.round_seed, re-exported)
from ..tree import Tree

METHODS = ("ddtree", "dflash", "ar")
# "round": a whole round replayed as one CUDA graph (its stages cannot be timed apart)
STAGES = ("prefill", "draft", "topk", "build", "verify", "accept", "compact", "round")
LOOPS = ("host", "device")
# what a result's stage_times were measured with
STAGE_CLOCKS = {
    "host": "host wall clock around each stage call",
    "cuda_events": "CUDA events recorded between the stages' launches on the round's stream",
    "host_after_sync": "host wall clock after a sync at each stage boundary (the CUDA simulator has no events)",
}
CLOCK_WORDS = {"host": "wall clock", "cuda_events": "CUDA events", "host_after_sync": "wall clock after syncs"}


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
                                    and the last token, the bonus of the last forward, is in no
                                    round, so it may also be len(tokens) - 1 (max_new_tokens = 1:
                                    one token, no round); len(tokens) / target_forwards is the
                                    output-side measure
    accepted_depths     [R] int32   drafted tokens accepted per round (acceptance length - 1)
    tree_sizes          [R] int32   drafted nodes verified per round (root not counted)
    target_forwards     int         target forwards, the prefill included
    drafter_forwards    int         drafter forwards (0 for ``ar``)
    stage_times         dict        seconds per stage (prefill, draft, topk, build, verify, accept,
                                    compact), measured as ``stage_clock`` says; "round": the
                                    rounds replayed as one CUDA graph each (not split by stage)
    elapsed_s           float       wall clock of the whole call
    loop                str         which loop ran: "host" (stages called from Python, trees on the
                                    host) or "device" (every round on the GPU)
    stage_clock         str         a key of ``STAGE_CLOCKS``: what ``stage_times`` measured
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
    loop: str
    stage_clock: str
    traces: tuple | None = None

    @property
    def mean_acceptance_length(self) -> float:
        return float(self.acceptance_lengths.mean()) if self.acceptance_lengths.size else 0.0

    @property
    def forwards_saved(self) -> int:
        """Target forwards autoregressive decoding would need for these tokens (one each, the
        prefill producing the first) minus the forwards used."""
        return int(self.tokens.shape[0]) - self.target_forwards

    @property
    def dropped(self) -> int:
        """Tokens the rounds accepted past the end (max_new_tokens, or after a stop token): counted
        in ``acceptance_lengths``, not kept in ``tokens``."""
        return max(int(self.acceptance_lengths.sum()) - int(self.tokens.shape[0]), 0)

    def record(self) -> dict:
        """The per-run statistics as plain JSON types (what ``ddtree-numba generate --json`` and
        a sweep's runs store): num_tokens, acceptance_lengths, tree_sizes, target_forwards,
        drafter_forwards, elapsed_s, stage_times_s, loop, stage_clock."""
        return dict(
            num_tokens=int(self.tokens.shape[0]), acceptance_lengths=self.acceptance_lengths.astype(int).tolist(),
            tree_sizes=self.tree_sizes.astype(int).tolist(), target_forwards=int(self.target_forwards),
            drafter_forwards=int(self.drafter_forwards), elapsed_s=float(self.elapsed_s),
            stage_times_s={k: float(v) for k, v in self.stage_times.items()}, loop=self.loop,
            stage_clock=self.stage_clock)

    def summary(self, file="stdout") -> str | None:
        """Mean acceptance length, forwards saved and tokens/s, printed to ``file`` (default: the
        current ``sys.stdout``); with ``file=None`` the text is returned instead (nothing printed
        twice in a notebook)."""
        n, rounds = int(self.tokens.shape[0]), len(self.acceptance_lengths)
        rate = n / self.elapsed_s if self.elapsed_s > 0 else float("inf")
        stages = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in self.stage_times.items() if v > 0)
        dropped = (f" ({self.dropped} more were accepted past the end, by max_new_tokens or a stop token, "
                   "and dropped)" if self.dropped else "")
        forwards = (f"{rounds} {'round' if rounds == 1 else 'rounds'} + the prefill" if self.target_forwards
                    else "nothing asked for")
        text = (f"{self.method}: {n} tokens in {self.target_forwards} target forwards "
                f"({forwards}), mean acceptance length "
                f"{self.mean_acceptance_length:.2f} per round{dropped}, forwards saved {self.forwards_saved} "
                f"({n / max(self.target_forwards, 1):.2f} tokens/forward), {rate:.1f} tokens/s"
                f"\n  stages ({self.loop} loop; {CLOCK_WORDS[self.stage_clock]}): {stages}")
        if file is None:
            return text
        if file != "stdout" and not callable(getattr(file, "write", None)):
            raise ValueError(f"file must be a writable stream (sys.stderr, an open file), 'stdout' or None, got {file!r}")
        print(text, file=sys.stdout if file == "stdout" else file)
        return None

    def __repr__(self) -> str:
        return (f"GenerationResult({self.method}: {int(self.tokens.shape[0])} tokens, {self.target_forwards} target "
                f"forwards, mean acceptance length {self.mean_acceptance_length:.2f}, {self.loop} loop)")

    def _repr_html_(self) -> str:
        """Jupyter: the summary as a small table."""
        rows = [("method", self.method), ("tokens", int(self.tokens.shape[0])),
                ("target forwards", self.target_forwards), ("verify rounds", len(self.acceptance_lengths)),
                ("mean acceptance length", f"{self.mean_acceptance_length:.2f}"),
                ("forwards saved", self.forwards_saved), ("dropped past the end", self.dropped),
                ("loop", self.loop), ("wall clock", f"{self.elapsed_s:.3f} s")]
        body = "".join(f"<tr><th style='text-align:left'>{k}</th><td>{v}</td></tr>" for k, v in rows)
        return f"<table>{body}</table>"


class RoundLog:
    """The bookkeeping both loops do the same way: the tokens emitted so far, the stop rule, the
    per-round statistics, the progress hook; ``result`` makes the ``GenerationResult``."""

    def __init__(self, method: str, prompt_len: int, n_new: int, stops: set, progress=None):
        self.method, self.prompt_len, self.n_new, self.stops = method, prompt_len, n_new, stops
        self.progress = progress
        self.tokens: list[int] = []
        self.acceptance: list[int] = []         # [R] len(keep) per round
        self.sizes: list[int] = []              # [R] tree nodes per round
        self.traces: list[RoundTrace] = []
        self.target_forwards = 0
        self.drafter_forwards = 0
        self.stopped = False

    def _report(self) -> None:
        if self.progress is not None:
            self.progress(len(self.tokens))

    def bonus_ends(self, bonus: int) -> bool:
        """Before a round: the bonus is decided; if it ends generation (the last token wanted, or
        a stop token) emit it alone and return True."""
        if len(self.tokens) + 1 >= self.n_new or bonus in self.stops:
            self.tokens.append(bonus)
            self.stopped = bonus in self.stops
            self._report()
            return True
        return False

    def commit(self, accepted_tokens: list, tree_size: int) -> bool:
        """After a round: record it and emit ``accepted_tokens`` (the bonus, then the accepted
        drafted tokens: len(keep) of them) up to the first stop token and no further than ``n_new``
        in all; True when generation is over."""
        self.acceptance.append(len(accepted_tokens))
        self.sizes.append(tree_size)
        self.stopped = commit_tokens(self.tokens, accepted_tokens, self.stops, self.n_new)
        self._report()
        return self.stopped or len(self.tokens) == self.n_new

    def result(self, stage_times: dict, elapsed_s: float, loop: str, stage_clock: str,
               trace: bool = False) -> GenerationResult:
        acc = np.asarray(self.acceptance, np.int32)
        return GenerationResult(
            method=self.method, prompt_len=self.prompt_len, tokens=np.asarray(self.tokens, np.int32),
            acceptance_lengths=acc, accepted_depths=acc - 1, tree_sizes=np.asarray(self.sizes, np.int32),
            target_forwards=self.target_forwards, drafter_forwards=self.drafter_forwards,
            stage_times=dict(stage_times), elapsed_s=elapsed_s, stopped=self.stopped, loop=loop,
            stage_clock=stage_clock, traces=tuple(self.traces) if trace else None)


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


@dataclass(frozen=True)
class GenerateArgs:
    """``generate``'s arguments, checked: prompt [P] int32, stops a set of token ids."""

    prompt: np.ndarray
    n_new: int
    budget: int
    temperature: float
    seed: int
    stops: frozenset
    max_tokens: int


def _memory_bytes(backend: str) -> int | None:
    """What the backend can hold: the GPU's free memory, or the host's available memory (Linux's
    MemAvailable, else the physical memory; None when the system does not say)."""
    if backend == "cuda":
        from numba import config as numba_config
        if numba_config.ENABLE_CUDASIM:
            return None
        from numba import cuda
        return int(cuda.current_context().get_memory_info()[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _forward_bytes(cfg, rows: int, cache_rows: int) -> int:
    """float32 bytes of the largest buffers of one forward of ``rows`` tokens over ``cache_rows``
    cache rows: logits, attention scores of every head and their per-chunk partial outputs (the
    GPU's 128-key chunks, ``kernels.mla.KEY_CHUNK``), every layer's hidden state; the row counts
    rounded up to powers of two, as the cuda backend allocates them."""
    rows, cache_rows = 1 << (rows - 1).bit_length(), 1 << (cache_rows - 1).bit_length()
    chunks = -(-cache_rows // 128)
    heads = cfg.num_attention_heads * (cache_rows + chunks * (cfg.kv_lora_rank or 0))
    return 4 * rows * (cfg.vocab_size + heads + cfg.num_hidden_layers * cfg.hidden_size)


def check_generate_inputs(target, drafter, prompt_ids, max_new_tokens, method, budget, temperature, seed,
                          max_tokens, stop_token_ids=(), allow_long_context=False) -> GenerateArgs:
    """``generate``'s arguments, checked; a ``ValueError`` naming the first that is wrong. Sizes are
    checked before anything is allocated: the context against ``max_position_embeddings`` (unless
    ``allow_long_context``, which warns), the cache and one verify forward against the memory the
    backend has."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method != "ar" and drafter is None:
        raise ValueError(f"method {method!r} needs a drafter")
    for role, model, load in (("target", target, "dd.load_target(path)"),
                              ("drafter", None if method == "ar" else drafter, "dd.load_drafter(path, target)")):
        if (model is None and role == "target") or isinstance(model, (str, bytes, os.PathLike)):
            raise ValueError(f"{role} must be a loaded model ({load}), got {model!r}")
        if model is not None and getattr(model, "backend", None) not in ("numpy", "cuda"):
            raise ValueError(f"the {role} must declare backend 'numpy' or 'cuda' (model.protocols."
                             f"{role.capitalize()}), got {getattr(model, 'backend', None)!r}")
    cfg = target.config
    bound = None if method == "ar" else getattr(drafter, "target", None)
    if bound is not None and bound is not target and getattr(bound, "config", None) != cfg:
        raise ValueError("the drafter was loaded for another target (its target's config differs from this one's): "
                         "load it for this one, dd.load_drafter(path, target)")
    vocab = cfg.vocab_size
    prompt = check_prompt_ids(prompt_ids, vocab)
    if (isinstance(stop_token_ids, (str, bytes)) or not hasattr(stop_token_ids, "__iter__")
            or (isinstance(stop_token_ids, np.ndarray) and stop_token_ids.ndim != 1)):
        raise ValueError(f"stop_token_ids must be a sequence of token ids, got {stop_token_ids!r}")
    stops = frozenset(check_int("stop_token_ids entry", s, 0, vocab - 1) for s in stop_token_ids)
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 0)
    budget = check_int("budget", budget, 1)
    seed = check_int("seed", seed, 0, 2**64 - 1)
    temperature = check_temperature(temperature)
    p = prompt.shape[0]
    limit = cfg.max_position_embeddings
    if p + max_new_tokens > limit:
        what = f"prompt ({p}) + max_new_tokens ({max_new_tokens}) = {p + max_new_tokens} positions exceed"
        if not allow_long_context:
            raise ValueError(f"{what} the target's max_position_embeddings ({limit}); pass "
                             "allow_long_context=True (--allow-long-context) to run past what it was trained for")
        warnings.warn(f"{what} max_position_embeddings ({limit}): past what the target was trained for",
                      stacklevel=3)
    depths = 0 if method == "ar" else drafter.block_size - 1
    tree_rows = 1 + (depths if method == "dflash" else max(budget, depths) if method == "ddtree" else 0)
    if max_tokens is None:
        max_tokens = p + max_new_tokens + tree_rows
    max_tokens = check_int("max_tokens", max_tokens, 1)
    if p > max_tokens:
        raise ValueError(f"prompt of {p} tokens is longer than the cache ({max_tokens} rows)")
    if p + max_new_tokens > max_tokens:
        raise ValueError(f"prompt ({p}) + max_new_tokens ({max_new_tokens}) exceed the cache "
                         f"({max_tokens} rows)")
    # an estimate from below: the latent cache, the prefill's and one verify forward's largest buffers
    rows = min(tree_rows, max_tokens)
    need = (4 * cfg.num_hidden_layers * max_tokens * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)
            + _forward_bytes(cfg, p, max_tokens) + _forward_bytes(cfg, rows, max_tokens))
    have = _memory_bytes(target.backend)
    if have is not None and need > have:
        raise ValueError(f"a prompt of {p}, {max_tokens} cache rows and a verify forward of {rows} rows need at least "
                         f"{need / 2**30:.1f} GiB; the {target.backend} backend has {have / 2**30:.1f} GiB available "
                         "(lower max_new_tokens or budget)")
    return GenerateArgs(prompt, max_new_tokens, budget, temperature, seed, stops, max_tokens)


def check_prompt_ids(prompt_ids, vocab: int) -> np.ndarray:
    """A prompt's token ids as int32 [P], or a ``ValueError`` naming what is wrong: text, not 1-D,
    empty, not integers, an id outside [0, ``vocab``) (ids past int64 included)."""
    if isinstance(prompt_ids, (str, bytes)):
        raise ValueError(f"prompt_ids must be token ids (a 1-D sequence of ints), got {type(prompt_ids).__name__}; "
                         "the demo pair is byte-level: list(text.encode())")
    prompt = np.asarray(prompt_ids)
    if prompt.ndim != 1:
        raise ValueError(f"prompt_ids must be 1-D, got shape {prompt.shape}")
    if prompt.shape[0] == 0:
        raise ValueError("prompt_ids is empty: generation needs at least one prompt token")
    if prompt.dtype == object and all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
                                      for v in prompt):            # (ints past int64, or an object array)
        bad = next((int(v) for v in prompt if not 0 <= v < vocab), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is out of range [0, {vocab})")
        prompt = prompt.astype(np.int64)
    if not np.issubdtype(prompt.dtype, np.integer):
        raise ValueError(f"prompt_ids must hold integers, got the non-integer dtype {prompt.dtype}")
    if prompt.min() < 0 or prompt.max() >= vocab:
        bad = int(prompt[(prompt < 0) | (prompt >= vocab)][0])
        raise ValueError(f"prompt token id {bad} is out of range [0, {vocab})")
    return prompt.astype(np.int32)


GRAPH_MODES = (None, False, True, "stages")


def check_graph(graph):
    """``generate``'s ``graph``: one of ``GRAPH_MODES``, else a ``ValueError``."""
    if graph not in GRAPH_MODES:
        raise ValueError(f"graph must be None, False, True or 'stages', got {graph!r}")
    return graph
