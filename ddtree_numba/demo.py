"""The trained demo pair shipped as package data: a byte-level DeepSeek-V3-architecture target and
its DFlash drafter, made by ``tools/train_demo.py`` (whose model card, ``MODEL_CARD.md``, sits
beside the checkpoints).

    import ddtree_numba as dd
    target_dir, drafter_dir = dd.demo_pair()
    target = dd.load_target(target_dir)
    drafter = dd.load_drafter(drafter_dir, target)

Token ids 0-255 are bytes; ``demo_metadata()["specials"]`` names the ids above them and
``demo_metadata()["prompts"]`` holds prompts from modules held out of training.
"""

from __future__ import annotations

import codecs
import json
import os
import time
from dataclasses import dataclass

import numpy as np

from .decode import generate

DEMO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "demo")
TRAIN_COMMAND = "python tools/train_demo.py --device cuda"
_FILES = ("config.json", "model.safetensors")


def _missing(directory: str) -> list[str]:
    return [os.path.join(directory, sub, f) for sub in ("target", "drafter") for f in _FILES
            if not os.path.isfile(os.path.join(directory, sub, f))]


def demo_pair(directory: str | os.PathLike | None = None) -> tuple[str, str]:
    """(target checkpoint directory, drafter checkpoint directory) of the demo pair.

    ``directory`` defaults to the package's ``data/demo/``. Raises ``FileNotFoundError`` naming
    the training command when the checkpoints are not there.
    """
    directory = os.fspath(directory) if directory is not None else DEMO_DIR
    missing = _missing(directory)
    if missing:
        raise FileNotFoundError(
            f"the demo pair is not in {directory} (missing {', '.join(os.path.relpath(m, directory) for m in missing)}); "
            f"train it with `{TRAIN_COMMAND}` from a repository checkout (needs the 'train' extra: "
            f"torch, transformers>=5; a 13-minute budget on one H200), or pass `--smoke --device cpu "
            f"--out DIR` for a tiny pair in seconds")
    return os.path.join(directory, "target"), os.path.join(directory, "drafter")


def demo_metadata(directory: str | os.PathLike | None = None) -> dict:
    """``demo.json`` written beside the pair: data provenance, held-out modules, the demo prompts
    (``prompts[i]["ids"]``), training statistics and held-out metrics."""
    directory = os.fspath(directory) if directory is not None else DEMO_DIR
    demo_pair(directory)
    path = os.path.join(directory, "demo.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no demo.json in {directory}; retrain with `{TRAIN_COMMAND}`")
    with open(path) as f:
        return json.load(f)


SPECIAL_TEXT = {256: "<BOS>", 257: "<EOS>", 258: "<PAD>", 259: "<MASK>"}


class _ByteDecoder:
    """Byte-level ids to text in pieces: a UTF-8 character split between two pieces comes out
    whole in the later one; specials by name; undecodable bytes as ``\\xNN``."""

    def __init__(self):
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="backslashreplace")

    def __call__(self, ids, final: bool = False) -> str:
        out, run = [], bytearray()
        for t in (int(i) for i in ids):
            if t < 256:
                run.append(t)
                continue
            out.append(self._utf8.decode(bytes(run), final=True))
            run = bytearray()
            out.append(SPECIAL_TEXT.get(t, f"<{t}>"))
        out.append(self._utf8.decode(bytes(run), final=final))
        return "".join(out)


def byte_text(ids) -> str:
    """Byte-level token ids as text: ids 0-255 are UTF-8 bytes (undecodable ones shown as
    ``\\xNN``), the special ids above them by name."""
    return _ByteDecoder()(ids, final=True)


def accepted_spans(tokens, acceptance_lengths) -> list[tuple[int, int, bool]]:
    """Split generated tokens by where they came from: [(start, stop, drafted)].

    The generated tokens are b1 D1 b2 D2 ... bR DR b(R+1): round r verifies the tree rooted at
    its bonus token b_r (decided by the previous forward; b1 by the prefill) and accepts the
    drafted tokens D_r (acceptance_lengths[r] - 1 of them), and its forward decides the next
    bonus. ``drafted`` marks the D spans, the tokens the drafter got right; a stop token or
    ``max_new_tokens`` may cut the last span short. Empty spans are left out.
    """
    n = len(tokens)
    spans, i = [], 0
    for acc in acceptance_lengths:
        for length, drafted in ((1, False), (int(acc) - 1, True)):
            j = min(i + length, n)
            if j > i:
                spans.append((i, j, drafted))
            i = j
    if i < n:
        spans.append((i, n, False))
    return spans


def marked_text(tokens, acceptance_lengths, colour: bool) -> str:
    """The generated text with the drafted-and-accepted spans marked: a green background with
    ``colour`` (ANSI), else between ``\u00ab`` and ``\u00bb``."""
    parts, decode = [], _ByteDecoder()
    spans = accepted_spans(tokens, acceptance_lengths)
    for k, (i, j, drafted) in enumerate(spans):
        text = decode(tokens[i:j], final=k == len(spans) - 1)
        if drafted and text:
            text = f"\x1b[30;42m{text}\x1b[0m" if colour else f"\u00ab{text}\u00bb"
        parts.append(text)
    return "".join(parts)


# -- the demo run (``ddtree-numba demo``) ------------------------------------------------------------

DEMO_METHODS = ("ddtree", "ar")


def demo_budget(meta: dict, backend: str) -> int:
    """The ddtree budget the demo runs at on ``backend``: the one ``demo.json`` records for it (the
    most tokens/s on the GPU), else its default (64)."""
    acc = meta.get("acceptance", {})
    return int(acc.get(f"demo_budget_{backend}", acc.get("demo_budget", 64)))


@dataclass(frozen=True)
class PromptRun:
    """One demo prompt decoded both ways: ``ids`` [P] the prompt, ``results`` by method."""

    index: int
    module: str | None
    ids: np.ndarray
    results: dict

    @property
    def same_tokens(self) -> bool:
        """Greedy ddtree gave exactly greedy ar's tokens (it must: docs/DESIGN.md §4)."""
        return bool(np.array_equal(self.results["ddtree"].tokens, self.results["ar"].tokens))


@dataclass
class MethodTotals:
    """One method's sums over the demo prompts."""

    tokens: int = 0
    forwards: int = 0
    rounds: int = 0
    accepted: int = 0
    seconds: float = 0.0

    def add(self, res) -> None:
        self.tokens += int(res.tokens.shape[0])
        self.forwards += res.target_forwards
        self.rounds += int(res.acceptance_lengths.shape[0])
        self.accepted += int(res.acceptance_lengths.sum())
        self.seconds += res.elapsed_s

    @property
    def mean_acceptance(self) -> float:
        return self.accepted / max(self.rounds, 1)


def warm_up(target, drafter, ids, budget: int) -> float:
    """Decode a few tokens with every method the demo times, so kernel compilation stays out of
    the timed runs (it matters on cuda; a bar counts the kernels that compile, if any are not in
    the on-disk cache yet); returns the seconds it took."""
    from ._device import compile_progress
    t0 = time.perf_counter()
    with compile_progress("compiling GPU kernels (once: they are cached on disk)"):
        generate(target, drafter, np.asarray(ids, np.int32), 8, method="ddtree", budget=budget)
        generate(target, None, np.asarray(ids, np.int32), 8, method="ar")
    return time.perf_counter() - t0


def run_demo_prompts(target, drafter, prompts, max_new_tokens: int, budget: int, on_run=None):
    """Yield a ``PromptRun`` per prompt (dicts with ``ids`` and ``module``, as ``demo_metadata()``
    holds them): greedy ddtree at ``budget`` and greedy ar. ``on_run()`` is called after each
    method's run (a progress bar's hook). On the numpy backend BLAS runs one thread: the demo's
    matrices are small, and a second thread on a shared core made it ten times slower (measured:
    7 s against 68 s on 2 cores with another process busy)."""
    from threadpoolctl import threadpool_limits
    for k, p in enumerate(prompts):
        ids = np.asarray(p["ids"], np.int32)
        results = {}
        for method in DEMO_METHODS:
            with threadpool_limits(1 if target.backend == "numpy" else None, user_api="blas"):
                results[method] = generate(target, drafter if method == "ddtree" else None, ids, max_new_tokens,
                                           method=method, budget=budget)
            if on_run is not None:
                on_run()
        yield PromptRun(k, p.get("module"), ids, results)


# -- one synthetic round (``ddtree-numba round``) --------------------------------------------------

def synthetic_drafter_logits(rng, depths: int, vocab: int) -> np.ndarray:
    """[L, V] float32 logits that look like a confident drafter: one favourite, a few runner-ups."""
    logits = rng.standard_normal((depths, vocab)).astype(np.float32)
    for d in range(depths):
        top = rng.choice(vocab, 4, replace=False)
        logits[d, top] += np.array([7.0, 5.5, 5.0, 3.0], np.float32) * (1.0 - 0.05 * d)
    return logits


@dataclass(frozen=True, eq=False)
class SyntheticRound:
    """One DDTree round's tree stages on synthetic drafter logits, and whether the backend that ran
    them matched the numpy twins. Shapes: L depths, K ranks, N tree nodes, n accepted, W = 4."""

    backend: str
    lp: np.ndarray          # [L, K] top-K log-probs
    ids: np.ndarray         # [L, K] their token ids
    tree: object            # Tree with N nodes
    vis: np.ndarray         # [N+1, N+1] visibility
    post: np.ndarray        # [N+1] the target's token at every node
    keep: np.ndarray        # [n] accepted node ids
    bonus: int              # the next bonus token
    start: int              # cache rows before the tree
    rows: np.ndarray        # [start + N + 1, W] a toy cache after compaction (row s held s before)
    seconds: float
    matches_twins: bool


def synthetic_round(backend: str, depths: int, vocab: int, budget: int, seed: int) -> SyntheticRound:
    """Top-K, best-first build, visibility, a target that agrees with the drafter for a while,
    acceptance and cache compaction, on ``backend``'s stage functions ('numpy': the twins; 'cuda':
    the kernels), held to the numpy twins. 1 <= depths <= 32, 4 <= vocab <= 2**20 (the synthetic
    drafter has a favourite and three runner-ups), 1 <= budget <= 1024 (the kernels' limits, and
    a build the CPU finishes in seconds)."""
    from . import reference as ref
    from ._checks import check_int
    check_int("depths", depths, 1, 32)
    check_int("vocab", vocab, 4, 2**20)
    check_int("budget", budget, 1, 1024)
    check_int("seed", seed, 0, 2**32 - 1)
    stages = ref
    if backend == "cuda":
        from . import kernels as stages
    rng = np.random.default_rng(seed)
    logits = synthetic_drafter_logits(rng, depths, vocab)                    # [L, V]
    t0 = time.perf_counter()
    lp, ids = stages.topk_logprobs(logits, min(budget, vocab))               # [L, K]
    tree = stages.build_tree(lp, ids, budget)
    vis = stages.visibility(tree.parents)                                    # [N+1, N+1]
    # a target that takes the drafter's path through rank 0, then rank 1, then disagrees
    post = rng.integers(0, vocab, tree.num_nodes + 1).astype(np.int32)       # [N+1]
    node = 0
    for want_rank in [0, 1, 0, 0]:
        kids = [j for j in range(1, tree.num_nodes + 1)
                if tree.parents[j] == node and tree.ranks[j - 1] == want_rank]
        if not kids:
            break
        post[node] = tree.tokens[kids[0] - 1]
        node = kids[0]
    keep, bonus = stages.follow_tree(tree, post)
    start = 10
    rows = np.arange(start + tree.num_nodes + 1, dtype=np.float32)[:, None].repeat(4, 1)  # [S, W]
    stages.compact_rows(rows, start, keep)
    seconds = time.perf_counter() - t0
    ok = (ref.build_tree(*ref.topk_logprobs(logits, min(budget, vocab)), budget) == tree
          and ref.follow_tree(tree, post)[0].tolist() == keep.tolist())
    return SyntheticRound(backend, lp, ids, tree, vis, post, keep, bonus, start, rows, seconds, ok)
