"""``generate``: check the arguments, pick the loop the models declare they can run, run it."""

from __future__ import annotations

from contextlib import contextmanager

from .._checks import check_flag
from ..model.protocols import Drafter, Target
from .host import generate_host
from .rounds import GenerationResult, check_generate_inputs, check_graph


def device_loop_applies(target: Target, drafter: Drafter | None, method: str) -> bool:
    """The GPU-resident loop runs a target that declares ``backend == "cuda"`` (a ``DeviceTarget``)
    with a drafter that declares the same (a ``DeviceDrafter``), or none for ``ar``."""
    return target.backend == "cuda" and (method == "ar" or drafter.backend == "cuda")


def generate(target: Target, drafter: Drafter | None, prompt_ids, max_new_tokens: int, method: str = "ddtree",
             budget: int = 64, temperature: float = 0.0, seed: int = 0, stop_token_ids=(),
             max_tokens: int | None = None, trace: bool = False, progress=None,
             graph: bool | None = None, allow_long_context: bool = False) -> GenerationResult:
    """Generate up to ``max_new_tokens`` after ``prompt_ids`` with ``method``.

    ``ddtree``: docs/DESIGN.md §1's round with a tree of ``budget`` nodes (>= 1); ``dflash``: the
    drafter's argmax chain; ``ar``: one token per target forward (``drafter`` may be None). At
    ``temperature`` 0 all three give the same tokens; above it every node is sampled from the
    target with a seeded generator (``round_seed``), which keeps the target's distribution exact.
    Generation ends after exactly ``max_new_tokens`` tokens or at the first of
    ``stop_token_ids`` (token ids of the target's vocabulary; the stop token is kept, as
    autoregressive decoding would emit it). ``max_tokens``: cache rows (default: enough for the
    prompt, the new tokens and one tree); a prompt that does not fit raises ``ValueError``, and so
    does a prompt + ``max_new_tokens`` past the target's ``max_position_embeddings`` unless
    ``allow_long_context`` (then a warning). ``progress``: True for a tqdm bar, or a callable,
    called as ``progress(len(tokens so far))`` after each round and when the last token is out.

    Which loop runs (``GenerationResult.loop``): with a cuda target and a cuda drafter (or none,
    for ``ar``) every round stays on the GPU (``decode.device``): the host reads back only the
    accepted tokens and ``stage_times`` are CUDA-event times. There ``graph`` (None: whenever it
    can, i.e. on a real GPU with a ``CudaDrafter`` or none) replays each round as one CUDA graph,
    captured after the first round of a configuration and kept for later calls
    (``decode.device.DeviceRound``); ``graph=False`` launches every stage eagerly and times each
    one; ``graph="stages"`` replays each stage as its own graph, with CUDA events between them (the
    stages timed apart at a few µs a stage above one graph a round: ``tools/profile_round.py``,
    ``ddtree-numba sweep --stage-graphs``). Otherwise, and for ``trace=True`` (host trees per
    round), the host loop (``decode.host``) calls each stage.
    """
    check_graph(graph)
    check_flag("trace", trace)
    check_flag("allow_long_context", allow_long_context)
    a = check_generate_inputs(target, drafter, prompt_ids, max_new_tokens, method, budget, temperature, seed,
                              max_tokens, stop_token_ids, allow_long_context)
    with _progress_hook(progress, a.n_new, method) as hook:
        kw = dict(prompt=a.prompt, n_new=a.n_new, method=method, budget=a.budget, temperature=a.temperature,
                  seed=a.seed, stops=a.stops, max_tokens=a.max_tokens, progress=hook)
        device = not trace and device_loop_applies(target, drafter, method)
        if graph in (True, "stages") and not device:
            raise ValueError(f"graph={graph!r} is for the GPU-resident loop: a cuda target with a cuda drafter (or none, "
                             "for ar) and trace=False; this call runs the host loop")
        if a.n_new > 0 and device:
            from .device import generate_device          # numba.cuda only where a device loop runs
            return generate_device(target, drafter, graph=graph, **kw)
        return generate_host(target, drafter, trace=trace, **kw)


@contextmanager
def _progress_hook(progress, total: int, method: str):
    """``progress`` as the loops call it: None / False -> none; True -> a tqdm bar over the new
    tokens (closed at the end); a callable -> itself. Anything else is a ``ValueError``. With a
    bar or a callable, a second bar shows while GPU kernels compile (only those not yet in the
    on-disk cache: ``_device.compile_progress``)."""
    if progress is None or progress is False:
        yield None
        return
    if progress is not True and not callable(progress):
        raise ValueError(f"progress must be True, False, None or a callable, got {progress!r}")
    from .._device import compile_progress
    with compile_progress():
        if progress is True:
            from tqdm.auto import tqdm
            with tqdm(total=total, unit="tok", desc=method, leave=False) as bar:
                yield lambda n: bar.update(n - bar.n)
        else:
            yield progress
