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
