"""The DFlash drafter on the GPU: device weights, a device context cache, preallocated draft
buffers, and a device-level draft for the GPU-resident decode loop. Twin: ``model.drafter.NumpyDrafter``
(same API, same results within float32 rounding).

Shapes: n new context rows (at most Nf, the rows of the features buffer), S_cap cache capacity,
B block rows, M hidden size, Y target layers read, Hq / Hkv query / key-value heads, Dh head
dim, I MLP width, V vocab (the target's), L drafter layers.

Every stage is a kernel of ``ddtree_numba.kernels`` enqueued through its device tier
(``enqueue_*``: GEMMs under the reduction contract of ``kernels.linear``, RMSNorm, the embedding
gather, GQA attention). A layer is 8 launches: the block rows' input norm into xin's first rows
and one GEMM for the q | k | v of the block rows and the new context rows together
(``enqueue_linear``'s ``norm_head``), one launch for the per-head q_norm / k_norm and the
rotate-half RoPE that also appends the context keys and values to the cache
(``enqueue_qkv_norm_rope``), attention (1: its key splits merged by their last block), o_proj,
the post norm and the SwiGLU (3, ``enqueue_swiglu_mlp``'s ``norm``). Sizes that change between drafts
(cache length s0, new context rows n, the bonus token) are read on the device:
``_draft_meta_kernel`` (glue, below) turns them into block ids and the live row counts of
``Workspace.meta`` at the start of every draft, and advances the cache length, so a draft
allocates nothing, syncs nothing, and can be captured once as a CUDA graph and replayed.

**Weights.** Matrices are stored as the drafter checkpoint stores them when every matrix has
one 16-bit dtype (bf16 or fp16; ``load_drafter``), else float32, and widened to float32 in
registers; norms are float32. The embedding and lm_head are the target's device arrays
(any weight dtype). The context cache holds float32 keys (after rope) and values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numba import config as numba_config
from numba import cuda

from .. import kernels as kn
from .._checks import check_array, check_int
from .._device import SideStream, cached, capture_graph, ceil_div, grid_dependency_after, is_device, replay_graph
from ..dtypes import check_weight_dtype, to_storage
from ..kernels.rms_norm import MAX_HEAD_DIM
from .drafter import DrafterConfig, NumpyDrafter
from .target import check_finite_output

META_THREADS = 8 if numba_config.ENABLE_CUDASIM else 128    # the draft-meta kernel's block


# -- glue: the sizes of one draft, from device values ----------------------------------------

@cached
@cuda.jit
def _draft_meta_kernel(status, n_in, bonus, capacity, n_cap, mask_id, write_block, depths, ids, meta):
    """The drafter's per-draft sizes, from device values only (a captured graph replays it).

    status [2] int32 = (cache length s0, overflow flag), n_in [1] int32 = n new context rows
    (0 <= n <= n_cap, s0 + n <= capacity, else n is taken as 0 and status[1] set to 1), bonus
    [1] int32, depths D (1 <= D <= B - 1: the rows lm_head computes). Writes ids [B] = (bonus,
    mask_id, ...) if ``write_block``, meta [6] = (s0, n, s0 + n, B, D, B + n) and advances
    status[0] to s0 + n. One block.
    """
    grid_dependency_after((status, n_in, bonus, capacity, n_cap, mask_id, write_block, depths, ids, meta))   # PDL (_device.py)
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    s0 = status[0]
    n = n_in[0]
    ok = n >= 0 and n <= n_cap and s0 + n <= capacity
    if not ok:
        n = 0
    nb = ids.shape[0]
    if write_block:
        for j in range(tid, nb, nt):
            ids[j] = bonus[0] if j == 0 else mask_id
    cuda.syncthreads()  # every thread has read status[0] before it moves
    if tid == 0:
        meta[0] = s0
        meta[1] = n
        meta[2] = s0 + n
        meta[3] = nb
        meta[4] = depths
        meta[5] = nb + n
        status[0] = s0 + n
        if not ok:
            status[1] = 1


@cached
@cuda.jit
def _draft_batch_meta_kernel(status, n_in, bonus, capacity, n_cap, mask_id, depths, ids, seq_meta, att, meta):
    """The sizes of S drafts in one forward (``CudaDrafter.draft_batch_device``), from device
    values. status [S, 2] int32 = (cache length s0, overflow flag) a sequence, n_in [S] int32 its
    new context rows n, bonus [S] int32. Its context rows sit at c0 = the sum of n_in of the
    sequences before it (as the producer packed them); they are taken if 0 <= n, c0 + n <= n_cap
    (they lie inside the features) and s0 + n <= capacity, else n is taken as 0 and its overflow
    flag set. depths D (1 <= D <= B - 1): the rows a sequence's lm_head computes. Writes ids [S B]
    (each block: bonus, mask_id, ...), seq_meta [S, 4] = (s0, n, c0, B), att [S, 2] = (s0 + n, B),
    meta [6] = (0, the rows after the last sequence's, at most n_cap, _, S B, S D, S B + those
    rows), and advances each s0 by its n. One block."""
    grid_dependency_after((status, n_in, bonus, capacity, n_cap, mask_id, depths, ids, seq_meta, att, meta))
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    S = status.shape[0]
    nb = ids.shape[0] // S
    for e in range(tid, S * nb, nt):
        z = e // nb
        ids[e] = bonus[z] if e == z * nb else mask_id
    if tid == 0:                # (only thread 0 reads or writes status: no barrier needed)
        c0 = 0
        for z in range(S):
            s0 = status[z, 0]
            n = n_in[z]
            ok = n >= 0 and c0 + n <= n_cap and s0 + n <= capacity
            seq_meta[z, 0] = s0
            seq_meta[z, 1] = n if ok else 0
            seq_meta[z, 2] = c0
            seq_meta[z, 3] = nb
            att[z, 0] = s0 + (n if ok else 0)
            att[z, 1] = nb
            if ok:
                status[z, 0] = s0 + n
            else:
                status[z, 1] = 1
            c0 += max(n, 0)
        c0 = min(c0, n_cap)     # (rows past the features: their sequences' n was taken as 0)
        meta[0] = 0
        meta[1] = c0
        meta[2] = 0
        meta[3] = S * nb
        meta[4] = S * depths
        meta[5] = S * nb + c0


@cached
@cuda.jit
def _block_tails_kernel(x, nb, depths, tail):
    """tail[z D + j - 1] = x[z B + j] for j = 1 .. D (D = depths <= B - 1): every block's first D
    rows after its bonus (the positions whose logits a draft gives), packed for one lm_head
    launch; tail's rows past S D are left as they are."""
    grid_dependency_after((x, nb, depths, tail))   # PDL: nothing before it touches global memory (_device.py)
    r, c = cuda.grid(2)
    if r < (x.shape[0] // nb) * depths and r < tail.shape[0] and c < tail.shape[1]:
        z = r // depths
        tail[r, c] = x[z * nb + 1 + r - z * depths, c]


@dataclass
class DeviceDrafterLayer:
    """One drafter layer's device weights: matrices [out, in] in the storage dtype, norms f32.
    q_proj, k_proj and v_proj are stacked into one matrix (one GEMM gives a row's q | k | v);
    the three fields are its row views, so nothing is stored twice."""

    input_layernorm: object             # [M] f32
    post_attention_layernorm: object    # [M] f32
    qkv_proj: object                    # [(Hq + 2 Hkv)*Dh, M]
    q_proj: object                      # [Hq*Dh, M]   rows of qkv_proj
    k_proj: object                      # [Hkv*Dh, M]  rows of qkv_proj
    v_proj: object                      # [Hkv*Dh, M]  rows of qkv_proj
    o_proj: object                      # [M, Hq*Dh]
    q_norm: object                      # [Dh] f32
    k_norm: object                      # [Dh] f32
    gate_proj: object                   # [I, M]
    up_proj: object                     # [I, M]
    down_proj: object                   # [M, I]


class DeviceDrafterCache:
    """The drafter's context cache on the device: per layer, the rotated keys and the values of
    every context row; rows ``[0, length)`` are live.

    k, v [L, S_cap, Hkv*Dh] float32; ``status`` [2] int32 device = (length, overflow flag). The
    length lives on the device because a device draft advances it by a device count n;
    ``length`` reads it back (a sync), ``truncate`` writes it.
    """

    def __init__(self, cfg: DrafterConfig, capacity: int):
        capacity = check_int("max_tokens", capacity, 1)
        self.capacity = capacity
        width = cfg.num_key_value_heads * cfg.head_dim
        self.k = cuda.device_array((cfg.num_hidden_layers, capacity, width), np.float32)  # [L, S, Hkv*Dh]
        self.v = cuda.device_array((cfg.num_hidden_layers, capacity, width), np.float32)  # [L, S, Hkv*Dh]
        self.status = cuda.to_device(np.zeros(2, np.int32))                              # (length, overflow)
        self._empty = cuda.to_device(np.zeros(2, np.int32))                              # enqueue_reset's source

    @property
    def length(self) -> int:
        return int(self.status.copy_to_host()[0])

    def __len__(self) -> int:
        return self.length

    @property
    def overflowed(self) -> bool:
        """True once a device draft asked for more context rows than fit (they were dropped)."""
        return bool(self.status.copy_to_host()[1])

    def truncate(self, length: int) -> None:
        length = check_int("length", length, 0, self.length)
        self.status[0:1].copy_to_device(np.array([length], np.int32))

    def reset(self) -> None:
        self.status.copy_to_device(np.zeros(2, np.int32))

    def enqueue_reset(self, stream=0) -> None:
        """``reset`` as a device-to-device copy on ``stream``: no sync, capturable."""
        self.status.copy_to_device(self._empty, stream=stream)


class DeviceDrafterPool:
    """The context caches of ``slots`` sequences for drafts of all of them in one forward
    (``CudaDrafter.draft_batch_device``): k, v [L, slots, S_cap, Hkv*Dh] float32 (a layer's
    slots contiguous: the batched attention reads k[i] as [slots, S_cap, W]), status [slots, 2]
    int32 device = (length, overflow flag) a slot."""

    def __init__(self, cfg: DrafterConfig, slots: int, capacity: int):
        slots = check_int("slots", slots, 1)
        capacity = check_int("max_tokens", capacity, 1)
        self.slots, self.capacity = slots, capacity
        width = cfg.num_key_value_heads * cfg.head_dim
        self.k = cuda.device_array((cfg.num_hidden_layers, slots, capacity, width), np.float32)
        self.v = cuda.device_array((cfg.num_hidden_layers, slots, capacity, width), np.float32)
        self.status = cuda.to_device(np.zeros((slots, 2), np.int32))
        self._empty = cuda.to_device(np.zeros((slots, 2), np.int32))    # enqueue_reset's source

    @property
    def lengths(self) -> np.ndarray:
        """[slots] int32: each slot's context rows (a sync)."""
        return self.status.copy_to_host()[:, 0]

    @property
    def overflowed(self) -> np.ndarray:
        """[slots] bool: a draft asked for more context rows than fit in that slot (dropped)."""
        return self.status.copy_to_host()[:, 1].astype(bool)

    def reset(self) -> None:
        self.status.copy_to_device(np.zeros(self.status.shape, np.int32))

    def enqueue_reset(self, stream=0) -> None:
        """``reset`` as a device-to-device copy on ``stream``: no sync, capturable."""
        self.status.copy_to_device(self._empty, stream=stream)


def _first_rows(buf, n: int):
    """buf's first n rows: the buffer itself when that is all of it (a draft of every depth returns
    its workspace's logits, as before depths existed), else a view."""
    return buf if n == buf.shape[0] else buf[:n]


@dataclass
class BatchDrafterWorkspace:
    """Every device buffer S drafts in one forward need (``draft_batch_device``): block rows S B
    (sequence z's at [z B, (z + 1) B)), up to ``rows`` new context rows of all of them packed
    after them in ``xin`` / ``qkv``; written on the device by ``_draft_batch_meta_kernel``:
    ``meta`` (its one-element slices the kernels' row counts, as ``DrafterWorkspace``'s),
    ``seq_meta`` [S, 4] (s0, n, c0, B) and ``att`` [S, 2] (s0 + n, B) a sequence."""

    sequences: int
    rows: int
    block: int
    meta: object                # [6] int32 (0, n all, _, S B, S D, S B + n all): D the depths drafted
    seq_meta: object            # [S, 4] int32
    att: object                 # [S, 2] int32
    ids: object                 # [S B] int32
    ctx_raw: object             # [rows, M]
    xin: object                 # [S B + rows, M]: the blocks' normed rows, then
                                #   hidden_norm(fc(features)) of the context rows
    qkv: object                 # [S B + rows, (Hq + 2 Hkv)*Dh]
    x: object                   # [S B, M]
    h: object                   # [S B, M]
    o: object                   # [S B, Hq*Dh]
    act: object                 # [S B, I]
    tail: object                # [S (B - 1), M] every block's first D rows after its bonus, packed
    tail_h: object              # [S (B - 1), M] their final norm (lm_head's input)
    logits: object              # [S (B - 1), V]: sequence z's D rows at [z D, (z + 1) D)
    scratch: object             # GQAScratch for S B queries, S_cap + B keys a sequence

    def __post_init__(self):
        self.n_ctx = self.meta[1:2]
        self.n_blk = self.meta[3:4]
        self.n_logits = self.meta[4:5]
        self.n_xin = self.meta[5:6]
        self.ctx = self.xin[self.sequences * self.block:]


@dataclass
class DrafterWorkspace:
    """Every device buffer one draft needs, for up to ``rows`` new context rows and ``block``
    block rows; a draft allocates nothing.

    ``meta`` (written on the device by ``_draft_meta_kernel``) = (s0, n, s0 + n, B, D, B + n), D
    the depths drafted (B - 1 unless a draft asks for fewer): its one-element slices are the live
    row counts of the kernels.

    A layer's attention input is one buffer, ``xin`` = [the block's normed rows; the new
    context rows], so that one GEMM projects both (``qkv``): the block rows need q, k and v,
    the context rows k and v for the cache (their q is computed and ignored).
    """

    rows: int
    block: int
    meta: object                # [6] int32
    n_in: object                # [1] int32 n, written by the host API
    bonus_in: object            # [1] int32 bonus, written by the host API
    ids: object                 # [B] int32 block token ids
    feat: object                # [Nf, Y*M] features of the host API (the device API reads the caller's)
    ctx_raw: object             # [Nf, M] fc(features)
    xin: object                 # [B + Nf, M] input_layernorm(x), then hidden_norm(fc(features))
    qkv: object                 # [B + Nf, (Hq + 2 Hkv)*Dh] xin @ qkv_proj (block q, k normed and rotated in place)
    x: object                   # [B, M] residual stream
    h: object                   # [B, M] normed input of the MLP; the final hidden at the end of a
                                # forward (a draft's final norm covers only h_tail = h[1:])
    o: object                   # [B, Hq*Dh] attention output
    act: object                 # [B, I] SwiGLU activation
    logits: object              # [B-1, V] logits of the positions after the bonus
    scratch: object = None      # GQAScratch for B queries and S_cap + B keys (shared, sized by the cache)
    graphs: dict = field(default_factory=dict)   # (features, n, bonus, cache) ids -> CUDA graph exec

    def __post_init__(self):
        self.n_ctx = self.meta[1:2]           # n
        self.att_meta = self.meta[2:4]        # (s0 + n, B): the attention's (s, t)
        self.n_blk = self.meta[3:4]           # B
        self.n_logits = self.meta[4:5]        # D: lm_head's rows (B - 1 by default)
        self.n_xin = self.meta[5:6]           # B + n: the live rows of xin and qkv
        self.h_tail = self.h[1:]              # [B-1, M] the positions after the bonus
        self.x_tail = self.x[1:]
        b = self.block
        self.ctx = self.xin[b:]               # [Nf, M] hidden_norm(fc(features))


def new_drafter_workspace(cfg: DrafterConfig, vocab: int, rows: int, block: int) -> DrafterWorkspace:
    M, Dh = cfg.hidden_size, cfg.head_dim
    Hq, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    Y = len(cfg.target_layer_ids)
    f32 = lambda *shape: cuda.device_array(shape, np.float32)  # noqa: E731
    i32 = lambda n: cuda.to_device(np.zeros(n, np.int32))      # noqa: E731
    return DrafterWorkspace(
        rows=rows, block=block, meta=i32(6), n_in=i32(1), bonus_in=i32(1), ids=i32(block),
        feat=f32(rows, Y * M), ctx_raw=f32(rows, M), xin=f32(block + rows, M),
        qkv=f32(block + rows, (Hq + 2 * Hkv) * Dh), x=f32(block, M), h=f32(block, M),
        o=f32(block, Hq * Dh), act=f32(block, cfg.intermediate_size),
        logits=f32(max(1, block - 1), vocab))


class CudaDrafter:
    """A DFlash drafter whose forward runs on the GPU, bound to a ``CudaTarget`` (whose device
    embedding and lm_head it uses). ``forward`` / ``draft`` have the ``NumpyDrafter``'s
    arguments and results (numpy out); ``draft_device`` keeps everything on the device."""

    backend = "cuda"
    capturable = True       # draft_device allocates and syncs nothing after its first call
    partial_depths = True   # draft_device / draft_batch_device take depths (lm_head over fewer rows)

    def __init__(self, cfg: DrafterConfig, weights: dict[str, np.ndarray], target,
                 weight_dtype: str = "float32"):
        if getattr(target, "backend", None) != "cuda":
            raise ValueError(f"CudaDrafter needs a cuda-backend target, got backend "
                             f"{getattr(target, 'backend', None)!r}")
        dt = check_weight_dtype(weight_dtype)
        host = NumpyDrafter(cfg, weights, target)   # the twin's checks (shapes, target fit); float32 views
        mat = lambda name: cuda.to_device(to_storage(host.w[name], dt))                # noqa: E731
        vec = lambda name: cuda.to_device(np.ascontiguousarray(host.w[name], np.float32))  # noqa: E731
        self.config = cfg
        self.target = target
        self.weight_dtype = weight_dtype
        self.fc = mat("fc.weight")                        # [M, Y*M]
        self.hidden_norm = vec("hidden_norm.weight")      # [M] f32
        self.norm = vec("norm.weight")                    # [M] f32
        self.layers = []
        nq, nk = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        if cfg.head_dim > MAX_HEAD_DIM:
            raise ValueError(f"drafter head_dim {cfg.head_dim} exceeds the cuda backend's "
                             f"{MAX_HEAD_DIM} (the fused q / k norm stages a head in shared memory)")
        for i in range(cfg.num_hidden_layers):
            p, a = f"layers.{i}.", f"layers.{i}.self_attn."
            qkv = cuda.to_device(to_storage(np.concatenate(
                [host.w[a + f"{x}_proj.weight"] for x in "qkv"]), dt))     # [(Hq + 2 Hkv)*Dh, M]
            self.layers.append(DeviceDrafterLayer(
                input_layernorm=vec(p + "input_layernorm.weight"),
                post_attention_layernorm=vec(p + "post_attention_layernorm.weight"),
                qkv_proj=qkv, q_proj=qkv[:nq], k_proj=qkv[nq:nq + nk], v_proj=qkv[nq + nk:],
                o_proj=mat(a + "o_proj.weight"),
                q_norm=vec(a + "q_norm.weight"), k_norm=vec(a + "k_norm.weight"),
                gate_proj=mat(p + "mlp.gate_proj.weight"), up_proj=mat(p + "mlp.up_proj.weight"),
                down_proj=mat(p + "mlp.down_proj.weight")))
        self.inv_freq = cuda.to_device(np.ascontiguousarray(host.inv_freq, np.float64))   # [Dh/2]
        self._workspaces: dict[tuple[int, int], DrafterWorkspace] = {}
        self._scratch: dict[int, kn.GQAScratch] = {}      # block rows -> attention scratch
        self._zero_arrays: dict[tuple, object] = {}       # shape -> device int32 zeros (copy sources)
        self._context_side = SideStream()                 # the context rows' fc + norm (_enqueue_inputs)

    def __repr__(self) -> str:
        return f"CudaDrafter({self.config.describe()}, {self.weight_dtype} weights)"

    block_size = property(lambda self: self.config.block_size)
    target_layer_ids = property(lambda self: self.config.target_layer_ids)
    mask_token_id = property(lambda self: self.config.mask_token_id)

    def new_cache(self, max_tokens: int) -> DeviceDrafterCache:
        """An empty device context cache with room for ``max_tokens`` context rows."""
        return DeviceDrafterCache(self.config, max_tokens)

    def workspace(self, rows: int, block: int | None = None) -> DrafterWorkspace:
        """The preallocated buffers for drafts of up to ``rows`` new context rows (rounded up to
        a power of two, at least 8) and ``block`` block rows (the block size by default), made
        on first use and kept."""
        block = self.block_size if block is None else int(block)
        size = max(8, 1 << max(0, int(rows) - 1).bit_length())
        key = (size, block)
        if key not in self._workspaces:
            self._workspaces[key] = new_drafter_workspace(self.config, self.target.config.vocab_size,
                                                          size, block)
        return self._workspaces[key]

    # -- host API (the twin's) ---------------------------------------------------------------
    def _check_host_inputs(self, features, block_ids, cache):
        cfg = self.config
        y, m = len(cfg.target_layer_ids), cfg.hidden_size
        check_array("features", features, 3, np.float32, shape=(None, y, m))
        check_array("block_ids", block_ids, 1, (np.int32, np.int64))
        if not isinstance(cache, DeviceDrafterCache):
            raise ValueError(f"cache must be a DeviceDrafterCache from new_cache(), got {type(cache).__name__}")
        if is_device(features) or is_device(block_ids):
            raise ValueError("forward / draft take numpy features and ids; use draft_device for device arrays")
        vocab = self.target.config.vocab_size
        if block_ids.shape[0] == 0:
            raise ValueError("block_ids is empty")
        if block_ids.min() < 0 or block_ids.max() >= vocab:
            raise ValueError(f"block token id out of range [0, {vocab})")
        s0, n = cache.length, features.shape[0]
        if s0 + n > cache.capacity:
            raise ValueError(f"drafter cache overflow: {s0} rows + {n} new exceeds capacity {cache.capacity}")

    def _load_features(self, ws: DrafterWorkspace, features: np.ndarray, stream) -> None:
        n = features.shape[0]
        if n:
            ws.feat[:n].copy_to_device(np.ascontiguousarray(features.reshape(n, -1)), stream=stream)
        ws.n_in.copy_to_device(np.array([n], np.int32), stream=stream)

    def forward(self, features: np.ndarray, block_ids: np.ndarray, cache: DeviceDrafterCache,
                stream=0) -> np.ndarray:
        """Append ``features``' context rows to the cache, then run the block over it.

        features [n, Y, M] float32 numpy (n may be 0), block_ids [B'] int (any B' >= 1) ->
        final-normed hidden [B', M] float32 numpy, as ``NumpyDrafter.forward``.
        """
        self._check_host_inputs(features, block_ids, cache)
        ws = self.workspace(features.shape[0], block_ids.shape[0])
        self._load_features(ws, features, stream)
        ws.ids.copy_to_device(block_ids.astype(np.int32), stream=stream)
        self._enqueue_draft(ws, ws.feat, ws.n_in, ws.n_in, cache, write_block=False, logits=False,
                            stream=stream)
        return ws.h.copy_to_host(stream=stream)

    def draft(self, features: np.ndarray, bonus: int, cache: DeviceDrafterCache, stream=0) -> np.ndarray:
        """One DFlash draft: append the context rows, run ``[bonus, MASK x (B-1)]`` after them.

        features [n, Y, M] float32 numpy, bonus in [0, V) -> logits [B-1, V] float32 numpy.
        """
        bonus = check_int("bonus", bonus, 0, self.target.config.vocab_size - 1)
        self._check_host_inputs(features, np.array([bonus]), cache)
        ws = self.workspace(features.shape[0])
        self._load_features(ws, features, stream)
        ws.bonus_in.copy_to_device(np.array([bonus], np.int32), stream=stream)
        self._enqueue_draft(ws, ws.feat, ws.n_in, ws.bonus_in, cache, stream=stream)
        logits = ws.logits.copy_to_host(stream=stream)
        check_finite_output("drafter", "logits", logits, None, layers_checked=False)
        return logits

    # -- device API (the GPU-resident decode loop) ---------------------------------------------
    def draft_device(self, features, n, bonus, cache: DeviceDrafterCache, *, depths: int | None = None,
                     graph: bool = False, stream=0):
        """Enqueue one draft from device inputs; returns the device logits [D, V] float32 of the
        block's first D = ``depths`` positions after the bonus (default all B - 1: L).

        features [Nf, Y*M] float32 device (rows [0, n) are the new context rows: the target's
        hidden states at ``target_layer_ids`` of the newly committed tokens, concatenated in
        that order), n [>= 1] int32 device (n = n[0], 0 <= n <= Nf), bonus [>= 1] int32 device
        (the block's first token, bonus[0] in [0, V)), cache from ``new_cache``. The cache length
        advances by n on the device; n past Nf or past the cache's capacity appends nothing and
        sets ``cache.overflowed``. The logits are a workspace buffer, overwritten by the next
        draft that uses the same workspace (same Nf rounded up to a power of two). No host sync,
        no allocation once ``prepare(Nf, cache)`` (or a first draft) has made the workspace and
        the attention scratch, so the call can be captured in a larger CUDA graph. ``graph``:
        replay a CUDA graph of this draft captured on the first call with these same arrays (a
        real GPU only); same bits.

        ``depths`` (1 <= D <= B - 1): lm_head runs over the first D positions only, bit for bit
        the first D rows of the whole draft (the layers still run over the whole block: its
        attention is not causal). A DDTree of budget b never holds a node deeper than b (a node
        at depth d comes after its d - 1 ancestors in pop order), so the decode loops ask for
        min(L, b): at the Moonlight shape lm_head over 15 rows x 163840 outputs is the draft's
        largest GEMM. ``partial_depths`` (True) says that this drafter takes ``depths``.
        """
        y, m = len(self.config.target_layer_ids), self.config.hidden_size
        check_array("features", features, 2, np.float32, shape=(None, y * m))
        check_array("n", n, 1, np.int32)
        check_array("bonus", bonus, 1, np.int32)
        if not (is_device(features) and is_device(n) and is_device(bonus)):
            raise ValueError("draft_device takes device arrays (features, n, bonus)")
        if not isinstance(cache, DeviceDrafterCache):
            raise ValueError(f"cache must be a DeviceDrafterCache from new_cache(), got {type(cache).__name__}")
        D = self._check_depths(depths)
        ws = self.workspace(features.shape[0])
        self._prepare(ws, cache)
        if not graph:
            self._enqueue_draft(ws, features, n, bonus, cache, depths=D, stream=stream)
            return _first_rows(ws.logits, D)
        if numba_config.ENABLE_CUDASIM:
            raise ValueError("graph=True needs a real GPU: the CUDA simulator cannot capture graphs")
        key = (id(features), id(n), id(bonus), id(cache), D)
        entry = ws.graphs.get(key)
        if entry is None:
            saved = cuda.device_array(2, np.int32)
            calls = []

            def enqueue(s):
                # capture_graph runs the draft once uncaptured (compiling every kernel) before it
                # captures it: that run must leave the cache length where it found it
                first = not calls
                calls.append(s)
                if first:
                    saved.copy_to_device(cache.status, stream=s)
                self._enqueue_draft(ws, features, n, bonus, cache, depths=D, stream=s)
                if first:
                    cache.status.copy_to_device(saved, stream=s)

            exe = capture_graph(enqueue)
            # the graph holds raw pointers: keep the arrays alive as long as it is replayed
            entry = ws.graphs[key] = (exe, (features, n, bonus, cache))
        replay_graph(entry[0], stream)
        return _first_rows(ws.logits, D)

    def _check_depths(self, depths) -> int:
        """``depths`` as an int in [1, B - 1] (None: B - 1), or a ValueError naming it."""
        L = self.block_size - 1
        return L if depths is None else check_int("depths", depths, 1, L)

    def prefill_device(self, features, n, cache: DeviceDrafterCache, *, stream=0) -> None:
        """The drafter's prefill on the device: ``cache`` emptied, then the context rows [0, n)
        of ``features`` appended (a draft's first part: its fc and norm, then each layer's q | k |
        v projection and norm + RoPE, with one block row that is not read), then n[0] set to 0,
        so that the next ``draft_device`` sees only the
        rows that come after. A decode loop calls it once after the target's prefill, so that its
        rounds draft over at most a block's new rows (``features[:block_size]``: launches sized
        for that, not for the prompt). The next draft's logits are bit for bit those of one
        draft that takes the rows itself: each context row's keys and values are computed alone.
        features [Nf, Y*M] float32, n [1] int32 (n[0] <= Nf), device; no sync, no allocation
        after the first call (capturable); what it leaves depends on features and n only (its
        block row, never read, is the workspace's token 0), so a captured prefill may run it
        twice (a warm-up, then the replay)."""
        y, m = len(self.config.target_layer_ids), self.config.hidden_size
        check_array("features", features, 2, np.float32, shape=(None, y * m))
        check_array("n", n, 1, np.int32)
        if not (is_device(features) and is_device(n)):
            raise ValueError("prefill_device takes device arrays (features, n)")
        if not isinstance(cache, DeviceDrafterCache):
            raise ValueError(f"cache must be a DeviceDrafterCache from new_cache(), got {type(cache).__name__}")
        ws = self.workspace(features.shape[0], 1)
        cache.enqueue_reset(stream)
        self._enqueue_draft(ws, features, n, ws.bonus_in, cache, context_only=True, stream=stream)   # (token 0)
        n.copy_to_device(self._zeros(n.shape), stream=stream)

    def prefill_batch_device(self, features, n, bonus, pool: "DeviceDrafterPool", *, stream=0) -> None:
        """``prefill_device`` for every slot of ``pool`` (``draft_batch_device``'s arguments, its
        launches up to each layer's keys and values): every slot emptied, then its new context
        rows appended, then n set to 0; the next ``draft_batch_device`` may take
        ``features[:slots * block_size]``."""
        self._check_batch_inputs(features, n, bonus, pool)
        pool.enqueue_reset(stream)
        self._enqueue_batch_draft(features, n, bonus, pool, stream, context_only=True)
        n.copy_to_device(self._zeros(n.shape), stream=stream)

    def _zeros(self, shape) -> object:
        """A device int32 array of zeros of ``shape``, kept (a device-to-device copy's source)."""
        key = tuple(shape)
        if key not in self._zero_arrays:
            self._zero_arrays[key] = cuda.to_device(np.zeros(shape, np.int32))
        return self._zero_arrays[key]

    def new_pool(self, slots: int, max_tokens: int) -> DeviceDrafterPool:
        """``slots`` empty context caches of ``max_tokens`` rows in one pool, for
        ``draft_batch_device``."""
        return DeviceDrafterPool(self.config, slots, max_tokens)

    def batch_workspace(self, pool: DeviceDrafterPool, rows: int) -> BatchDrafterWorkspace:
        """The buffers of ``draft_batch_device`` over ``pool`` with up to ``rows`` new context
        rows in all, made on first use and kept (keyed by the pool's slots and capacity, and
        ``rows``)."""
        cfg, S, B = self.config, pool.slots, self.block_size
        key = ("batch", S, pool.capacity, int(rows))
        if key not in self._workspaces:
            M, Dh, Hq, Hkv = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
            f32 = lambda *shape: cuda.device_array(shape, np.float32)  # noqa: E731
            i32 = lambda *shape: cuda.to_device(np.zeros(shape, np.int32))  # noqa: E731
            tails = S * (B - 1)
            self._workspaces[key] = BatchDrafterWorkspace(
                sequences=S, rows=int(rows), block=B, meta=i32(6), seq_meta=i32(S, 4), att=i32(S, 2),
                ids=i32(S * B), ctx_raw=f32(rows, M), xin=f32(S * B + rows, M),
                qkv=f32(S * B + rows, (Hq + 2 * Hkv) * Dh), x=f32(S * B, M), h=f32(S * B, M),
                o=f32(S * B, Hq * Dh), act=f32(S * B, cfg.intermediate_size), tail=f32(tails, M),
                tail_h=f32(tails, M), logits=f32(tails, self.target.config.vocab_size),
                scratch=kn.GQAScratch(S * B, Hq, Dh, pool.capacity + B))
        return self._workspaces[key]

    def draft_batch_device(self, features, n, bonus, pool: DeviceDrafterPool, *, depths: int | None = None,
                           stream=0):
        """Enqueue the drafts of every slot of ``pool`` in one forward; returns the device logits
        [S D, V] float32, slot z's D rows at [z D, (z + 1) D) (D = ``depths``, as
        ``draft_device``'s; default L = B - 1).

        features [Nf, Y*M] float32 device: the new context rows of every slot packed in slot
        order (slot z's n[z] rows after the rows of the slots before it), n [S] int32 device,
        bonus [S] int32 device. Each slot's cache advances by its n (an n past the slot's
        capacity, or past Nf, appends nothing to it and sets its overflow flag). Slot z's logits
        are bit for bit ``draft_device`` of its own inputs and cache: every GEMM row is computed
        alone, and the fused norm + RoPE and the attention take a table of the slots. No sync, no
        allocation after the first call (capturable)."""
        self._check_batch_inputs(features, n, bonus, pool)
        return self._enqueue_batch_draft(features, n, bonus, pool, stream, depths=self._check_depths(depths))

    def _check_batch_inputs(self, features, n, bonus, pool) -> None:
        """``draft_batch_device``'s arguments, or a ``ValueError`` naming the first wrong one."""
        y, m = len(self.config.target_layer_ids), self.config.hidden_size
        if not isinstance(pool, DeviceDrafterPool):
            raise ValueError(f"pool must be a DeviceDrafterPool from new_pool(), got {type(pool).__name__}")
        check_array("features", features, 2, np.float32, shape=(None, y * m))
        check_array("n", n, 1, np.int32, shape=(pool.slots,))
        check_array("bonus", bonus, 1, np.int32, shape=(pool.slots,))
        if not (is_device(features) and is_device(n) and is_device(bonus)):
            raise ValueError("draft_batch_device takes device arrays (features, n, bonus)")

    def _enqueue_batch_draft(self, features, n, bonus, pool: DeviceDrafterPool, stream,
                             context_only: bool = False, depths: int | None = None):
        """``draft_batch_device``'s launches (its checked arguments) -> the logits [S D, V]; with
        ``context_only``, every slot's context rows into its cache and nothing after
        (``_enqueue_layers``) -> None."""
        cfg, target, m = self.config, self.target, self.config.hidden_size
        ws = self.batch_workspace(pool, features.shape[0])
        S, B = pool.slots, ws.block
        D = B - 1 if depths is None else depths
        eps, gemm = cfg.rms_norm_eps, target.gemm_args
        _draft_batch_meta_kernel[1, META_THREADS, stream](
            pool.status, n, bonus, int(pool.capacity), int(features.shape[0]), int(cfg.mask_token_id), D, ws.ids,
            ws.seq_meta, ws.att, ws.meta)
        self._enqueue_layers(ws, features, S * B, lambda i: (pool.k[i], pool.v[i]), ws.seq_meta, ws.att, stream,
                             context_only)
        if context_only:
            return None
        _block_tails_kernel[(ceil_div(S * D, 4), ceil_div(m, 64)), (4, 64), stream](ws.x, B, D, ws.tail)
        # views of S D rows: the GEMM's tile and grid are planned for the rows it computes (the
        # bits do not depend on the tile, docs/DESIGN.md §4)
        kn.enqueue_linear(ws.tail[:S * D], target.lm_head, ws.logits[:S * D], ws.n_logits,
                          norm=(self.norm, eps, ws.tail_h[:S * D]), **gemm, stream=stream)
        return _first_rows(ws.logits, S * D)

    def prepare(self, rows: int, cache: DeviceDrafterCache) -> DrafterWorkspace:
        """Allocate now what drafts of up to ``rows`` context rows into ``cache`` need (the
        workspace and the attention scratch), e.g. before capturing ``draft_device`` inside a
        larger CUDA graph of the decode loop; returns the workspace."""
        ws = self.workspace(rows)
        self._prepare(ws, cache)
        return ws

    def _prepare(self, ws: DrafterWorkspace, cache: DeviceDrafterCache) -> None:
        """Point ``ws`` at the attention scratch for its block size, made (or grown) to hold
        the keys of ``cache``; one scratch serves every workspace of that block size."""
        keys = cache.capacity + ws.block
        scratch = self._scratch.get(ws.block)
        if scratch is None or scratch.max_keys < keys:
            scratch = self._scratch[ws.block] = kn.GQAScratch(
                ws.block, self.config.num_attention_heads, self.config.head_dim, keys)
        if ws.scratch is not scratch:
            ws.scratch = scratch
            ws.graphs.clear()                                  # they point at the old scratch

    def _enqueue_draft(self, ws: DrafterWorkspace, features, n, bonus, cache: DeviceDrafterCache, *,
                       write_block: bool = True, logits: bool = True, context_only: bool = False,
                       depths: int | None = None, stream=0) -> None:
        """Enqueue the whole draft: sizes, context rows into the cache, the block's layers, then
        with ``logits`` lm_head over the final norm of rows 1 .. D (``ws.logits[:D]``, D =
        ``depths``, default B - 1; ``ws.h`` is then scratch), else the final norm (``ws.h``).
        ``context_only``: the context rows into the cache and nothing after (``_enqueue_layers``)."""
        cfg, target = self.config, self.target
        eps = cfg.rms_norm_eps
        D = ws.block - 1 if depths is None else depths
        if not context_only:                  # (the attention's scratch: no attention without the block)
            self._prepare(ws, cache)
        nf = features.shape[0]
        gemm = target.gemm_args          # the target's precision and tile for every projection
        _draft_meta_kernel[1, META_THREADS, stream](
            cache.status, n, bonus, int(cache.capacity), int(nf), int(cfg.mask_token_id), bool(write_block),
            D, ws.ids, ws.meta)
        self._enqueue_layers(ws, features, ws.block, lambda i: (cache.k[i], cache.v[i]), ws.meta, ws.att_meta,
                             stream, context_only)
        if context_only:
            return
        if logits and ws.block > 1:               # the final norm of the tails into h_tail, then lm_head
            # (views of D rows: the GEMM's launch planned for the rows it computes)
            kn.enqueue_linear(ws.x_tail[:D], target.lm_head, ws.logits[:D], ws.n_logits,
                              norm=(self.norm, eps, ws.h_tail[:D]), **gemm, stream=stream)
        else:
            kn.enqueue_rms_norm(ws.x, self.norm, eps, ws.h, ws.n_blk, stream=stream)

    def _enqueue_inputs(self, ws, features, stream) -> None:
        """The first layer's attention input, ``ws.xin``: the block's rows input_layernorm(embed(
        ids)) (ws.x the embeddings) and after them the new context rows, hidden_norm(fc(features))
        [n, M]. The context rows go on a side stream, beside the block's embedding and norm (a
        captured draft runs the two chains as parallel branches: the same launches, so the same
        bits); ``_enqueue_layers`` launches it, then starts at the first layer's q | k | v GEMM."""
        eps, gemm, target = self.config.rms_norm_eps, self.target.gemm_args, self.target
        side = self._context_side.fork(stream)
        kn.enqueue_linear(features, self.fc, ws.ctx_raw, ws.n_ctx, **gemm, stream=side)
        kn.enqueue_rms_norm(ws.ctx_raw, self.hidden_norm, eps, ws.ctx, ws.n_ctx, stream=side)
        kn.enqueue_embedding(ws.ids, target.embed_tokens, ws.x, ws.n_blk, stream=stream)
        kn.enqueue_rms_norm(ws.x, self.layers[0].input_layernorm, eps, ws.xin[:ws.x.shape[0]], ws.n_xin,
                            stream=stream)
        self._context_side.join(stream)

    def _enqueue_layers(self, ws, features, block_rows: int, caches, norm_meta, att_meta, stream,
                        context_only: bool = False) -> None:
        """The first layer's input (``_enqueue_inputs``: the embedded block rows normed, the new
        context rows of ``features``), then every drafter layer over ``ws``'s ``block_rows`` block
        rows (and those context rows, whose keys and values go into the caches): ``caches(i)`` =
        layer i's (k, v) cache, [S_cap, W] for one draft or [S, S_cap, W] for a batch,
        ``norm_meta`` / ``att_meta`` the fused norm + RoPE's and the attention's sizes
        (``enqueue_qkv_norm_rope``, ``enqueue_gqa_attention``).
        ``context_only`` (a prefill): each layer only projects and appends the context rows' keys
        and values, by the same two launches as a draft's (so the same bits); the block rows go
        along in those launches and are not read."""
        cfg, gemm = self.config, self.target.gemm_args
        Hq, Hkv, Dh, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
        nq, nk = Hq * Dh, Hkv * Dh
        q, kb, vb = ws.qkv[:block_rows, :nq], ws.qkv[:block_rows, nq:nq + nk], ws.qkv[:block_rows, nq + nk:]
        scale = float(Dh) ** -0.5
        self._enqueue_inputs(ws, features, stream)
        for i, lw in enumerate(self.layers):
            k_cache, v_cache = caches(i)                               # [S_cap, Hkv*Dh] (or [S, S_cap, ...])
            # one GEMM projects the block (q, k, v at positions s0 + n + j, never cached) from the
            # input norm of x (normed into xin's block rows first: the first layer's by
            # _enqueue_inputs) and the new context rows (k, v at s0 + c); one launch norms and
            # rotates the block's q and k in place and appends the context rows' keys and values
            # to the cache
            norm = {} if i == 0 else dict(norm=(lw.input_layernorm, eps, None), norm_head=ws.x)
            kn.enqueue_linear(ws.xin, lw.qkv_proj, ws.qkv, ws.n_xin, **norm, **gemm, stream=stream)
            kn.enqueue_qkv_norm_rope(ws.qkv, norm_meta, lw.q_norm, lw.k_norm, eps, self.inv_freq,
                                     n_q_heads=Hq, n_kv_heads=Hkv, interleave=False,   # Qwen3's rotate-half
                                     k_cache=k_cache, v_cache=v_cache, stream=stream)
            if context_only:
                continue
            # non-causal attention over the context rows then the block, o_proj into the residual
            kn.enqueue_gqa_attention(q, k_cache, v_cache, ws.o, k_blk=kb, v_blk=vb,
                                     meta=att_meta, scale=scale, scratch=ws.scratch, stream=stream)
            kn.enqueue_linear(ws.o, lw.o_proj, ws.x, ws.n_blk, accumulate=True, **gemm, stream=stream)
            # x += mlp(post_attention_layernorm(x)), the norm launched into ws.h first
            kn.enqueue_swiglu_mlp(ws.x, lw.gate_proj, lw.up_proj, lw.down_proj, ws.x, act=ws.act,
                                  n_rows=ws.n_blk, accumulate=True, norm=(lw.post_attention_layernorm, eps, ws.h),
                                  **gemm, stream=stream)
