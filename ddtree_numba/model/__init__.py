"""Target and drafter models: config, checkpoints, the numpy and cuda forwards, and the loader
that chooses between them (``loader``; ``protocols`` says what both backends implement)."""

from .cache import MLACache
from .checkpoint import load_weights
from .config import ModelConfig, RopeScaling
from .drafter import DrafterConfig, NumpyDrafter
from .loader import (BACKENDS, BackendChoice, BackendUnavailable, LoadedPair, PairLoadError, load_drafter,
                     load_pair, load_target, random_drafter, resolve_backend)
from .protocols import DeviceDrafter, DeviceTarget, Drafter, Target
from .target import ForwardOutput, NumpyTarget, random_target

__all__ = ["BACKENDS", "BackendChoice", "BackendUnavailable", "DeviceDrafter", "DeviceTarget", "Drafter",
           "DrafterConfig", "ForwardOutput", "LoadedPair", "MLACache", "ModelConfig", "NumpyDrafter",
           "NumpyTarget", "PairLoadError", "RopeScaling", "Target", "load_drafter", "load_pair", "load_target",
           "load_weights", "random_drafter", "random_target", "resolve_backend"]
