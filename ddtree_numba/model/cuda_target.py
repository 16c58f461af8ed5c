"""The target model on the GPU: device weights, a device latent cache, preallocated forward
buffers, eager and CUDA-graph forwards. Same ``forward`` API and results as ``Target`` (numpy).

Shapes: T new tokens (at most ``rows`` of a workspace), S cache capacity, M hidden size, H heads,
Q ``q_lora_rank``, C ``kv_lora_rank``, R ``qk_rope_head_dim``, D ``qk_nope_head_dim``, Dv
``v_head_dim``, I dense intermediate size, E experts, V vocab, L layers, Y requested hidden layers.

Every stage is a kernel from ``ddtree_numba.kernels`` (the twins of ``ddtree_numba.reference``),
enqueued through their private ``_enqueue_*`` functions, which allocate nothing and read the sizes
that change between forwards (cache length s0, new rows t) from ``Workspace.meta`` on the device.
So one forward of a workspace can be captured once as a CUDA graph and replayed for any t up to
``rows`` and any cache length (``forward(..., graph=True)``); eager and graph runs launch the same
kernels with the same arguments and give the same bits.

Batch invariance (DESIGN.md section 4): every kernel reduces in an order fixed by the data of one
row (GEMM: fixed KC chunks; attention: over the visible keys in cache order; MoE: experts in
ascending id), so a token's logits are the same bits alone, in a batch, or as a tree node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numba import config as numba_config
from numba import cuda

from .._checks import check_int
from ..kernels.compact import _enqueue_compaction
from ..kernels.embedding import _enqueue_embedding
from ..kernels.linear import _enqueue_linear, _enqueue_linear_heads, _enqueue_swiglu
from ..kernels.mla import MLAScratch, _absorb_weights, _enqueue_mla_attention
from ..kernels.moe import MoEBuffers, MoERoute, _enqueue_moe_block
from ..kernels.rms_norm import _enqueue_rms_norm
from ..kernels.rope import _enqueue_rope
from ..kernels.visibility import _visibility_bits_kernel
from .._device import ceil_div
from .config import ModelConfig

WEIGHT_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}


# -- host-side weight preparation ------------------------------------------------------------

def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even (exact for values that
    came from bf16)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def storage_dtype(stored: set[str]) -> str:
    """The narrowest weight dtype that holds every stored matrix exactly: 'bfloat16' or 'float16'
    when all are, else 'float32' (fp8 is dequantized with its block scales, so float32)."""
    if stored == {"BF16"}:
        return "bfloat16"
    if stored == {"F16"}:
        return "float16"
    return "float32"


def _narrow(a: np.ndarray, dtype) -> np.ndarray:
    """A float32 matrix stored as ``dtype`` (float32, float16 or uint16 = bfloat16 bits)."""
    if dtype == np.uint16:
        return to_bf16_bits(a)
    return np.ascontiguousarray(a, dtype=dtype)


@dataclass
class DeviceLayer:
    """One decoder layer's device weights. Norm weights, the router and its bias are float32;
    matrices are float32, float16 or uint16 (bfloat16 bits), HF layout [out, in]."""

    input_layernorm: object              # [M] f32
    post_attention_layernorm: object     # [M] f32
    q_proj: object                       # [H*(D+R), M] when q_lora_rank is null, else None
    q_a_proj: object                     # [Q, M] or None
    q_a_layernorm: object                # [Q] f32 or None
    q_b_proj: object                     # [H*(D+R), Q] or None
    kv_a_proj_with_mqa: object           # [C+R, M]
    kv_a_layernorm: object               # [C] f32
    w_uk_t: object                       # [H, C, D]  absorbs a query into the latent space
    w_uv: object                         # [H, Dv, C] takes the attention output out of it
    o_proj: object                       # [M, H*Dv]
    mlp_gate_proj: object = None         # [I, M] dense layers
    mlp_up_proj: object = None           # [I, M]
    mlp_down_proj: object = None         # [M, I]
    gate: object = None                  # [E, M] f32, MoE layers
    e_score_correction_bias: object = None  # [E] f32 (noaux_tc)
    experts_gate_proj: object = None     # [E, Ie, M]
    experts_up_proj: object = None       # [E, Ie, M]
    experts_down_proj: object = None     # [E, M, Ie]
    shared_gate_proj: object = None      # [Ie*n_shared, M]
    shared_up_proj: object = None        # [Ie*n_shared, M]
    shared_down_proj: object = None      # [M, Ie*n_shared]

    @property
    def is_moe(self) -> bool:
        return self.gate is not None


def device_layers_from_host(cfg: ModelConfig, layers, dtype) -> list[DeviceLayer]:
    """Upload ``model.target.LayerWeights`` (float32 numpy) to the device, matrices stored as
    ``dtype`` (float32, float16 or uint16 = bfloat16 bits)."""
    f32 = lambda a: None if a is None else cuda.to_device(np.ascontiguousarray(a, np.float32))  # noqa: E731
    out = []
    for lw in layers:
        mat = lambda a: None if a is None else cuda.to_device(_narrow(a, dtype))  # noqa: E731
        w_uk_t, w_uv = _absorb_weights(lw.kv_b_proj, cfg.num_attention_heads, cfg.qk_nope_head_dim)
        out.append(DeviceLayer(
            input_layernorm=f32(lw.input_layernorm),
            post_attention_layernorm=f32(lw.post_attention_layernorm),
            q_proj=mat(lw.q_proj), q_a_proj=mat(lw.q_a_proj), q_a_layernorm=f32(lw.q_a_layernorm),
            q_b_proj=mat(lw.q_b_proj), kv_a_proj_with_mqa=mat(lw.kv_a_proj_with_mqa),
            kv_a_layernorm=f32(lw.kv_a_layernorm), w_uk_t=mat(np.ascontiguousarray(w_uk_t)),
            w_uv=mat(np.ascontiguousarray(w_uv)), o_proj=mat(lw.o_proj),
            mlp_gate_proj=mat(lw.mlp_gate_proj), mlp_up_proj=mat(lw.mlp_up_proj),
            mlp_down_proj=mat(lw.mlp_down_proj),
            gate=f32(lw.gate), e_score_correction_bias=f32(lw.e_score_correction_bias),
            experts_gate_proj=mat(lw.experts_gate_proj),
            experts_up_proj=mat(lw.experts_up_proj),
            experts_down_proj=mat(lw.experts_down_proj),
            shared_gate_proj=mat(lw.shared_gate_proj), shared_up_proj=mat(lw.shared_up_proj),
            shared_down_proj=mat(lw.shared_down_proj)))
    return out


# -- device state ------------------------------------------------------------------------------

class DeviceMLACache:
    """The latent cache on the device: rows ``[0, length)`` of every layer are live.

    c_kv [L, S, C] float32 (RMS-normed latents), k_pe [L, S, R] float32 (rotated rope keys): the
    same rows as ``MLACache``, read in place by the attention kernel. ``length`` is kept on the
    host (the decode loop knows it) and written to ``Workspace.meta`` at each forward.
    """

    def __init__(self, cfg: ModelConfig, capacity: int):
        capacity = check_int("max_tokens", capacity, 1)
        self.capacity = capacity
        self.length = 0
        L, C, R = cfg.num_hidden_layers, cfg.kv_lora_rank, cfg.qk_rope_head_dim
        self.c_kv = cuda.device_array((L, capacity, C), np.float32)   # [L, S, C]
        self.k_pe = cuda.device_array((L, capacity, R), np.float32)   # [L, S, R]
        self._start_n = cuda.device_array(2, np.int32)                # (start, n) for compaction
        self._keep = cuda.device_array(capacity, np.int32)            # [<= S] kept row offsets

    def __len__(self) -> int:
        return self.length

    @property
    def free(self) -> int:
        return self.capacity - self.length

    def reserve(self, n: int) -> int:
        if n > self.free:
            raise ValueError(f"cache overflow: {self.length} rows + {n} new exceeds capacity {self.capacity}")
        return self.length

    def truncate(self, length: int) -> None:
        self.length = check_int("length", length, 0, self.length)

    def reset(self) -> None:
        self.length = 0

    def fill(self, value: float) -> None:
        """Set every row (live or not) to ``value``: tests poison the cache with NaN."""
        self.c_kv.copy_to_device(np.full(self.c_kv.shape, value, np.float32))
        self.k_pe.copy_to_device(np.full(self.k_pe.shape, value, np.float32))

    def compact(self, start: int, keep, stream=0) -> None:
        """Rows ``start + keep[i]`` move to ``start + i`` in every layer (``compact_rows``, the
        race-free columns scheme) and the cache ends after the kept rows. keep [n] int32, numpy
        or device."""
        start = check_int("start", start, 0, self.length)
        keep_h = keep if not hasattr(keep, "copy_to_host") else keep.copy_to_host()
        keep_h = np.asarray(keep_h)
        if keep_h.dtype != np.int32:
            raise ValueError(f"keep must have dtype int32, got {keep_h.dtype}")
        from .._checks import check_keep_values
        check_keep_values(keep_h, self.length - start)
        n = keep_h.shape[0]
        self._start_n.copy_to_device(np.array([start, n], np.int32), stream=stream)
        self._keep[:n].copy_to_device(keep_h, stream=stream)
        self.enqueue_compact(stream)
        self.length = start + n

    def enqueue_compact(self, stream=0, n_max=None, keep=None) -> None:
        """Compact every layer with (start, n) already in ``_start_n`` on the device and ``keep``
        (default ``_keep``) a device int32 array; ``length`` is the caller's to update."""
        keep = self._keep if keep is None else keep
        for layer in range(self.c_kv.shape[0]):
            _enqueue_compaction(self.c_kv[layer], self._start_n, keep, n_max or self.capacity,
                                stream=stream)
            _enqueue_compaction(self.k_pe[layer], self._start_n, keep, n_max or self.capacity,
                                stream=stream)


@dataclass
class Workspace:
    """Every device buffer one forward of up to ``rows`` tokens needs; a forward allocates nothing.

    Inputs the host (or the decode loop's kernels) write before a forward: ``ids``, ``positions``,
    ``parents`` and ``meta`` = (s0 cache rows before the forward, t new rows).
    """

    rows: int
    ids: object                 # [T] int32
    positions: object           # [T] int32
    parents: object             # [T] int32, a tree over the new rows (causal = the chain)
    meta: object                # [2] int32 (s0, t)
    vis_bits: object            # [T, ceil(T/32)] uint32 ancestor bits among the new rows
    x: object                   # [T, M] residual stream
    normed: object              # [T, M] RMS-normed input of attention / FFN
    q_a: object                 # [T, Q] (q_lora only)
    q_a_normed: object          # [T, Q]
    q: object                   # [T, H*(D+R)] query: per head D nope then R rope values
    kv: object                  # [T, C+R] latent (before norm) and rope key (before rotation)
    q_pe: object                # [T, H*R] rotated rope queries
    q_lat: object               # [T, H*C] queries in the latent space
    o_lat: object               # [T, H*C] attention output in the latent space
    o: object                   # [T, H*Dv] attention output per head
    act: object                 # [T, I] dense SwiGLU activation
    moe: object                 # MoEBuffers for T rows, or None for an all-dense model
    logits: object              # [T, V]
    hidden: object              # [L, T, M] per-layer residual outputs (filled for requested layers)
    mla_scratch: object = None  # MLAScratch: scores [T*H, >= S], sized by the largest cache seen
    graphs: dict = field(default_factory=dict)   # (cache id, hidden layers) -> CUDA graph exec

    @property
    def n_rows(self):
        """meta[1:2]: the live row count the kernels read."""
        return self.meta[1:2]

    @property
    def s0(self):
        """meta[0:1]: the cache length before this forward (where new rows go)."""
        return self.meta[0:1]


def new_workspace(cfg: ModelConfig, rows: int) -> Workspace:
    rows = check_int("rows", rows, 1)
    H, C, R = cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    D, Dv, M = cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.hidden_size
    f32 = lambda *shape: cuda.device_array(shape, np.float32)  # noqa: E731
    has_moe = any(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
    has_dense = any(not cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
    Q = cfg.q_lora_rank or 1
    moe = MoEBuffers(rows, cfg.n_routed_experts, cfg.num_experts_per_tok, M, cfg.moe_intermediate_size,
                     shared_inter=cfg.moe_intermediate_size * (cfg.n_shared_experts or 0)) if has_moe else None
    return Workspace(
        rows=rows,
        ids=cuda.to_device(np.zeros(rows, np.int32)),
        positions=cuda.to_device(np.zeros(rows, np.int32)),
        parents=cuda.to_device(np.arange(-1, rows - 1, dtype=np.int32)),
        meta=cuda.to_device(np.zeros(2, np.int32)),
        vis_bits=cuda.device_array((rows, ceil_div(rows, 32)), np.uint32),
        x=f32(rows, M), normed=f32(rows, M), q_a=f32(rows, Q), q_a_normed=f32(rows, Q),
        q=f32(rows, H * (D + R)), kv=f32(rows, C + R), q_pe=f32(rows, H * R),
        q_lat=f32(rows, H * C), o_lat=f32(rows, H * C), o=f32(rows, H * Dv),
        act=f32(rows, cfg.intermediate_size if has_dense else 1), moe=moe,
        logits=f32(rows, cfg.vocab_size), hidden=f32(cfg.num_hidden_layers, rows, M),
    )


# -- the target ------------------------------------------------------------------------------

class CudaTarget:
    """A target model whose forward runs on the GPU (``load_target(path, backend="cuda")``).

    ``forward`` has the numpy ``Target``'s arguments and results (numpy logits and hidden
    states); ``forward_device`` leaves them in the workspace for the decode loop.
    """

    backend = "cuda"

    def __init__(self, cfg: ModelConfig, embed_tokens, norm, lm_head, layers: list[DeviceLayer], rope):
        self.config = cfg
        self.embed_tokens = embed_tokens          # [V, M] device, any weight dtype
        self.norm = norm                          # [M] f32 device
        self.lm_head = lm_head                    # [V, M] device
        self.layers = layers
        self.rope = rope                          # model.target.RopeTables (host)
        self.inv_freq = cuda.to_device(np.ascontiguousarray(rope.inv_freq, np.float64))  # [R/2]
        has_moe = any(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
        self._route = MoERoute.from_config(cfg) if has_moe else None
        self._workspaces: dict[int, Workspace] = {}

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_host(cls, host_target, weight_dtype: str = "float32"):
        """Upload a numpy ``Target``, every matrix stored as ``weight_dtype`` ('float32',
        'float16' or 'bfloat16'); norm weights, the router and its bias stay float32."""
        if weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"weight_dtype must be one of {sorted(WEIGHT_DTYPES)}, got {weight_dtype!r}")
        cfg, dt = host_target.config, WEIGHT_DTYPES[weight_dtype]
        layers = device_layers_from_host(cfg, host_target.layers, dt)
        embed = cuda.to_device(_narrow(host_target.embed_tokens, dt))
        head = embed if cfg.tie_word_embeddings else cuda.to_device(_narrow(host_target.lm_head, dt))
        norm = cuda.to_device(np.ascontiguousarray(host_target.norm, np.float32))
        return cls(cfg, embed, norm, head, layers, host_target.rope)

    def new_cache(self, max_tokens: int) -> DeviceMLACache:
        """An empty device latent cache with room for ``max_tokens`` rows per layer."""
        return DeviceMLACache(self.config, max_tokens)

    def workspace(self, rows: int) -> Workspace:
        """The preallocated buffers for forwards of up to ``rows`` tokens (rounded up to a power
        of two), made on first use and kept. Kernels pick their tiles by these row counts."""
        size = 1 << (int(rows) - 1).bit_length()
        if size not in self._workspaces:
            self._workspaces[size] = new_workspace(self.config, size)
        return self._workspaces[size]

    # -- the forward -----------------------------------------------------------------------
    def _check_inputs(self, ids, positions, cache, parents, hidden_layer_ids):
        from .target import check_forward_inputs
        if not isinstance(cache, DeviceMLACache):
            raise ValueError(f"cache must be a DeviceMLACache from new_cache(), got {type(cache).__name__}")
        return check_forward_inputs(self.config, ids, positions, cache, parents, hidden_layer_ids)

    def forward(self, ids, positions, cache: DeviceMLACache, parents=None, hidden_layer_ids=(),
                graph: bool = False, stream=0):
        """Run ``ids`` at ``positions`` after the cached rows and append their latent rows.

        ids [T] int32/int64, positions [T] int32/int64, parents [T] int32 or None (causal), as
        ``Target.forward`` -> ``ForwardOutput`` (numpy logits [T, V], hidden [T, Y, M]).
        ``graph``: replay a CUDA graph of this workspace's forward (captured on first use)
        instead of launching every kernel from Python; same bits.
        """
        from .target import ForwardOutput
        layers_out = self._check_inputs(ids, positions, cache, parents, hidden_layer_ids)
        t = ids.shape[0]
        ws = self.workspace(t)
        chain = np.arange(-1, ws.rows - 1, dtype=np.int32)
        if parents is not None:
            chain[:t] = parents
        ids_pad = np.zeros(ws.rows, np.int32)
        ids_pad[:t] = ids
        pos_pad = np.zeros(ws.rows, np.int32)
        pos_pad[:t] = positions
        ws.ids.copy_to_device(ids_pad, stream=stream)
        ws.positions.copy_to_device(pos_pad, stream=stream)
        ws.parents.copy_to_device(chain, stream=stream)
        ws.meta.copy_to_device(np.array([cache.length, t], np.int32), stream=stream)
        self.forward_device(ws, cache, tuple(layers_out), graph=graph, stream=stream)
        cache.length += t
        logits = ws.logits[:t].copy_to_host(stream=stream)
        if layers_out:
            hid = np.stack([ws.hidden[i][:t].copy_to_host(stream=stream) for i in layers_out], axis=1)
        else:
            hid = np.zeros((t, 0, self.config.hidden_size), np.float32)
        return ForwardOutput(logits=logits, hidden=hid)

    def forward_device(self, ws: Workspace, cache: DeviceMLACache, hidden_layer_ids=(), graph=False,
                       stream=0) -> None:
        """Enqueue one forward with inputs already in ``ws`` (ids, positions, parents, meta =
        (cache.length, t)): fills ``ws.logits[:t]`` and ``ws.hidden[l, :t]`` for the requested
        layers and writes the new latent rows at ``cache.length + [0, t)``. Does not advance
        ``cache.length`` (the caller knows t)."""
        if ws.mla_scratch is None or ws.mla_scratch.scores.shape[1] < cache.capacity:
            # attention scores of every (row, head) over the whole cache; sized once per capacity
            ws.mla_scratch = MLAScratch(ws.rows, self.config.num_attention_heads, cache.capacity)
            ws.graphs.clear()                                          # they point at the old one
        if not graph:
            self._enqueue_forward(ws, cache, hidden_layer_ids, stream)
            return
        if numba_config.ENABLE_CUDASIM:
            raise ValueError("graph=True needs a real GPU: the CUDA simulator cannot capture graphs")
        key = (id(cache), tuple(hidden_layer_ids))
        exe = ws.graphs.get(key)
        if exe is None:
            exe = ws.graphs[key] = _capture(lambda s: self._enqueue_forward(ws, cache, hidden_layer_ids, s))
        _replay(exe, stream)

    def _enqueue_forward(self, ws: Workspace, cache: DeviceMLACache, hidden_layer_ids, stream) -> None:
        rows, eps = ws.rows, self.config.rms_norm_eps
        _visibility_bits_kernel[(ceil_div(rows, 16), ceil_div(ws.vis_bits.shape[1], 16)), (16, 16), stream](
            ws.parents, ws.vis_bits)                                         # ancestor bits of the new rows
        _enqueue_embedding(ws.ids, self.embed_tokens, ws.x, ws.n_rows, stream=stream)
        for i, lw in enumerate(self.layers):
            self._enqueue_layer(ws, cache, i, lw, stream)
            if i in hidden_layer_ids:
                ws.hidden[i].copy_to_device(ws.x, stream=stream)
        _enqueue_rms_norm(ws.x, self.norm, eps, ws.normed, ws.n_rows, stream=stream)
        _enqueue_linear(ws.normed, self.lm_head, ws.logits, ws.n_rows, stream=stream)

    def _enqueue_layer(self, ws: Workspace, cache: DeviceMLACache, i: int, lw: DeviceLayer, stream,
                       mark=None) -> None:
        """Decoder layer i over ws.x in place; ``mark(stage)`` (benchmarks) is called after each
        stage's launches."""
        cfg = self.config
        H, D, R, C = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
        eps, n = cfg.rms_norm_eps, ws.n_rows
        mark = mark or (lambda stage: None)
        # attention: x += o_proj(MLA(rms_norm(x)))
        _enqueue_rms_norm(ws.x, lw.input_layernorm, eps, ws.normed, n, stream=stream)
        mark("input norm")
        if lw.q_proj is not None:
            _enqueue_linear(ws.normed, lw.q_proj, ws.q, n, stream=stream)
        else:
            _enqueue_linear(ws.normed, lw.q_a_proj, ws.q_a, n, stream=stream)
            _enqueue_rms_norm(ws.q_a, lw.q_a_layernorm, eps, ws.q_a_normed, n, stream=stream)
            _enqueue_linear(ws.q_a_normed, lw.q_b_proj, ws.q, n, stream=stream)
        mark("q projection")
        _enqueue_linear(ws.normed, lw.kv_a_proj_with_mqa, ws.kv, n, stream=stream)
        mark("kv_a projection")
        c_kv, k_pe = cache.c_kv[i], cache.k_pe[i]                            # [S, C], [S, R]
        _enqueue_rms_norm(ws.kv, lw.kv_a_layernorm, eps, c_kv, n, out_row0=ws.s0, stream=stream)
        _enqueue_rope(ws.kv, C, 0, k_pe, 0, 0, 1, R, ws.positions, self.inv_freq,
                      self.rope.attention_factor, cfg.rope_interleave, n, dst_row0=ws.s0, stream=stream)
        _enqueue_rope(ws.q, D, D + R, ws.q_pe, 0, R, H, R, ws.positions, self.inv_freq,
                      self.rope.attention_factor, cfg.rope_interleave, n, stream=stream)
        mark("latent norm + rope (cache append)")
        _enqueue_linear_heads(ws.q, D + R, lw.w_uk_t, ws.q_lat, n, stream=stream)
        mark("query absorption (W_uk)")
        _enqueue_mla_attention(ws.q_lat, ws.q_pe, c_kv, k_pe, ws.vis_bits, ws.meta, self.rope.scale,
                               ws.o_lat, ws.mla_scratch, stream=stream)
        mark("MLA attention")
        _enqueue_linear_heads(ws.o_lat, C, lw.w_uv, ws.o, n, stream=stream)
        mark("output absorption (W_uv)")
        _enqueue_linear(ws.o, lw.o_proj, ws.x, n, accumulate=True, stream=stream)
        mark("o_proj + residual")
        # feed-forward: x += FFN(rms_norm(x))
        _enqueue_rms_norm(ws.x, lw.post_attention_layernorm, eps, ws.normed, n, stream=stream)
        mark("post-attention norm")
        if lw.is_moe:
            _enqueue_moe_block(ws.normed, ws.x, lw.gate, lw.e_score_correction_bias,
                               lw.experts_gate_proj, lw.experts_up_proj, lw.experts_down_proj,
                               lw.shared_gate_proj, lw.shared_up_proj, lw.shared_down_proj,
                               self._route, ws.moe, n, stream=stream)
            mark("MoE (route, sort, experts, shared, combine)")
        else:
            _enqueue_swiglu(ws.normed, lw.mlp_gate_proj, lw.mlp_up_proj, ws.act, n, stream=stream)
            _enqueue_linear(ws.act, lw.mlp_down_proj, ws.x, n, accumulate=True, stream=stream)
            mark("dense MLP")


# -- CUDA graphs -------------------------------------------------------------------------------

def _check(result):
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise RuntimeError(f"CUDA runtime error {err}")
    return result[1] if isinstance(result, tuple) and len(result) == 2 else result


def _capture(enqueue):
    """Capture ``enqueue(stream)`` into an instantiated CUDA graph (GPU.md: numba launches on a
    captured stream are recorded, not run)."""
    from cuda.bindings import runtime as rt
    stream = cuda.stream()
    handle = stream.handle.value if hasattr(stream.handle, "value") else int(stream.handle)
    enqueue(stream)                 # warm-up: compile and load every kernel outside the capture
    stream.synchronize()
    _check(rt.cudaStreamBeginCapture(handle, rt.cudaStreamCaptureMode.cudaStreamCaptureModeRelaxed))
    enqueue(stream)
    graph = _check(rt.cudaStreamEndCapture(handle))
    exe = _check(rt.cudaGraphInstantiate(graph, 0))
    return exe


def _replay(exe, stream=0):
    from cuda.bindings import runtime as rt
    if stream == 0:
        handle = 0
    else:
        handle = stream.handle.value if hasattr(stream.handle, "value") else int(stream.handle)
    _check(rt.cudaGraphLaunch(exe, handle))
