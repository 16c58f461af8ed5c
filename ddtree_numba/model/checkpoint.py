"""Reading HF safetensors checkpoints into float32 numpy arrays, by their on-disk names.

A safetensors file is an 8-byte little-endian header length, a JSON header mapping each tensor
name to ``{dtype, shape, data_offsets}``, then the raw bytes. The header is parsed here and each
tensor read with ``numpy.memmap``, because numpy has no bfloat16 or float8 dtype: bf16 words are
widened to float32 (the bf16 bits are the top half of a float32), and float8 e4m3 weights are
decoded through a 256-entry table and multiplied by their ``weight_scale_inv`` block scales
(DeepSeek-V3 / Kimi-K2 ship 128 x 128 blocks). See docs/MODEL.md.
"""

from __future__ import annotations

import json
import math
import os
import struct

import numpy as np

from ..dtypes import BlockScaled, Int4Grouped, bf16_to_float32
from .config import ModelConfig

_PLAIN = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64,
          "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
_RAW = {"BF16": np.uint16, "F8_E4M3": np.uint8}
INT4_PARTS = (".weight_packed", ".weight_scale", ".weight_shape")   # a compressed-tensors INT4 Linear
_FLOATS = ("F32", "F16", "F64", "BF16", "F8_E4M3")
# bytes per element of every safetensors dtype (the header's sizes are checked against them)
_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
             "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
HEADER_MAX = 100_000_000     # the safetensors library's own limit on the header's length


def dequant_fp8_block(raw: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """``w[i, j] = e4m3(raw[i, j]) * scale_inv[i // bo, j // bi]`` for block (bo, bi).

    raw [O, I] uint8, scale_inv [ceil(O / bo), ceil(I / bi)] float32 -> [O, I] float32. The
    last block row / column may be ragged.
    """
    return BlockScaled(raw, np.asarray(scale_inv, np.float32), block).dequantize()


def read_header(path: str) -> tuple[dict, int]:
    """(header dict without ``__metadata__``, byte offset where the data starts), after checking
    everything the safetensors library checks: a JSON object of at most HEADER_MAX bytes, every
    tensor's dtype known, its shape a list of non-negative integers, its byte count
    dtype x shape, and the tensors' byte ranges tiling the data section exactly (no gap, no
    overlap, nothing past the end of the file, nothing after the last tensor)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path} is not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", head)
        size = os.path.getsize(path)
        if n > HEADER_MAX or n > size - 8:
            raise ValueError(f"{path} is not a safetensors file (header length {n} with {size} bytes in the file)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path} has a corrupt safetensors header: {err}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the safetensors header is not a JSON object")
    meta = header.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise ValueError(f"{path}: __metadata__ must map names to strings")
    spans = []
    for name, entry in header.items():
        where = f"{path}: tensor {name}"
        if not (isinstance(entry, dict) and {"dtype", "shape", "data_offsets"} <= set(entry)):
            raise ValueError(f"{where}: a header entry needs dtype, shape and data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in _ITEMSIZE:
            raise ValueError(f"{where}: unknown dtype {dtype!r}")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise ValueError(f"{where}: shape {shape!r} is not a list of non-negative integers")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            raise ValueError(f"{where}: data_offsets {offsets!r} is not [begin, end] with 0 <= begin <= end")
        want = math.prod(shape) * _ITEMSIZE[dtype]
        if offsets[1] - offsets[0] != want:
            raise ValueError(f"{where}: {offsets[1] - offsets[0]} bytes do not hold {dtype} {shape} ({want} bytes)")
        spans.append((offsets[0], offsets[1], name))
    end = 0
    for begin, stop, name in sorted(spans):
        if begin != end:
            what = "overlaps the tensor before it" if begin < end else f"leaves a gap of {begin - end} bytes"
            raise ValueError(f"{path}: tensor {name} starts at byte {begin} of the data and {what}")
        end = stop
    data = size - 8 - n
    if end != data:
        raise ValueError(f"{path}: the tensors end at byte {end} of the data section, which holds {data} bytes"
                         + (" (the file is truncated)" if end > data else ""))
    return header, 8 + n


class SafetensorsIndex:
    """Where each tensor lives, over one file or the shards listed in
    ``model.safetensors.index.json``; reads one tensor at a time."""

    def __init__(self, directory: str):
        self.directory = directory
        index = os.path.join(directory, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                weight_map = json.load(f).get("weight_map", {})
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(n for n in os.listdir(directory) if n.endswith(".safetensors"))
        if not files:
            raise ValueError(f"no .safetensors files in {directory}")
        self.entries: dict[str, tuple[str, dict, int]] = {}
        for name in files:
            path = os.path.join(directory, name)
            if not os.path.exists(path):
                raise ValueError(f"shard {name} listed in model.safetensors.index.json is missing")
            header, offset = read_header(path)
            for tensor, entry in header.items():
                if tensor in self.entries:
                    raise ValueError(f"tensor {tensor} is stored twice: in {os.path.basename(self.entries[tensor][0])} "
                                     f"and in {name}")
                self.entries[tensor] = (path, entry, offset)

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def nbytes(self, name: str) -> int:
        start, end = self.entries[name][1]["data_offsets"]
        return end - start

    def raw(self, name: str) -> tuple[np.ndarray, str]:
        """The stored array (bf16 as uint16, fp8 as uint8) and its safetensors dtype string."""
        if name not in self.entries:
            raise ValueError(f"checkpoint is missing tensor {name}")
        path, entry, offset = self.entries[name]
        dtype = entry["dtype"]
        np_dtype = _PLAIN.get(dtype) or _RAW.get(dtype)
        if np_dtype is None:
            raise ValueError(f"tensor {name} has dtype {dtype}, which this loader cannot read")
        shape = tuple(entry["shape"])
        start = entry["data_offsets"][0]
        count = math.prod(shape)                  # read_header checked the byte count against it
        if count == 0:
            return np.zeros(shape, dtype=np_dtype), dtype
        mm = np.memmap(path, dtype=np_dtype, mode="r", offset=offset + start, shape=(count,))
        return np.array(mm).reshape(shape), dtype

    def float32(self, name: str, block: tuple[int, int]) -> np.ndarray:
        """The tensor as float32: f16 / bf16 widened, fp8 dequantized with ``name + '_scale_inv'``;
        a ``ValueError`` naming it if it holds NaN or infinity (a bad router bias changes which
        experts run without making the logits non-finite, so every weight is checked)."""
        return self.weight(name, block, keep_fp8=False)

    def weight(self, name: str, block: tuple[int, int], keep_fp8: bool) -> np.ndarray | BlockScaled:
        """``float32``, except that with ``keep_fp8`` an fp8 tensor comes back as stored, a
        ``BlockScaled`` (raw bytes + float32 block scales), after the same checks."""
        raw, dtype = self.raw(name)
        if dtype not in _FLOATS:
            raise ValueError(f"tensor {name} has dtype {dtype}; weights must be floating point")
        if dtype == "F8_E4M3":
            w = self._fp8(name, raw, block)
            if keep_fp8:
                return w
            w = w.dequantize()
        elif dtype == "BF16":
            w = bf16_to_float32(raw)
        else:
            w = raw.astype(np.float32, copy=False)
        _check_finite(name, w)
        return w

    def int4(self, module: str, shape: tuple[int, int], group: int, keep: bool) -> np.ndarray | Int4Grouped:
        """An INT4 Linear (``module`` + ``.weight_packed`` / ``.weight_scale`` / ``.weight_shape``) as
        an ``Int4Grouped`` (``keep``: bf16 scales stay bf16 bits) or dequantized float32, after its
        stored shape and its scales (finite) are checked."""
        packed, dtype = self.raw(module + ".weight_packed")
        if dtype != "I32":
            raise ValueError(f"tensor {module}.weight_packed has dtype {dtype}; packed int4 words are I32")
        declared, _ = self.raw(module + ".weight_shape")
        if [int(v) for v in np.asarray(declared).reshape(-1)] != list(shape):
            raise ValueError(f"tensor {module}.weight_shape holds {np.asarray(declared).tolist()}; the config "
                             f"implies {list(shape)}")
        scale = self.float32(module + ".weight_scale", (1, 1))       # checked finite
        raw_scale, scale_dtype = self.raw(module + ".weight_scale")
        if keep and scale_dtype == "BF16":
            scale = raw_scale                 # bf16 bits, as released: the GPU keeps them so
        try:
            w = Int4Grouped(np.ascontiguousarray(packed), scale, group, shape[1])
        except ValueError as err:
            raise ValueError(f"{module}: {err}") from None
        return w if keep else w.dequantize()

    def _fp8(self, name: str, raw: np.ndarray, block: tuple[int, int]) -> BlockScaled:
        scale_name = name + "_scale_inv"
        if scale_name not in self:
            raise ValueError(f"fp8 tensor {name} has no block scales {scale_name}")
        if raw.ndim != 2:
            raise ValueError(f"fp8 tensor {name} must be 2-D, got shape {raw.shape}")
        nan_bytes = int(((raw & 0x7F) == 0x7F).sum())        # e4m3fn has no infinities; 0x7f / 0xff are NaN
        if nan_bytes:
            raise ValueError(f"tensor {name} holds {nan_bytes} non-finite values (NaN or inf)")
        scale = self.float32(scale_name, block)
        try:
            return BlockScaled(raw, scale, block)
        except ValueError as err:
            raise ValueError(f"{scale_name}: {err}") from None


def _check_finite(name: str, w: np.ndarray) -> None:
    if not np.isfinite(w).all():
        raise ValueError(f"tensor {name} holds {int((~np.isfinite(w)).sum())} non-finite values (NaN or inf)")


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the forward reads, by its HF name, with the shape the config implies."""
    m, h, c, r = cfg.hidden_size, cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    qk, dv = cfg.qk_head_dim, cfg.v_head_dim
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, m), "model.norm.weight": (m,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, m)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (m,)
        shapes[p + "post_attention_layernorm.weight"] = (m,)
        a = p + "self_attn."
        if cfg.q_lora_rank is None:
            shapes[a + "q_proj.weight"] = (h * qk, m)
        else:
            shapes[a + "q_a_proj.weight"] = (cfg.q_lora_rank, m)
            shapes[a + "q_a_layernorm.weight"] = (cfg.q_lora_rank,)
            shapes[a + "q_b_proj.weight"] = (h * qk, cfg.q_lora_rank)
        shapes[a + "kv_a_proj_with_mqa.weight"] = (c + r, m)
        shapes[a + "kv_a_layernorm.weight"] = (c,)
        shapes[a + "kv_b_proj.weight"] = (h * (cfg.qk_nope_head_dim + dv), c)
        shapes[a + "o_proj.weight"] = (m, h * dv)
        f = p + "mlp."
        if cfg.is_moe_layer(i):
            e, inter = cfg.n_routed_experts, cfg.moe_intermediate_size
            shapes[f + "gate.weight"] = (e, m)
            if cfg.topk_method == "noaux_tc":
                shapes[f + "gate.e_score_correction_bias"] = (e,)
            for j in range(e):
                shapes[f + f"experts.{j}.gate_proj.weight"] = (inter, m)
                shapes[f + f"experts.{j}.up_proj.weight"] = (inter, m)
                shapes[f + f"experts.{j}.down_proj.weight"] = (m, inter)
            if cfg.n_shared_experts:
                s = inter * cfg.n_shared_experts
                shapes[f + "shared_experts.gate_proj.weight"] = (s, m)
                shapes[f + "shared_experts.up_proj.weight"] = (s, m)
                shapes[f + "shared_experts.down_proj.weight"] = (m, s)
        else:
            shapes[f + "gate_proj.weight"] = (cfg.intermediate_size, m)
            shapes[f + "up_proj.weight"] = (cfg.intermediate_size, m)
            shapes[f + "down_proj.weight"] = (m, cfg.intermediate_size)
    return shapes


def int4_modules(cfg: ModelConfig, shapes: dict) -> dict[str, tuple[int, int]]:
    """The Linear modules an INT4 checkpoint stores packed, name -> [out, in]: every matrix the
    forward reads except the embedding and the MoE router (neither is an ``nn.Linear``) and the
    modules its ignore list names."""
    out = {}
    for name, shape in shapes.items():
        module = name.removesuffix(".weight")
        if (len(shape) == 2 and name.endswith(".weight") and name != "model.embed_tokens.weight"
                and not name.endswith("mlp.gate.weight") and cfg.is_int4(module)):
            out[module] = shape
    return out


def stored_shapes(cfg: ModelConfig, shapes: dict) -> dict[str, tuple[int, ...]]:
    """``shapes`` as the checkpoint stores them: an INT4 module's ``.weight`` [out, in] becomes
    ``.weight_packed`` [out, ceil(in/8)] int32, ``.weight_scale`` [out, in / group] and
    ``.weight_shape`` [2]."""
    packed = int4_modules(cfg, shapes)
    stored = {n: s for n, s in shapes.items() if n.removesuffix(".weight") not in packed or not n.endswith(".weight")}
    g = cfg.int4_group_size
    for module, (o, i) in packed.items():
        if i % g:
            raise ValueError(f"{module}: int4 group_size {g} does not divide its {i} inputs")
        stored[module + ".weight_packed"] = (o, -(-i // 8))
        stored[module + ".weight_scale"] = (o, i // g)
        stored[module + ".weight_shape"] = (2,)
    return stored


# Checkpoints bigger than this show a progress bar while loading.
PROGRESS_BYTES = 256 << 20


def first_and_more(names: list[str]) -> str:
    """``names[0]``, and how many more there are, for an error message."""
    return names[0] + (f" (and {len(names) - 1} more)" if len(names) > 1 else "")


def unread_tensors(index: "SafetensorsIndex", names, skip_prefixes: tuple[str, ...] = ()) -> list[str]:
    """Tensors of the checkpoint besides ``names`` (the ones read), the block scales of fp8 ones
    among them, and those under ``skip_prefixes``; sorted."""
    known = set(names) | {n + "_scale_inv" for n in names}
    return sorted(n for n in index.entries if n not in known and not n.startswith(skip_prefixes))


def matrix_dtypes(index: "SafetensorsIndex", names) -> set[str]:
    """The stored dtypes ('BF16', 'F8_E4M3', ...) of the tensors among ``names`` of two or more
    dimensions."""
    return {index.entries[n][1]["dtype"] for n in names if len(index.entries[n][1]["shape"]) >= 2}


def mtp_prefixes(cfg: ModelConfig, index: "SafetensorsIndex") -> tuple[str, ...]:
    """DeepSeek's multi-token-prediction layers (indices ``num_hidden_layers .. +
    num_nextn_predict_layers - 1``, which greedy decoding does not use), recognised by their own
    ``eh_proj`` projection, so that a decoder layer the config leaves out is never taken for one."""
    return tuple(p for p in (f"model.layers.{cfg.num_hidden_layers + k}." for k in range(cfg.num_nextn_predict_layers))
                 if p + "eh_proj.weight" in index)


def load_weights(path: str | os.PathLike, cfg: ModelConfig | None = None,
                 progress: bool | None = None) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """Read config.json and every tensor the forward needs, as float32, keyed by HF name.

    A checkpoint that disagrees with its config is refused with a ``ValueError`` naming the
    tensor: one missing, a shape the config does not imply, one the forward would not read (the
    MTP layer DeepSeek ships, ``num_nextn_predict_layers``, is the one exception: skipped), or a
    weight holding NaN or infinity. ``progress`` None shows a bar above PROGRESS_BYTES.
    """
    cfg, weights, _ = read_checkpoint(path, cfg, progress)
    return cfg, weights


def read_checkpoint(path: str | os.PathLike, cfg: ModelConfig | None = None, progress: bool | None = None,
                    keep_fp8: bool = False) -> tuple[ModelConfig, dict[str, np.ndarray], "SafetensorsIndex"]:
    """``load_weights``, and the ``SafetensorsIndex`` it read them through (for the stored dtypes).
    ``keep_fp8``: quantized matrices come back as stored (fp8: ``BlockScaled``, INT4:
    ``Int4Grouped``) instead of dequantized."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise ValueError(f"checkpoint path {path} is not a directory")
    cfg = cfg or ModelConfig.from_json(path)
    index = SafetensorsIndex(path)
    shapes = expected_shapes(cfg)
    stored = stored_shapes(cfg, shapes)
    missing = [n for n in stored if n not in index]
    if missing:
        raise ValueError(f"checkpoint is missing tensor {first_and_more(missing)}")
    for name, shape in stored.items():
        got = tuple(index.entries[name][1]["shape"])
        if got != shape:
            raise ValueError(f"tensor {name} has shape {list(got)}; the config implies {list(shape)}")
    extra = unread_tensors(index, stored, skip_prefixes=mtp_prefixes(cfg, index))
    if extra:
        raise ValueError(f"checkpoint holds tensor {first_and_more(extra)}, which the config does not read: config.json "
                         f"and the weights disagree (num_hidden_layers={cfg.num_hidden_layers}, "
                         f"n_routed_experts={cfg.n_routed_experts}, topk_method={cfg.topk_method!r}, "
                         f"tie_word_embeddings={cfg.tie_word_embeddings})")
    total = sum(index.nbytes(n) for n in stored)
    if progress is None:
        progress = total > PROGRESS_BYTES
    packed = int4_modules(cfg, shapes)
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"loading {os.path.basename(path)}")
    block = cfg.weight_block_size or (128, 128)
    weights = {}
    try:
        for name in shapes:
            module = name.removesuffix(".weight")
            if module in packed and name.endswith(".weight"):
                weights[name] = index.int4(module, packed[module], cfg.int4_group_size, keep_fp8)
                nbytes = sum(index.nbytes(module + part) for part in INT4_PARTS)
            else:
                weights[name] = index.weight(name, block, keep_fp8)
                nbytes = index.nbytes(name)
            if bar is not None:
                bar.update(nbytes)
    finally:
        if bar is not None:
            bar.close()
    return cfg, weights, index
