"""The target model on the GPU: device weights, a device latent cache, preallocated forward
buffers, eager and CUDA-graph forwards. Same ``forward`` API and results as ``NumpyTarget``.

Shapes: T new tokens (at most ``rows`` of a workspace), S cache capacity, M hidden size, H heads,
Q ``q_lora_rank``, C ``kv_lora_rank``, R ``qk_rope_head_dim``, D ``qk_nope_head_dim``, Dv
``v_head_dim``, I dense intermediate size, E experts, V vocab, L layers, Y requested hidden layers.

Every stage is a kernel from ``ddtree_numba.kernels`` (the twins of ``ddtree_numba.reference``),
enqueued through its device tier (``enqueue_*``), which allocates nothing and reads the sizes
that change between forwards (cache length s0, new rows t) from ``Workspace.meta`` on the device.
So one forward of a workspace can be captured once as a CUDA graph and replayed for any t up to
``rows`` and any cache length (``forward(..., graph=True)``); eager and graph runs launch the same
kernels with the same arguments and give the same bits.

Batch invariance (docs/DESIGN.md §4): every kernel reduces in an order fixed by the data of one
row (GEMM: fixed KC chunks; attention: over the visible keys in cache order; MoE: experts in
ascending id), so a token's logits are the same bits alone, in a batch, or as a tree node.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
from numba import config as numba_config
from numba import cuda

from .. import kernels as kn
from .._checks import check_array, check_int, check_keep_values, check_precision
from .._device import capture_graph, ceil_div, destroy_graph, is_device, prefer_pdl_mode, replay_graph, to_device
from ..dtypes import QUANTIZED, WEIGHT_DTYPES, BlockScaled, check_weight_dtype, to_storage, widened
from ..reference.mla import absorption_weights
from .config import ModelConfig
from .target import (BatchForward, ForwardOutput, RopeTables, Segment, _layer_weights, check_finite_output,
                     check_forward_inputs, check_segments, rope_tables)


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
    qkv_a_proj: object = None            # [Q+C+R, M]: q_a_proj and kv_a_proj_with_mqa as one matrix
                                         # (those two are its row views), set by ``__post_init__``
    q_kv_proj: object = None             # [H*(D+R)+C+R, M]: q_proj and kv_a_proj_with_mqa as one matrix
                                         # (a layer without q_lora; the same, by ``__post_init__``)

    def __post_init__(self):
        """Stack the query's first projection (q_a_proj, or q_proj without q_lora) over
        kv_a_proj_with_mqa into one matrix, both read by one GEMM (both project the same normed
        input: one launch a layer fewer, the same bits by the GEMM's reduction contract); the two
        fields become row views of it, so nothing is stored twice. Only plain (unquantized)
        matrices of one storage dtype and input width."""
        if self.qkv_a_proj is not None or self.q_kv_proj is not None:
            return
        top = self.q_a_proj if self.q_proj is None else self.q_proj
        fused = _stacked(top, self.kv_a_proj_with_mqa)
        if fused is None:
            return
        q = top.shape[0]
        if self.q_proj is None:
            self.qkv_a_proj, self.q_a_proj, self.kv_a_proj_with_mqa = fused, fused[:q], fused[q:]
        else:
            self.q_kv_proj, self.q_proj, self.kv_a_proj_with_mqa = fused, fused[:q], fused[q:]

    @property
    def stacked_latents(self) -> bool:
        """Whether this layer projects q_a and kv in one GEMM (``qkv_a_proj``; not for q_proj)."""
        return self.q_proj is None and self.qkv_a_proj is not None

    @property
    def latent_path(self) -> str:
        """Which GEMM writes the kv latent: 'qkv_a' (stacked with q_a), 'q_kv' (stacked with
        q_proj) or 'apart' (its own)."""
        if self.stacked_latents:
            return "qkv_a"
        return "q_kv" if self.q_proj is not None and self.q_kv_proj is not None else "apart"

    @property
    def is_moe(self) -> bool:
        return self.gate is not None


def _stacked(top, bottom):
    """top over bottom as one new device matrix, or None when they cannot be one (a missing or
    quantized matrix, different storage dtypes or input widths)."""
    if (top is None or bottom is None or isinstance(top, QUANTIZED) or isinstance(bottom, QUANTIZED)
            or top.dtype != bottom.dtype or top.shape[1] != bottom.shape[1]):
        return None
    fused = cuda.device_array((top.shape[0] + bottom.shape[0], top.shape[1]), top.dtype)
    fused[:top.shape[0]].copy_to_device(top)
    fused[top.shape[0]:].copy_to_device(bottom)
    return fused


def device_matrix(a, dtype: str):
    """A host matrix (or stack) on the device: float32 numpy stored as weight dtype ``dtype``; a
    ``BlockScaled`` (fp8) or ``Int4Grouped`` (int4) kept as stored, its words and scales uploaded;
    None stays None."""
    if a is None:
        return None
    if isinstance(a, QUANTIZED):
        return to_device(a)
    return cuda.to_device(to_storage(a, dtype))


def device_layers_from_host(cfg: ModelConfig, layers, dtype: str) -> list[DeviceLayer]:
    """Upload ``model.target.LayerWeights`` to the device: float32 matrices stored as weight
    dtype ``dtype`` ('float32', 'float16' or 'bfloat16', ``dtypes.WEIGHT_DTYPES``), fp8 ones
    (``BlockScaled``) as they are; norms, the router and its bias float32."""
    f32 = lambda a: None if a is None else cuda.to_device(np.ascontiguousarray(widened(a), np.float32))  # noqa: E731
    mat = lambda a: device_matrix(a, dtype)  # noqa: E731
    out = []
    for lw in layers:
        kv_b = lw.kv_b_proj if isinstance(lw.kv_b_proj, BlockScaled) else widened(lw.kv_b_proj)
        w_uk_t, w_uv = absorption_weights(kv_b, cfg.num_attention_heads, cfg.qk_nope_head_dim)
        # quantized absorbed weights that come back dequantized (fp8 blocks straddling heads, int4) stay exact
        absorbed = (lambda a: device_matrix(a, "float32")) if isinstance(lw.kv_b_proj, QUANTIZED) else mat
        out.append(DeviceLayer(
            input_layernorm=f32(lw.input_layernorm),
            post_attention_layernorm=f32(lw.post_attention_layernorm),
            q_proj=mat(lw.q_proj), q_a_proj=mat(lw.q_a_proj), q_a_layernorm=f32(lw.q_a_layernorm),
            q_b_proj=mat(lw.q_b_proj), kv_a_proj_with_mqa=mat(lw.kv_a_proj_with_mqa),
            kv_a_layernorm=f32(lw.kv_a_layernorm), w_uk_t=absorbed(w_uk_t), w_uv=absorbed(w_uv),
            o_proj=mat(lw.o_proj),
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
    host (the decode loop knows it) and written to ``Workspace.meta`` at each forward. A cache of
    a ``DeviceCachePool`` is slot ``slot`` of the pool's arrays (``pool``; else None).
    """

    def __init__(self, cfg: ModelConfig, capacity: int, pool: "DeviceCachePool | None" = None, slot: int = 0):
        capacity = check_int("max_tokens", capacity, 1)
        self.capacity = capacity
        self.length = 0
        self.pool, self.slot = pool, slot
        L, C, R = cfg.num_hidden_layers, cfg.kv_lora_rank, cfg.qk_rope_head_dim
        if pool is None:
            self.c_kv = cuda.device_array((L, capacity, C), np.float32)   # [L, S, C]
            self.k_pe = cuda.device_array((L, capacity, R), np.float32)   # [L, S, R]
        else:
            self.c_kv, self.k_pe = pool.c_kv[slot], pool.k_pe[slot]    # views of the pool's slot
        self._start_n = cuda.device_array(2, np.int32)                # (start, n) of a host compact()
        self._keep = cuda.device_array(capacity, np.int32)            # [<= S] keep of a host compact()

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
        keep_h = np.asarray(keep.copy_to_host() if is_device(keep) else keep)
        check_array("keep", keep_h, 1, np.int32)
        check_keep_values(keep_h, self.length - start)
        n = keep_h.shape[0]
        self._start_n.copy_to_device(np.array([start, n], np.int32), stream=stream)
        self._keep[:n].copy_to_device(keep_h, stream=stream)
        self.enqueue_compact(self._start_n, self._keep, n_max=self.capacity, stream=stream)
        self.length = start + n

    def enqueue_compact(self, start_n, keep, *, n_max, stream=0) -> None:
        """Compact every layer from device values: rows ``start + keep[i]`` move to ``start + i``
        for i < n, (start, n) = start_n[0:2] (int32 [2] device), keep [>= n] int32 device, n <=
        ``n_max``. No sync; ``length`` is the caller's to update (the decode loop knows n)."""
        kn.enqueue_compact_rows(self.c_kv, start_n, keep, n_max=n_max, second=self.k_pe,   # every layer,
                                stream=stream)                                          # one launch


class DeviceCachePool:
    """The latent caches of ``slots`` sequences in one pair of device arrays, so that one attention
    launch set serves all of them (``CudaTarget.forward_batch``): c_kv [slots, L, S, C], k_pe
    [slots, L, S, R]; ``caches[j]`` is slot j's ``DeviceMLACache`` (its arrays views of the slot,
    each used as any cache). Fixed slots: every sequence gets the same capacity S (the largest
    it needs), so a pool of unequal sequences holds idle rows."""

    def __init__(self, cfg: ModelConfig, slots: int, capacity: int):
        slots = check_int("slots", slots, 1)
        capacity = check_int("max_tokens", capacity, 1)
        L, C, R = cfg.num_hidden_layers, cfg.kv_lora_rank, cfg.qk_rope_head_dim
        self.c_kv = cuda.device_array((slots, L, capacity, C), np.float32)   # [slots, L, S, C]
        self.k_pe = cuda.device_array((slots, L, capacity, R), np.float32)   # [slots, L, S, R]
        self.c_kv_rows = self.c_kv.reshape(slots * L * capacity, C)          # the same rows, flat:
        self.k_pe_rows = self.k_pe.reshape(slots * L * capacity, R)          #   the batch's cache writes
        self.caches = [DeviceMLACache(cfg, capacity, pool=self, slot=j) for j in range(slots)]

    def enqueue_compact(self, start_n, keep, *, n_max, stream=0) -> None:
        """Every slot's ``DeviceMLACache.enqueue_compact`` in one launch: slot j's rows ``start +
        keep[j, i]`` move to ``start + i`` for i < n, (start, n) = start_n[j] (int32 [slots, 2]
        device), keep [slots, >= n] int32 device, n <= ``n_max``. No sync; the lengths are the
        caller's to update."""
        slots, L = self.c_kv.shape[0], self.c_kv.shape[1]
        kn.enqueue_compact_rows(self.c_kv.reshape(slots * L, *self.c_kv.shape[2:]), start_n, keep, n_max=n_max,
                                second=self.k_pe.reshape(slots * L, *self.k_pe.shape[2:]), stream=stream)


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
    q_a: object                 # [T, Q] (a q_lora layer without ``qkv_a_proj``; else [1, 1])
    qkv_a: object               # [T, Q+C+R] q_a and kv side by side (a layer with ``qkv_a_proj``; else [1, 1])
    q_a_normed: object          # [T, Q]
    q: object                   # [T, H*(D+R)] query: per head D nope then R rope values (a layer
                                #   without ``q_kv_proj``; else [1, 1])
    q_kv: object                # [T, H*(D+R)+C+R] the query and kv side by side (a layer with ``q_kv_proj``;
                                #   else [1, 1])
    kv: object                  # [T, C+R] latent (before norm) and rope key (before rotation) (a layer
                                #   without ``qkv_a_proj``; else [1, 1])
    q_pe: object                # [T, H*R] rotated rope queries
    q_lat: object               # [T, H*C] queries in the latent space
    o_lat: object               # [T, H*C] attention output in the latent space
    o: object                   # [T, H*Dv] attention output per head
    act: object                 # [T, I] dense SwiGLU activation
    moe: object                 # MoEBuffers for T rows, or None for an all-dense model
    logits: object              # [T, V]
    hidden: object              # [L, T, M] per-layer hidden states (requested layers; ForwardOutput says which)
    mla_scratch: object = None  # MLAScratch: scores [T*H, >= S], sized by the largest cache seen
    graphs: dict = field(default_factory=dict)   # (cache id, hidden layers) -> (CUDA graph exec, cache)

    @property
    def n_rows(self):
        """meta[1:2]: the live row count the kernels read."""
        return self.meta[1:2]

    @property
    def s0(self):
        """meta[0:1]: the cache length before this forward (where new rows go)."""
        return self.meta[0:1]


def new_workspace(cfg: ModelConfig, rows: int, paths: tuple[str, ...] | None = None) -> Workspace:
    """The buffers for forwards of up to ``rows`` tokens; ``paths`` says, per layer, which GEMM
    writes its kv latent (``DeviceLayer.latent_path``): only the buffers of the paths the layers
    take are allocated (the others are [1, 1] placeholders); None allocates them all."""
    rows = check_int("rows", rows, 1)
    H, C, R = cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    D, Dv, M = cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.hidden_size
    f32 = lambda *shape: cuda.device_array(shape, np.float32)  # noqa: E731
    has_moe = any(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
    has_dense = any(not cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
    Q = cfg.q_lora_rank or 1
    takes = lambda path: paths is None or path in paths  # noqa: E731  (some layer takes this path)
    plain = takes("apart")                        # some layer projects the query and kv apart
    moe = kn.MoEBuffers(rows, cfg.n_routed_experts, cfg.num_experts_per_tok, M, cfg.moe_intermediate_size,
                     shared_inter=cfg.moe_intermediate_size * (cfg.n_shared_experts or 0)) if has_moe else None
    return Workspace(
        rows=rows,
        ids=cuda.to_device(np.zeros(rows, np.int32)),
        positions=cuda.to_device(np.zeros(rows, np.int32)),
        parents=cuda.to_device(np.arange(-1, rows - 1, dtype=np.int32)),
        meta=cuda.to_device(np.zeros(2, np.int32)),
        vis_bits=cuda.device_array((rows, ceil_div(rows, 32)), np.uint32),
        x=f32(rows, M), normed=f32(rows, M), q_a_normed=f32(rows, Q),
        q_a=f32(rows, Q) if cfg.q_lora_rank and plain else f32(1, 1),
        qkv_a=f32(rows, Q + C + R) if takes("qkv_a") else f32(1, 1),
        kv=f32(rows, C + R) if plain else f32(1, 1),
        q=f32(rows, H * (D + R)) if plain or takes("qkv_a") else f32(1, 1),
        q_kv=f32(rows, H * (D + R) + C + R) if takes("q_kv") else f32(1, 1), q_pe=f32(rows, H * R),
        q_lat=f32(rows, H * C), o_lat=f32(rows, H * C), o=f32(rows, H * Dv),
        act=f32(rows, cfg.intermediate_size if has_dense else 1), moe=moe,
        logits=f32(rows, cfg.vocab_size), hidden=f32(cfg.num_hidden_layers, rows, M),
    )


@dataclass
class BatchLaunch:
    """Where ``CudaTarget.enqueue_batch`` put a batched forward: the workspace (logits [T, V],
    hidden [L, T, M]), the segments' row bounds ``rows`` [S + 1] (None when the layout lives on
    the device: ``CudaTarget.pooled_launch``), the hidden layers kept, the (row view, cache) parts,
    ``seqs`` [S, 4] int32 device = (cache length, rows, first row, pool slot) a sequence (its first
    two columns are its part's meta), the pool when every cache is a slot of one (then one launch
    of the visibility bits, one of the cache writes and one attention launch set for all), each
    MoE layer's counting-sort offsets [L, E + 1] int32 device, the most rows a sequence has
    (the attention's grid), and the captured graph (None when eager)."""

    ws: Workspace
    rows: np.ndarray | None
    hidden_layer_ids: tuple
    parts: list
    seqs: object
    pool: "DeviceCachePool | None"
    offsets: object
    max_rows: int
    graph: object = None


def unique_experts(cfg: ModelConfig, offsets: np.ndarray) -> np.ndarray:
    """[layers] int32: the distinct routed experts a batched forward's router picked in each layer
    (0 for a dense layer), from its counting-sort offsets [layers, E + 1] (``BatchLaunch.offsets``,
    copied to the host)."""
    unique = np.zeros(cfg.num_hidden_layers, np.int32)
    moe = [i for i in range(cfg.num_hidden_layers) if cfg.is_moe_layer(i)]
    if moe:
        spans = np.diff(np.asarray(offsets), axis=1)                         # [L, E] rows routed to each expert
        unique[moe] = (spans[moe] > 0).sum(axis=1)
    return unique


def _row_view(ws: Workspace, row0: int, n: int, meta) -> Workspace:
    """Rows ``row0 .. row0 + n`` of ``ws`` as a workspace of their own for one sequence of a
    batch: every per-row buffer a view (no copy), ``meta`` [2] int32 device = (its cache length,
    n), the attention scratch shared (the sequences' launches run one after another)."""
    rows = lambda a: a[row0:row0 + n] if a.shape[0] == ws.rows else a      # noqa: E731  ([1, 1] placeholders stay)
    return replace(ws, rows=n, meta=meta, hidden=None, moe=None, graphs={},
                   **{f: rows(getattr(ws, f)) for f in ("ids", "positions", "parents", "vis_bits", "x", "normed",
                                                        "q_a", "qkv_a", "q_a_normed", "q", "q_kv", "kv", "q_pe",
                                                        "q_lat", "o_lat", "o", "act", "logits")})


# -- the target ------------------------------------------------------------------------------

class CudaTarget:
    """A target model whose forward runs on the GPU (``load_target(path, backend="cuda")``).

    ``forward`` has the numpy target's arguments and results (numpy logits and hidden states);
    ``forward_device`` leaves them in the workspace for the decode loop (``DeviceTarget`` in
    ``model.protocols``). ``precision``: of every projection on the tensor cores, 'bf16'
    (activations rounded to bf16 at each GEMM input, as bf16 inference does; the default) or
    'fp32' (faithful to float32, within the HF goldens' 1e-4); the router is always 'fp32'
    (``kernels.linear``, docs/DESIGN.md §4). ``gemm_tile``: None chooses every GEMM's tile from its
    rows; an entry of ``kernels.TILES`` forces it for every projection (same bits: the reduction
    contract). The first cuda target of a process picks how its kernels are launched, unless
    DDTREE_PDL does (``_device.prefer_pdl_mode``: PDL 'trigger' for a launch-bound target of hidden
    size <= 1024 such as the demo's, 'wait' otherwise; the tokens and bits are the same).
    """

    backend = "cuda"

    def __init__(self, cfg: ModelConfig, embed_tokens, norm, lm_head, layers: list[DeviceLayer],
                 rope: RopeTables, *, precision: str = "bf16", gemm_tile=None):
        prefer_pdl_mode(cfg.hidden_size)          # the process's launch mode, if no kernel has run yet
        self.config = cfg
        self.embed_tokens = embed_tokens          # [V, M] device, any weight dtype
        self.norm = norm                          # [M] f32 device
        self.lm_head = lm_head                    # [V, M] device
        self.layers = layers
        self.rope = rope                          # RopeTables (host)
        self.inv_freq = cuda.to_device(np.ascontiguousarray(rope.inv_freq, np.float64))  # [R/2]
        self.precision = check_precision(precision)
        self.gemm_args = dict(precision=self.precision, tile=gemm_tile)   # what every projection is enqueued with
        has_moe = any(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
        self._route = kn.MoERoute(cfg.scoring_func, cfg.topk_method, cfg.n_group, cfg.topk_group,
                                  cfg.num_experts_per_tok, bool(cfg.norm_topk_prob),
                                  float(cfg.routed_scaling_factor)) if has_moe else None
        self._workspaces: dict[tuple, Workspace] = {}   # (rows, latent path per layer) -> buffers

    def __repr__(self) -> str:
        return f"CudaTarget({self.config.describe()}, {self.weight_storage} weights, {self.precision} GEMMs)"

    @property
    def weight_storage(self) -> str:
        """How the matrices are stored: a weight dtype, after the quantized formats kept as stored
        ('float8_e4m3 block-scaled + bfloat16', 'int4 grouped + bfloat16')."""
        dtype = next(name for name, d in WEIGHT_DTYPES.items() if d == np.dtype(self.embed_tokens.dtype))
        kinds = sorted({w.dtype_name for lw in self.layers for w in vars(lw).values() if isinstance(w, QUANTIZED)})
        names = {"float8_e4m3": "float8_e4m3 block-scaled", "int4": "int4 grouped"}
        return " + ".join([names[k] for k in kinds] + [dtype])

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_host(cls, host_target, weight_dtype: str = "float32", *, precision: str = "bf16", gemm_tile=None):
        """Upload a ``NumpyTarget``, every matrix stored as ``weight_dtype`` ('float32',
        'float16' or 'bfloat16'); norm weights, the router and its bias stay float32.
        ``precision``: the GEMMs' (class docstring)."""
        return cls._upload(host_target.config, host_target.embed_tokens, host_target.norm, host_target.lm_head,
                           host_target.layers, weight_dtype, precision, gemm_tile)

    @classmethod
    def from_weights(cls, cfg: ModelConfig, weights: dict, weight_dtype: str = "float32", *,
                     precision: str = "bf16", gemm_tile=None):
        """Upload checkpoint weights by HF name (``read_checkpoint``): float32 matrices stored as
        ``weight_dtype``, fp8 ones (``BlockScaled``, ``read_checkpoint(keep_fp8=True)``) as they
        are, a byte a weight, multiplied by ``kernels.linear`` with their block scales."""
        w = dict(weights)
        layers = [_layer_weights(cfg, w, i) for i in range(cfg.num_hidden_layers)]
        embed = widened(w["model.embed_tokens.weight"])
        head = embed if cfg.tie_word_embeddings else w["lm_head.weight"]
        return cls._upload(cfg, embed, widened(w["model.norm.weight"]), head, layers, weight_dtype, precision,
                           gemm_tile)

    @classmethod
    def _upload(cls, cfg, embed_tokens, norm, lm_head, layers, weight_dtype, precision, gemm_tile):
        prefer_pdl_mode(cfg.hidden_size)          # before any kernel of the upload (__init__)
        dt = check_weight_dtype(weight_dtype)
        device_layers = device_layers_from_host(cfg, layers, dt)
        embed = cuda.to_device(to_storage(embed_tokens, dt))
        head = embed if cfg.tie_word_embeddings else device_matrix(lm_head, dt)
        norm = cuda.to_device(np.ascontiguousarray(norm, np.float32))
        return cls(cfg, embed, norm, head, device_layers, rope_tables(cfg), precision=precision, gemm_tile=gemm_tile)

    def new_cache(self, max_tokens: int) -> DeviceMLACache:
        """An empty device latent cache with room for ``max_tokens`` rows per layer."""
        return DeviceMLACache(self.config, max_tokens)

    def new_cache_pool(self, slots: int, max_tokens: int) -> DeviceCachePool:
        """``slots`` device latent caches of ``max_tokens`` rows in one pool (``.caches``): a batch
        of them gets its attention in one launch set (``forward_batch``)."""
        return DeviceCachePool(self.config, slots, max_tokens)

    def workspace(self, rows: int) -> Workspace:
        """The preallocated buffers for forwards of up to ``rows`` tokens (rounded up to a power
        of two), made on first use and kept. Kernels pick their tiles by these row counts."""
        size = 1 << (int(rows) - 1).bit_length()
        paths = tuple(lw.latent_path for lw in self.layers)
        key = (size, paths)          # (a layer's path decides which latent buffers exist)
        if key not in self._workspaces:
            self._workspaces[key] = new_workspace(self.config, size, paths)
        return self._workspaces[key]

    # -- the forward -----------------------------------------------------------------------
    def forward(self, ids, positions, cache: DeviceMLACache, parents=None, hidden_layer_ids=(),
                graph: bool = False, stream=0) -> ForwardOutput:
        """Run ``ids`` at ``positions`` after the cached rows and append their latent rows.

        ids [T] int32/int64, positions [T] int32/int64, parents [T] int32 or None (causal), as
        ``NumpyTarget.forward`` -> ``ForwardOutput`` (numpy logits [T, V], hidden [T, Y, M]).
        ``graph``: replay a CUDA graph of this workspace's forward (captured on first use)
        instead of launching every kernel from Python; same bits.
        """
        if not isinstance(cache, DeviceMLACache):
            raise ValueError(f"cache must be a DeviceMLACache from new_cache(), got {type(cache).__name__}")
        layers_out = check_forward_inputs(self.config, ids, positions, cache, parents, hidden_layer_ids)
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
        logits = ws.logits[:t].copy_to_host(stream=stream)
        if not np.isfinite(logits).all():
            # name the first non-finite layer: run the same forward again (same inputs in ws, same
            # cache rows rewritten with the same bits) keeping every layer's output; hidden holds
            # them but the last, which is final-normed there, and the residual stream ws.x still
            # holds the last layer's own output
            every_layer = tuple(range(self.config.num_hidden_layers))
            self.forward_device(ws, cache, every_layer, stream=stream)
            outputs = ws.hidden[:, :t].copy_to_host(stream=stream)          # [L, T, M]
            outputs[-1] = ws.x[:t].copy_to_host(stream=stream)
            bad = [i for i in every_layer if not np.isfinite(outputs[i]).all()]
            check_finite_output("target", "logits", logits, bad[0] if bad else None)
        cache.length += t
        if layers_out:
            hid = np.stack([ws.hidden[i][:t].copy_to_host(stream=stream) for i in layers_out], axis=1)
        else:
            hid = np.zeros((t, 0, self.config.hidden_size), np.float32)
        return ForwardOutput(logits=logits, hidden=hid)

    def forward_batch(self, segments: list[Segment], hidden_layer_ids=(), graph: bool = False) -> BatchForward:
        """One forward over several sequences' rows, as ``NumpyTarget.forward_batch``: ``forward``
        of each ``Segment`` (its ids, positions, own ``DeviceMLACache`` and parents), the
        embedding, projections, norms, MoE and lm_head launched once over all rows (the expert
        weights read once for every sequence), the cache writes and the attention once per
        sequence over its own rows, cache and tree (``layer_stages(batch=)``: the block-diagonal
        visibility). Each sequence's logits, hidden states and cache rows are bit for bit those of
        its own ``forward`` (every kernel's arithmetic of a row is independent of the other rows).
        ``graph``: replay a CUDA graph of this layout (segment sizes, caches, hidden layers),
        captured on first use; the cache lengths are read on the device, so they may change.
        -> ``BatchForward``: an output per segment, in order, and the distinct routed experts the
        router picked in each layer over all rows (0 for a dense layer)."""
        cfg = self.config
        launch = self.enqueue_batch(segments, hidden_layer_ids, graph=graph)
        ws, t, rows = launch.ws, launch.rows[-1], launch.rows
        logits = ws.logits[:t].copy_to_host()                                 # [T, V]
        check_finite_output("target", "logits", logits, None)
        for seg, n in zip(segments, np.diff(rows)):
            seg.cache.length += int(n)
        unique = unique_experts(cfg, launch.offsets.copy_to_host())
        if launch.hidden_layer_ids:
            hid = np.stack([ws.hidden[i][:t].copy_to_host() for i in launch.hidden_layer_ids], axis=1)  # [T, Y, M]
        else:
            hid = np.zeros((t, 0, cfg.hidden_size), np.float32)
        outputs = [ForwardOutput(logits=logits[rows[j]:rows[j + 1]], hidden=hid[rows[j]:rows[j + 1]])
                   for j in range(len(segments))]
        return BatchForward(outputs=outputs, unique_experts=unique)

    def enqueue_batch(self, segments: list[Segment], hidden_layer_ids=(), graph: bool = False,
                      stream=0) -> "BatchLaunch":
        """``forward_batch`` up to its readback: checks the segments, uploads their inputs and
        enqueues the forward (or replays its graph) on ``stream``; no sync, the caches' lengths
        not advanced. -> ``BatchLaunch`` (where the results are; benchmarks time this)."""
        cfg = self.config
        layers_out = tuple(check_segments(cfg, segments, DeviceMLACache, hidden_layer_ids))
        if graph and numba_config.ENABLE_CUDASIM:
            raise ValueError("graph=True needs a real GPU: the CUDA simulator cannot capture graphs")
        sizes = [seg.ids.shape[0] for seg in segments]
        rows = np.cumsum([0] + sizes)                                         # segment j: rows[j] .. rows[j+1]
        t = int(rows[-1])
        ws = self.workspace(t)
        pad = lambda parts: np.concatenate(parts + [np.zeros(ws.rows - t, np.int32)]).astype(np.int32)  # noqa: E731
        ws.ids.copy_to_device(pad([np.asarray(seg.ids, np.int32) for seg in segments]), stream=stream)
        ws.positions.copy_to_device(pad([np.asarray(seg.positions, np.int32) for seg in segments]), stream=stream)
        chains = [np.arange(-1, n - 1, dtype=np.int32) if seg.parents is None else np.asarray(seg.parents, np.int32)
                  for seg, n in zip(segments, sizes)]
        ws.parents.copy_to_device(pad(chains), stream=stream)                 # each tree over its own rows
        ws.meta.copy_to_device(np.array([0, t], np.int32), stream=stream)     # the row-wise stages: t rows
        self._size_scratch(ws, max(seg.cache.capacity for seg in segments))
        key = ("batch", tuple(sizes), tuple(id(seg.cache) for seg in segments), layers_out)
        launch = ws.graphs.get(key) if graph else None
        pool = segments[0].cache.pool
        pool = pool if all(seg.cache.pool is pool for seg in segments) else None
        if launch is None:
            # each sequence: a row view of ws whose meta is its row of ``seqs`` (cache length, rows)
            seqs = cuda.device_array((len(segments), 4), np.int32)
            parts = [(_row_view(ws, int(rows[j]), sizes[j], seqs[j, 0:2]), seg.cache) for j, seg in enumerate(segments)]
            offsets = cuda.device_array((cfg.num_hidden_layers, (cfg.n_routed_experts or 0) + 1), np.int32)
            launch = BatchLaunch(ws, rows, layers_out, parts, seqs, pool, offsets, max(sizes))
        launch.seqs.copy_to_device(np.array([[seg.cache.length, n, r0, seg.cache.slot]
                                             for seg, n, r0 in zip(segments, sizes, rows)], np.int32), stream=stream)
        if not graph:
            self._enqueue_forward(ws, None, layers_out, stream, launch)
            return launch
        if launch.graph is None:
            # the graph holds the caches' pointers and the key their ids: the launch keeps them alive
            launch.graph = capture_graph(lambda s: self._enqueue_forward(ws, None, layers_out, s, launch))
            ws.graphs[key] = launch
        replay_graph(launch.graph, stream)
        return launch

    def pooled_launch(self, ws: Workspace, pool: DeviceCachePool, seqs, max_rows: int,
                      hidden_layer_ids=()) -> BatchLaunch:
        """A batched forward whose layout lives on the device, for a decode loop that builds it
        there (``decode.device_batch``): every slot of ``pool`` a sequence, ``seqs`` [slots, 4]
        int32 device = (cache length, t, first row, slot) a sequence, written before each forward
        (t = 0: a sequence with no rows this time), ``ws.meta`` = (0, the rows of all of them) and
        ws's ids, positions and parents (each tree's numbered within it) likewise; ``max_rows``
        bounds every t. Allocates the attention scratch and the expert counts now; enqueue it with
        ``forward_pooled``."""
        layers_out = tuple(check_int("hidden_layer_ids entry", i, 0, self.config.num_hidden_layers - 1)
                           for i in hidden_layer_ids)
        check_int("max_rows", max_rows, 1, ws.rows)
        self._size_scratch(ws, pool.c_kv.shape[2])
        offsets = cuda.device_array((self.config.num_hidden_layers, (self.config.n_routed_experts or 0) + 1), np.int32)
        return BatchLaunch(ws, None, layers_out, [], seqs, pool, offsets, int(max_rows))

    def forward_pooled(self, launch: BatchLaunch, stream=0) -> None:
        """Enqueue the forward of a ``pooled_launch`` (no sync, no allocation: capturable): the
        logits and hidden states in ``launch.ws``, each sequence's new latent rows written into its
        slot at its cache length; each sequence's bits are those of its own forward. The caller
        keeps the caches' lengths."""
        self._enqueue_forward(launch.ws, None, launch.hidden_layer_ids, stream, launch)

    def _size_scratch(self, ws: Workspace, capacity: int) -> None:
        """The attention's scratch: scores of every (row, head) over a cache of ``capacity`` rows;
        made again only for a larger cache."""
        if ws.mla_scratch is None or ws.mla_scratch.scores.shape[1] < capacity:
            ws.mla_scratch = kn.MLAScratch(ws.rows, self.config.num_attention_heads, capacity,
                                           self.config.kv_lora_rank)
            for entry in ws.graphs.values():                           # they point at the old one
                destroy_graph(entry.graph if isinstance(entry, BatchLaunch) else entry[0])
            ws.graphs.clear()

    def forward_device(self, ws: Workspace, cache: DeviceMLACache, hidden_layer_ids=(), graph=False,
                       stream=0) -> None:
        """Enqueue one forward with inputs already in ``ws`` (ids, positions, parents, meta =
        (cache.length, t)): fills ``ws.logits[:t]`` and ``ws.hidden[l, :t]`` for the requested
        layers and writes the new latent rows at ``cache.length + [0, t)``. Does not advance
        ``cache.length`` (the caller knows t)."""
        self._size_scratch(ws, cache.capacity)
        if not graph:
            self._enqueue_forward(ws, cache, hidden_layer_ids, stream)
            return
        if numba_config.ENABLE_CUDASIM:
            raise ValueError("graph=True needs a real GPU: the CUDA simulator cannot capture graphs")
        key = (id(cache), tuple(hidden_layer_ids))
        entry = ws.graphs.get(key)
        if entry is None:
            exe = capture_graph(lambda s: self._enqueue_forward(ws, cache, hidden_layer_ids, s))
            # the graph holds the cache's raw pointers, and the key its id: keeping the cache
            # alive keeps both valid (a freed cache's id may be reused by a new one)
            entry = ws.graphs[key] = (exe, cache)
        replay_graph(entry[0], stream)

    def _enqueue_forward(self, ws: Workspace, cache: DeviceMLACache | None, hidden_layer_ids, stream,
                         batch: BatchLaunch | None = None) -> None:
        """One forward over ws's rows into ``cache``, or for a batch (``batch``, its ``BatchLaunch``)
        over its parts, each MoE layer's counting sort writing its offsets straight into its row
        of ``batch.offsets`` (``forward_batch``'s expert counts; no copy node in the graph)."""
        parts = [(ws, cache)] if batch is None else batch.parts
        if batch is not None and batch.pool is not None:          # every sequence's tree in one launch
            kn.enqueue_visibility_bits(ws.parents, ws.vis_bits, seqs=batch.seqs, stream=stream)
        else:
            for p, _ in parts:
                kn.enqueue_visibility_bits(p.parents, p.vis_bits, stream=stream)    # ancestor bits of its new rows
        kn.enqueue_embedding(ws.ids, self.embed_tokens, ws.x, ws.n_rows, stream=stream)
        last = len(self.layers) - 1
        for i in range(len(self.layers)):
            for _, enqueue in self.layer_stages(ws, cache, i, batch=batch):
                enqueue(stream)
            if i in hidden_layer_ids and i != last:
                ws.hidden[i].copy_to_device(ws.x, stream=stream)
        # the last layer's feature is the final-normed state: normed straight into it, and lm_head
        # reads it there
        normed = ws.hidden[last] if last in hidden_layer_ids else ws.normed
        kn.enqueue_rms_norm(ws.x, self.norm, self.config.rms_norm_eps, normed, ws.n_rows, stream=stream)
        kn.enqueue_linear(normed, self.lm_head, ws.logits, ws.n_rows, **self.gemm_args, stream=stream)

    def layer_stages(self, ws: Workspace, cache: DeviceMLACache | None, i: int, batch: BatchLaunch | None = None):
        """Decoder layer i over ws.x in place, as its named stages: a list of (name, enqueue)
        where ``enqueue(stream)`` launches that stage's kernels. The forward runs them in order;
        a benchmark can put events between them (benchmarks/verify_forward.py).

        ``batch``: a batch of sequences (``forward_batch``'s ``BatchLaunch``; ``cache`` unused):
        the stages that write a cache run once per part (a row view of ws and its own cache), the
        others once over all of ws's rows. The attention runs once per part too. When every cache
        is a slot of one pool, one launch serves every sequence instead: the cache writes through
        ``kernels.PoolRows`` (each row to its slot's row), the attention through the MLA kernels'
        sequence table. None: the one part (ws, cache)."""
        cfg, lw = self.config, self.layers[i]
        H, D, R, C = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
        eps, n, gemm = cfg.rms_norm_eps, ws.n_rows, self.gemm_args
        parts = [(ws, cache)] if batch is None else batch.parts
        # where the new latent and rope-key rows go: (rows, c_kv rows, k_pe rows, destination row
        # rule) a launch; a pooled batch writes every sequence's rows into its slot in one launch
        if batch is not None and batch.pool is not None:
            pool, cap = batch.pool, batch.pool.c_kv.shape[2]
            rows = kn.PoolRows(batch.seqs, cfg.num_hidden_layers * cap, i * cap)
            writes = [(ws, pool.c_kv_rows, pool.k_pe_rows, rows)]
        else:
            writes = [(p, cache.c_kv[i], cache.k_pe[i], p.s0) for p, cache in parts]
        rope = dict(interleave=cfg.rope_interleave, attention_factor=self.rope.attention_factor)

        path = lw.latent_path
        def input_norm(s):
            kn.enqueue_rms_norm(ws.x, lw.input_layernorm, eps, ws.normed, n, stream=s)

        fused = path == "qkv_a"                                     # q_a and kv_a in one GEMM
        # where a part's query and its kv latent + rope key are: the kv at column kv_col of kv_of(p)
        q_of = (lambda p: p.q_kv) if path == "q_kv" else (lambda p: p.q)            # noqa: E731
        kv_of = {"qkv_a": lambda p: p.qkv_a, "q_kv": lambda p: p.q_kv, "apart": lambda p: p.kv}[path]
        top = {"qkv_a": lw.q_a_proj, "q_kv": lw.q_proj}.get(path)     # the matrix stacked over kv_a's
        kv_col = 0 if top is None else top.shape[0]

        def q_projection(s):
            if path == "q_kv":
                kn.enqueue_linear(ws.normed, lw.q_kv_proj, ws.q_kv, n, **gemm, stream=s)
            elif lw.q_proj is not None:
                kn.enqueue_linear(ws.normed, lw.q_proj, ws.q, n, **gemm, stream=s)
            elif fused:
                kn.enqueue_linear(ws.normed, lw.qkv_a_proj, ws.qkv_a, n, **gemm, stream=s)
                # both latents' norms in one launch: q_a's, and the kv latent's straight into cache row s0 + r
                for p, c_kv, _, row0 in writes:
                    kn.enqueue_rms_norm(p.qkv_a, lw.q_a_layernorm, eps, p.q_a_normed, p.n_rows,
                                        second=(lw.kv_a_layernorm, c_kv, kv_col, row0), stream=s)
                kn.enqueue_linear(ws.q_a_normed, lw.q_b_proj, ws.q, n, **gemm, stream=s)
            else:
                kn.enqueue_linear(ws.normed, lw.q_a_proj, ws.q_a, n, **gemm, stream=s)
                kn.enqueue_rms_norm(ws.q_a, lw.q_a_layernorm, eps, ws.q_a_normed, n, stream=s)
                kn.enqueue_linear(ws.q_a_normed, lw.q_b_proj, ws.q, n, **gemm, stream=s)

        def kv_a_projection(s):
            if path == "apart":             # else done with the query above
                kn.enqueue_linear(ws.normed, lw.kv_a_proj_with_mqa, ws.kv, n, **gemm, stream=s)

        def latent_norm_rope(s):
            # the latent's norm (qkv_a: done above) and the rotated rope key go straight into cache row s0 + r
            for p, c_kv, k_pe, row0 in writes:
                if not fused:
                    kn.enqueue_rms_norm(kv_of(p), lw.kv_a_layernorm, eps, c_kv, p.n_rows, src_col0=kv_col,
                                        out_row0=row0, stream=s)
                # both rotations in one launch: the rope key into the cache, every head's rope query
                kn.enqueue_rope(kv_of(p), k_pe, p.positions, self.inv_freq, p.n_rows,
                                rdim=R, src_col0=kv_col + C, dst_row0=row0, stream=s, **rope,
                                second=dict(src=q_of(p), dst=p.q_pe, groups=H, src_col0=D, src_stride=D + R,
                                            dst_stride=R))

        def query_absorption(s):
            kn.enqueue_linear_heads(q_of(ws), D + R, lw.w_uk_t, ws.q_lat, n, **gemm, stream=s)

        def attention(s):
            if batch is not None and batch.pool is not None:       # every sequence in one launch set
                kn.enqueue_mla_attention(ws.q_lat, ws.q_pe, batch.pool.c_kv[:, i], batch.pool.k_pe[:, i], ws.o_lat,
                                         vis_bits=ws.vis_bits, meta=ws.meta, scale=self.rope.scale,
                                         scratch=ws.mla_scratch, seqs=batch.seqs,
                                         max_rows=batch.max_rows, precision=self.precision,
                                         stream=s)
                return
            for p, cache in parts:                  # a sequence sees its own cache and its own tree only
                kn.enqueue_mla_attention(p.q_lat, p.q_pe, cache.c_kv[i], cache.k_pe[i], p.o_lat, vis_bits=p.vis_bits,
                                         meta=p.meta, scale=self.rope.scale, scratch=ws.mla_scratch,
                                         precision=self.precision, stream=s)

        def output_absorption(s):
            kn.enqueue_linear_heads(ws.o_lat, C, lw.w_uv, ws.o, n, **gemm, stream=s)

        def o_proj(s):
            kn.enqueue_linear(ws.o, lw.o_proj, ws.x, n, accumulate=True, **gemm, stream=s)

        def post_attention_norm(s):
            kn.enqueue_rms_norm(ws.x, lw.post_attention_layernorm, eps, ws.normed, n, stream=s)

        def moe(s):
            kn.enqueue_moe_block(
                ws.normed, ws.x, gate=lw.gate, bias=lw.e_score_correction_bias,
                experts_gate=lw.experts_gate_proj, experts_up=lw.experts_up_proj,
                experts_down=lw.experts_down_proj, shared_gate=lw.shared_gate_proj,
                shared_up=lw.shared_up_proj, shared_down=lw.shared_down_proj, route=self._route,
                bufs=ws.moe, n_rows=n, offsets=None if batch is None else batch.offsets[i], **gemm, stream=s)

        def dense_mlp(s):
            kn.enqueue_swiglu_mlp(ws.normed, lw.mlp_gate_proj, lw.mlp_up_proj, lw.mlp_down_proj, ws.x,
                                  act=ws.act, n_rows=n, accumulate=True, **gemm, stream=s)

        # attention: x += o_proj(MLA(rms_norm(x))); feed-forward: x += FFN(rms_norm(x))
        return [("input norm", input_norm), ("q projection", q_projection),
                ("kv_a projection", kv_a_projection), ("latent norm + rope (cache append)", latent_norm_rope),
                ("query absorption (W_uk)", query_absorption), ("MLA attention", attention),
                ("output absorption (W_uv)", output_absorption), ("o_proj + residual", o_proj),
                ("post-attention norm", post_attention_norm),
                ("MoE (route, sort, experts, shared, combine)", moe) if lw.is_moe else ("dense MLP", dense_mlp)]
