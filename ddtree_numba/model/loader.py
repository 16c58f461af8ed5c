"""Loading models, and the one place a backend is chosen.

``resolve_backend`` decides which backend runs; ``load_target`` reads an HF-format checkpoint onto
it; ``load_drafter`` and ``random_drafter`` put a drafter on its target's backend; ``load_pair``
loads the two together the way the command line does, saying which of them a bad checkpoint was.

Backends (``BACKENDS``): ``numpy`` runs the reference forward (``NumpyTarget`` / ``NumpyDrafter``);
``cuda`` runs every stage as a numba.cuda kernel (``CudaTarget`` / ``CudaDrafter``, also inside
numba's CUDA simulator), with the same ``forward`` and the same tokens; ``auto`` resolves to one of
them and says why. Both backends implement ``model.protocols.Target`` / ``Drafter``; the cuda ones
also ``DeviceTarget`` / ``DeviceDrafter``, which the GPU-resident decode loop needs. The cuda model
modules are imported only when the cuda backend runs (``numpy`` never imports numba.cuda; ``auto``
and ``cuda`` ask numba.cuda whether there is a GPU).
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass

import numpy as np

from ..dtypes import (FLOAT8, QUANTIZED, BlockScaled, Int4Grouped, check_weight_dtype, fp8_block_supported,
                      lossless_weight_dtype, widened)
from .checkpoint import SafetensorsIndex, first_and_more, matrix_dtypes, read_checkpoint, unread_tensors
from .config import read_config_json
from .drafter import DrafterConfig, NumpyDrafter, drafter_shapes
from .target import NumpyTarget

BACKENDS = ("auto", "numpy", "cuda")


class BackendUnavailable(NotImplementedError, ValueError):
    """A backend this machine cannot run: backend='cuda' with no CUDA GPU (and no simulator)."""


@dataclass(frozen=True)
class BackendChoice:
    """What ``resolve_backend`` decided: ``backend`` 'numpy' or 'cuda', and why, in words."""

    backend: str
    reason: str


def _gpu_present() -> bool:
    from numba import cuda
    return cuda.is_available()


def _simulator() -> bool:
    from numba import config as numba_config
    return bool(numba_config.ENABLE_CUDASIM)


def resolve_backend(backend: str = "auto") -> BackendChoice:
    """The backend to run: ``numpy`` and ``cuda`` as asked (``cuda`` raises ``BackendUnavailable``
    with no GPU and no simulator); ``auto`` is ``cuda`` on a real GPU and ``numpy`` otherwise,
    including under the CUDA simulator (it is for tests; the numpy twins give the same answers,
    faster)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "numpy":
        return BackendChoice("numpy", "requested")
    if backend == "cuda":
        if not (_simulator() or _gpu_present()):
            raise BackendUnavailable("backend='cuda' needs a CUDA GPU and none was found; use backend='numpy' "
                                     "(--backend numpy) or 'auto'")
        return BackendChoice("cuda", "requested, in the CUDA simulator" if _simulator() else "requested")
    if _simulator():
        return BackendChoice("numpy", "the CUDA simulator is on, and it is for tests")
    if not _gpu_present():
        return BackendChoice("numpy", "no CUDA GPU found")
    return BackendChoice("cuda", "a CUDA GPU is present")


def device_name(backend: str) -> str:
    """The device a backend runs on, for tables and figures: the GPU's name, or the CPU's."""
    if backend == "cuda":
        if _simulator():
            return "CUDA simulator"
        try:
            from numba import cuda
            name = cuda.get_current_device().name
            return name.decode() if isinstance(name, bytes) else str(name)
        except Exception:                                      # noqa: BLE001 (a label only)
            return "cuda"
    return f"cpu ({platform.machine()})"


def int4_supported(w: Int4Grouped) -> bool:
    """Whether the GPU GEMMs take an int4 matrix as packed: groups a multiple of 16 inputs (the
    tensor-core k step) and whole words a row (inputs a multiple of 8)."""
    return fp8_block_supported(w.block) and w.in_features % 8 == 0


def load_target(path: str | os.PathLike, backend: str = "numpy", progress: bool | None = None,
                weight_dtype: str | None = None, precision: str | None = None, gemm_tile=None):
    """Load an HF-format DeepSeek-V3 / V2 / Kimi-K2 checkpoint directory (config.json + safetensors).

    backend 'numpy' (a ``NumpyTarget``), 'cuda' (a ``CudaTarget``) or 'auto' (``resolve_backend``).
    ``weight_dtype`` (cuda only): how matrices are stored on the GPU, 'float32', 'float16' or
    'bfloat16' (quantized ones dequantized into it), or 'float8': an fp8 checkpoint's block-scaled
    matrices kept as stored, a byte a weight (``dtypes.BlockScaled``). None keeps what the
    checkpoint stores: fp8 and int4 (compressed-tensors, ``dtypes.Int4Grouped``) matrices as stored,
    the others in their own dtype when every one has it (bf16 or fp16) and float32 otherwise, so
    nothing is rounded. ``precision`` (cuda only): the
    tensor-core GEMMs' arithmetic, 'bf16' (the default: activations rounded to bf16 at each GEMM
    input, as bf16 inference does) or 'fp32' (faithful to float32; what the HF-golden tests use);
    numpy always runs float32. ``gemm_tile`` (cuda only): force one GEMM tile (``CudaTarget``);
    the bits do not depend on it.
    """
    chosen = resolve_backend(backend).backend
    if weight_dtype is not None and chosen != "cuda":
        raise ValueError("weight_dtype applies to backend='cuda' only (numpy runs in float32)")
    if gemm_tile is not None and chosen != "cuda":
        raise ValueError("gemm_tile applies to backend='cuda' only")
    if precision is not None and chosen != "cuda":
        raise ValueError("precision applies to backend='cuda' only (numpy runs in float32)")
    keep_fp8 = weight_dtype in (None, FLOAT8)
    if not keep_fp8:
        check_weight_dtype(weight_dtype)
    cfg, weights, index = read_checkpoint(path, progress=progress, keep_fp8=chosen == "cuda" and keep_fp8)
    if chosen == "numpy":
        return NumpyTarget(cfg, weights)
    from .cuda_target import CudaTarget
    fp8 = [n for n, w in weights.items() if isinstance(w, BlockScaled)]
    if weight_dtype == FLOAT8 and not fp8:
        raise ValueError(f"weight_dtype 'float8' keeps an fp8 checkpoint's matrices as stored, but {path} stores "
                         "none in fp8")
    if fp8 and not fp8_block_supported(cfg.weight_block_size):
        if weight_dtype == FLOAT8:
            raise ValueError(f"weight_dtype 'float8': the GPU GEMMs take fp8 blocks whose input side is a multiple "
                             f"of 16, got weight_block_size {list(cfg.weight_block_size)}")
        weights = {n: widened(w) if isinstance(w, BlockScaled) else w for n, w in weights.items()}
    # int4 (compressed-tensors) stays packed when the GEMMs take its groups and rows, else float32
    weights = {n: widened(w) if isinstance(w, Int4Grouped) and not int4_supported(w) else w
               for n, w in weights.items()}
    kept = [n for n, w in weights.items() if isinstance(w, QUANTIZED)]
    if weight_dtype in (None, FLOAT8):
        # what is not quantized is kept exactly; the MoE router's gate is float32 whatever it is stored
        # as; int4 dequantized above (not in the index under its own name) needs float32
        plain = [n for n in weights if n not in kept and not n.endswith("mlp.gate.weight")]
        weight_dtype = ("float32" if any(n not in index for n in plain)
                        else lossless_weight_dtype(matrix_dtypes(index, plain)))
    return CudaTarget.from_weights(cfg, weights, weight_dtype, precision=precision or "bf16", gemm_tile=gemm_tile)


def _drafter_on(target, cfg: DrafterConfig, weights: dict, weight_dtype: str = "float32"):
    """The drafter class of the target's backend, built from float32 ``weights``."""
    if target.backend == "cuda":
        from .cuda_drafter import CudaDrafter
        return CudaDrafter(cfg, weights, target, weight_dtype=weight_dtype)
    if target.backend == "numpy":
        return NumpyDrafter(cfg, weights, target)
    raise ValueError(f"the drafter runs on the numpy or cuda backend; the target's is {target.backend!r}")


def load_drafter(path: str | os.PathLike, target):
    """Load a DFlash drafter directory (config.json + safetensors) for ``target``, on its backend.

    Tensor names as published (``layers.{i}.self_attn.q_proj.weight``, ``fc.weight``, ...); a
    ``model.`` prefix is accepted too. A numpy target gets a ``NumpyDrafter``, a cuda one a
    ``CudaDrafter``, whose matrices keep the checkpoint's dtype when every matrix is bf16 (or every
    one fp16) and are float32 otherwise (``dtypes.lossless_weight_dtype``, the target's rule).
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise ValueError(f"drafter path {path} is not a directory")
    if getattr(target, "backend", None) not in ("numpy", "cuda"):
        raise ValueError(f"the drafter runs on the numpy or cuda backend; the target's is "
                         f"{getattr(target, 'backend', None)!r}")
    cfg = DrafterConfig.from_dict(read_config_json(os.path.join(path, "config.json")))
    index = SafetensorsIndex(path)
    keys = {}                                                      # config name -> checkpoint name
    for name in drafter_shapes(cfg):
        keys[name] = name if name in index else "model." + name
        if keys[name] not in index:
            raise ValueError(f"drafter checkpoint is missing tensor {name}")
    extra = unread_tensors(index, keys.values())
    if extra:
        raise ValueError(f"drafter checkpoint holds tensor {first_and_more(extra)}, which its config does not read: "
                         f"config.json and the weights disagree (num_hidden_layers={cfg.num_hidden_layers})")
    weights = {name: index.float32(key, (128, 128)) for name, key in keys.items()}
    stored = matrix_dtypes(index, keys.values())
    return _drafter_on(target, cfg, weights, lossless_weight_dtype(stored))


def random_drafter(target, num_hidden_layers: int = 1, block_size: int = 8,
                   target_layer_ids: tuple[int, ...] | None = None, num_attention_heads: int = 4,
                   num_key_value_heads: int = 2, head_dim: int = 8, intermediate_size: int = 48,
                   mask_token_id: int | None = None, seed: int = 0, weight_dtype: str = "float32"):
    """A drafter with random weights for ``target`` on its backend (tests, notebooks, benchmarks).
    Unit-gain projections and norm weights in [0.5, 1.5]; by default it reads the target's first
    and last layers and uses the last token id as MASK. A cuda target's drafter stores its
    matrices as ``weight_dtype`` ('float32', or 'bfloat16' as a bf16 checkpoint's)."""
    tc = target.config
    if target_layer_ids is None:
        target_layer_ids = tuple(sorted({0, tc.num_hidden_layers - 1}))
    cfg = DrafterConfig(
        hidden_size=tc.hidden_size, num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
        head_dim=head_dim, intermediate_size=intermediate_size, rms_norm_eps=1e-6,
        rope_theta=10000.0, block_size=block_size, target_layer_ids=tuple(target_layer_ids),
        mask_token_id=tc.vocab_size - 1 if mask_token_id is None else mask_token_id)
    cfg.validate()
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in drafter_shapes(cfg).items():
        if len(shape) == 1:
            weights[name] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        else:
            weights[name] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
    return _drafter_on(target, cfg, weights, weight_dtype)


class PairLoadError(ValueError):
    """``load_pair`` could not load one of the two checkpoints: ``role`` is 'target' or 'drafter',
    ``path`` its directory; the message is the loader's."""

    def __init__(self, role: str, path, error: Exception):
        super().__init__(str(error))
        self.role, self.path = role, os.fspath(path)


@dataclass(frozen=True)
class LoadedPair:
    """A target and its drafter (None for ``ar``) on one backend, why that backend
    (``resolve_backend``), and the seconds each took to load."""

    target: object
    drafter: object
    backend: str
    reason: str
    target_s: float
    drafter_s: float

    @property
    def device(self) -> str:
        return device_name(self.backend)


def load_pair(target_path, drafter_path=None, backend: str = "auto", progress: bool | None = None,
              precision: str | None = None) -> LoadedPair:
    """Load a target (and, unless ``drafter_path`` is None, its DFlash drafter) on ``backend``
    (``resolve_backend``: ``BackendUnavailable`` for a cuda that is not there). ``precision``:
    the cuda target's GEMMs (``load_target``). A bad checkpoint raises ``PairLoadError`` naming
    which of the two it was."""
    choice = resolve_backend(backend)
    t0 = time.perf_counter()
    try:
        target = load_target(target_path, backend=choice.backend, progress=progress, precision=precision)
    except BackendUnavailable:
        raise
    except (ValueError, OSError) as e:
        raise PairLoadError("target", target_path, e) from e
    t1 = time.perf_counter()
    drafter = None
    if drafter_path is not None:
        try:
            drafter = load_drafter(drafter_path, target)
        except (ValueError, OSError) as e:   # a bad checkpoint, or one that does not fit the target
            raise PairLoadError("drafter", drafter_path, e) from e
    return LoadedPair(target, drafter, choice.backend, choice.reason, t1 - t0, time.perf_counter() - t1)
