"""The decode loops: DDTree (docs/DESIGN.md §1), the DFlash chain, and plain
autoregressive, each on the host loop (``host``) or every round on the GPU (``device``); what they
share is in ``rounds``; ``generate`` picks the loop; ``generate_batch`` runs several prompts' rounds
together (``batch``)."""

from .batch import BatchResult, BatchRound, generate_batch
from .dispatch import device_loop_applies, generate
from .rounds import (GRAPH_MODES, LOOPS, METHODS, STAGE_CLOCKS, STAGES, GenerationResult, RoundTrace, check_graph,
                     check_prompt_ids, commit_tokens, round_seed)

__all__ = ["GRAPH_MODES", "LOOPS", "METHODS", "STAGES", "STAGE_CLOCKS", "BatchResult", "BatchRound", "GenerationResult",
           "RoundTrace", "check_graph", "check_prompt_ids", "commit_tokens", "device_loop_applies", "generate",
           "generate_batch", "round_seed"]
