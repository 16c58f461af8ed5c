"""What a target and a drafter are, as the decode loops use them (typing.Protocol).

Both backends implement ``Target`` and ``Drafter``: ``NumpyTarget`` / ``NumpyDrafter`` and
``CudaTarget`` / ``CudaDrafter``. A model declares where it runs with ``backend``; a ``"cuda"``
model also implements the device protocols (``DeviceTarget``, ``DeviceDrafter``), which the
GPU-resident decode loop is built from (``decode.generate`` dispatches on ``backend``, the
declared capability, never on which methods happen to exist). A test or research drafter may be
any object with these members. The protocols are runtime-checkable: ``isinstance(m, Target)``
checks that the members exist (not their signatures).

Shapes: T new tokens, V vocab, M hidden size, Y hidden layers requested (a drafter's
``target_layer_ids``), n context rows, L = block_size - 1 draft depths.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from .config import ModelConfig
from .target import ForwardOutput


@runtime_checkable
class Cache(Protocol):
    """A target's or drafter's cache: rows ``[0, length)`` are live."""

    length: int


@runtime_checkable
class TargetCache(Cache, Protocol):
    """A target's cache (``MLACache``, ``DeviceMLACache``): ``capacity`` rows, compacted after each
    verify."""

    capacity: int

    def compact(self, start: int, keep: np.ndarray) -> None:
        """Rows ``start + keep[i]`` move to ``start + i``; the cache ends after them (keep [n] int32)."""


@runtime_checkable
class Target(Protocol):
    backend: str                # "numpy" | "cuda" (then it is a DeviceTarget too)
    config: ModelConfig

    def new_cache(self, max_tokens: int) -> TargetCache:
        """An empty cache with room for ``max_tokens`` rows."""

    def forward(self, ids: np.ndarray, positions: np.ndarray, cache: TargetCache, parents: np.ndarray | None = None,
                hidden_layer_ids=()) -> ForwardOutput:
        """ids [T] at positions [T] after the cached rows (a tree when ``parents`` [T] is given):
        appends T rows to ``cache`` -> logits [T, V], hidden [T, Y, M] (numpy)."""


@runtime_checkable
class Drafter(Protocol):
    backend: str                # "numpy" | "cuda" (then it is a DeviceDrafter too)
    block_size: int             # B: the bonus token and L = B - 1 drafted positions
    target_layer_ids: tuple     # the target layers whose hidden states are its features

    def new_cache(self, max_tokens: int) -> Cache:
        """An empty context cache with room for ``max_tokens`` context rows."""

    def draft(self, features: np.ndarray, bonus: int, cache: Cache) -> np.ndarray:
        """features [n, Y, M] of the newly committed tokens (appended to ``cache``), bonus token
        -> logits [L, V] of the positions after the bonus (numpy)."""


@runtime_checkable
class DeviceCache(TargetCache, Protocol):
    """A target cache on the device (``DeviceMLACache``)."""

    capacity: int

    def enqueue_compact(self, start_n, keep, *, n_max: int, stream=0) -> None:
        """After a verify: rows ``start + keep[i]`` move to ``start + i`` for i < n, from device
        (start, n) = start_n[0:2] and keep (no sync); the caller updates ``length``."""


@runtime_checkable
class DeviceTarget(Target, Protocol):
    """A target whose forward can be enqueued on device buffers (``CudaTarget``; a ``CudaDrafter`` is
    bound to one and also reads its device embedding, lm_head and GEMM tile)."""

    def new_cache(self, max_tokens: int) -> DeviceCache:
        """An empty device cache with room for ``max_tokens`` rows."""

    def workspace(self, rows: int):
        """The preallocated device buffers of forwards of up to ``rows`` tokens: ``ids``,
        ``positions``, ``parents``, ``meta`` = (cache length, t) in; ``logits``, ``hidden`` out."""

    def forward_device(self, ws, cache: Cache, hidden_layer_ids=(), graph: bool = False, stream=0) -> None:
        """Enqueue one forward of ``ws``'s inputs (no sync, no allocation); the caller advances
        ``cache.length``."""


@runtime_checkable
class DeviceDrafter(Drafter, Protocol):
    """A drafter whose draft can be enqueued from device inputs (``CudaDrafter``). One that sets
    ``capturable = True`` promises that ``draft_device`` neither syncs nor allocates after its
    first call, so the device loop may capture a whole round as a CUDA graph."""

    def draft_device(self, features, n, bonus, cache: Cache, *, graph: bool = False, stream=0):
        """features [Nf, Y*M] f32, n [1] i32 (rows of features that are new), bonus [1] i32, all
        device -> device logits [L, V]; advances the cache on the device, no sync.

        Optional (the decode loops use it where present; ``CudaDrafter`` has it):
        ``prefill_device(features, n, cache, *, stream)``: the cache emptied, the rows [0, n)
        appended, n set to 0, all on the device, so that the rounds' drafts take a feature view
        of a round's rows only (``prefill_batch_device(features, n, bonus, pool, *, stream)``
        for ``draft_batch_device``). A drafter whose ``partial_depths`` is True takes
        ``depths=D`` here (and in ``draft_batch_device``) and returns only the first D rows'
        logits [D, V]; the loops ask for the depths a tree of their budget can reach,
        min(L, budget), and read only those rows of any drafter's logits."""
