"""The MLA latent cache: per layer, one compressed row per token and nothing per head.

Shapes: L layers, S capacity (rows), C ``kv_lora_rank``, R ``qk_rope_head_dim``.
"""

from __future__ import annotations

import numpy as np

from .._checks import check_int
from ..reference.compact import compact_rows
from .config import ModelConfig


class MLACache:
    """Preallocated latent rows for ``capacity`` tokens; rows ``[0, length)`` are live.

    ``c_kv[l, s]`` is layer l's RMS-normed latent of token s, ``k_pe[l, s]`` its rotated rope
    key, exactly what the absorbed attention reads.
    """

    def __init__(self, cfg: ModelConfig, capacity: int):
        capacity = check_int("max_tokens", capacity, 1)
        layers = cfg.num_hidden_layers
        self.capacity = capacity
        self.length = 0
        self.c_kv = np.zeros((layers, capacity, cfg.kv_lora_rank), dtype=np.float32)   # [L, S, C]
        self.k_pe = np.zeros((layers, capacity, cfg.qk_rope_head_dim), dtype=np.float32)  # [L, S, R]

    def __len__(self) -> int:
        return self.length

    @property
    def free(self) -> int:
        return self.capacity - self.length

    def reserve(self, n: int) -> int:
        """Check that n more rows fit; returns the first new row. Does not change ``length``."""
        if n > self.free:
            raise ValueError(
                f"cache overflow: {self.length} rows + {n} new exceeds capacity {self.capacity}"
            )
        return self.length

    def truncate(self, length: int) -> None:
        """Forget every row from ``length`` on (e.g. to roll back a verify forward)."""
        self.length = check_int("length", length, 0, self.length)

    def compact(self, start: int, keep: np.ndarray) -> None:
        """After a tree verify: rows ``start + keep[i]`` move to ``start + i`` in every layer
        (docs/DESIGN.md §1, step 7) and the cache ends after the kept rows."""
        start = check_int("start", start, 0, self.length)
        keep = np.asarray(keep)
        if keep.dtype != np.int32:
            raise ValueError(f"keep must have dtype int32, got {keep.dtype}")
        for layer in range(self.c_kv.shape[0]):
            compact_rows(self.c_kv[layer, : self.length], start, keep)
            compact_rows(self.k_pe[layer, : self.length], start, keep)
        self.length = start + keep.shape[0]

    def reset(self) -> None:
        self.length = 0
