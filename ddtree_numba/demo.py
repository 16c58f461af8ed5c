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
