"""Target (and later drafter) models: config, checkpoint loading, forward."""

from .config import ModelConfig, RopeScaling
from .cache import MLACache
from .checkpoint import load_weights
from .target import ForwardOutput, Target, load_target, random_target
