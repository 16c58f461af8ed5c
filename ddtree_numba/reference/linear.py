"""Dense projection, the matmul every other stage is built from.

Shapes: T tokens, I input features, O output features.
"""

from __future__ import annotations

import numpy as np


def linear(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """``y = x @ weight.T`` as ``torch.nn.Linear`` without bias.

    x [T, I] float32, weight [O, I] float32 (HF layout: out features first) -> y [T, O] float32.
    """
    return np.matmul(x, weight.T, dtype=np.float32)                  # [T, O]
