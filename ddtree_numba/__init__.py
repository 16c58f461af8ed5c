"""ddtree_numba: DDTree speculative decoding in numba.cuda, with a numpy twin for every kernel.

    import ddtree_numba as dd
    from ddtree_numba import reference as ref, kernels as kn

    target = dd.load_target(path, backend="numpy")       # or "cuda", or "auto"
    drafter = dd.load_drafter(drafter_path, target)
    res = dd.generate(target, drafter, prompt_ids, max_new_tokens, method="ddtree", budget=64)

docs/DESIGN.md describes the layers, the DDTree round and the numerics contracts; the README and
docs/ (MODEL.md, DECODE.md, PERFORMANCE.md, NOTES.md) say what exists and what was measured.
``kernels`` is imported on demand: it needs numba.cuda (a GPU, or NUMBA_ENABLE_CUDASIM=1).
"""

from . import reference
from .decode import GenerationResult, generate, generate_batch
from .demo import demo_pair
from .model import ModelConfig, load_drafter, load_target
from .tree import Tree

__version__ = "0.1.0"
__all__ = ["GenerationResult", "ModelConfig", "Tree", "demo_pair", "generate", "generate_batch", "load_drafter", "load_target",
           "reference", "__version__"]
