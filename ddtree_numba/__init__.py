"""ddtree_numba: DDTree speculative decoding in numba.cuda, with a numpy twin for every kernel.

    import ddtree_numba as dd
    from ddtree_numba import reference as ref, kernels as kn

See DESIGN.md (docs/DESIGN.md in the repository) for the round and the public API.
"""

from . import reference
from .tree import Tree

__version__ = "0.1.0"
__all__ = ["Tree", "reference", "__version__"]
from .model import ModelConfig, load_target
__all__ += ["ModelConfig", "load_target"]
from .model.drafter import load_drafter
from .decode import generate
__all__ += ["load_drafter", "generate"]
