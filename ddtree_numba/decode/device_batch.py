"""``generate_batch`` with every round on the GPU (issue 17): a ``DeviceTarget`` with cache pools
(``CudaTarget``) and a ``DeviceDrafter`` (or ``ar``).

The batched round of docs/DECODE.md "Batches of trees on the GPU", for S sequences in S slots:

- every slot's draft in one drafter forward (``draft_batch_device`` over a pool of context
  caches, the slots' new context rows packed: at most min(L, cap) + 1 a slot when the drafter
  took the prompts in the prefill, ``prefill_batch_device``) and the top-K of all their rows in
  one launch; a drafter without it drafts a slot at a time (its own cache and F feature rows);
- every slot's tree in one build launch (a block a tree, each with its own budget), or one level
  build a slot from ``LEVEL_BUILD_FROM`` nodes;
- the verify rows packed on the device (``_batch_verify_inputs_kernel``): slot s's rows follow the
  live slots before it, ``seqs[s]`` = (its cache rows, its rows t, its first row, s), t = 0 for a
  finished sequence, which then costs no verify row;
- one target forward over all of them (``CudaTarget.forward_pooled``: the GEMMs and the MoE once
  over every row, the cache writes and the attention for every slot of the pool in one launch set,
  each sequence's bits those of its own forward);
- one ``sample_post`` launch (each row drawing as in its sequence alone), one ``follow_trees``
  launch, one accept launch (``_batch_after_accept_kernel``: the next round's state and budget, the
  report, the drafter's next context rows), then every slot's cache compaction in one launch.

Every size is on the device, so the round is one CUDA graph per (slots, budget, method) on a real
GPU. The accept launch also ends a slot's sequence by the host's own rule (``RoundLog``: a stop
token among the tokens it commits or as its new bonus, or ``max_new_tokens`` reached), marking it
dead (``live``) for the next round. So rounds run one ahead of the host as the single sequence's do
(docs/DECODE.md "Rounds in flight"): the host reads a round's report ([S, 4 + C]: n, bonus, N,
flags, the accepted tokens; n = 0 for a slot that was not live) and the experts' counting-sort
offsets while the next round runs, commits tokens, and checks that the device ended the same
sequences it did.

Shapes: S slots, C tree capacity (nodes besides the root), L draft depths, K ranks a depth, Y
hidden layers the drafter reads, M hidden size, F feature rows a slot.
"""

from __future__ import annotations

import time
import weakref

import numpy as np
from numba import cuda, int32, uint64

from .. import kernels as kn
from .._device import cached, capture_graph, ceil_div, destroy_graph, grid_dependency_after, replay_graph
from ..model.cuda_target import unique_experts
from .device import (DRAFTER_BIT, LEVEL_BUILD_FROM, TARGET_BIT, THREADS, _check_finite, _nonfinite_kernel, _pow2,
                     accepted_rows_max, depths_kwargs, gather_feature, tree_depths)
from .rounds import round_seed


# -- glue kernels ----------------------------------------------------------------------------------
# state [S, 3] int32 = (cache rows before the round, round number, cache rows allowed) a slot,
# budget [S] int32 its next tree's budget, live [S] int32 (0: a finished sequence; set by the host
# after the prefill, then by the accept launch), ends [S] int32 = prompt + max_new_tokens a slot,
# stops [1 + n] int32 = (n, the stop ids).
STOP_IDS = 16                         # stop ids a configuration's array holds (a call with more: a larger one)


@cached
@cuda.jit
def _batch_verify_inputs_kernel(bonus, tokens, depths, tree_parents, n_nodes, live, state, seqs, ids, positions,
                                parents, meta, report):
    """The verify rows of every slot, packed (grid: x blocks over a slot's rows, y = the slot).
    Slot z's t = N_z + 1 rows (0 when not live) start after the live slots before it: row0 = the
    sum of their t. Its rows: ids = [bonus, tokens], positions = start + [0, depths], parents =
    its tree's (numbered within it); seqs[z] = (start, t, row0, z); the last slot's block writes
    meta = (0, all rows) and clears the batch's non-finite flags (report[0, 3])."""
    grid_dependency_after((bonus, tokens, depths, tree_parents, n_nodes, live, state, seqs, ids, positions, parents,
                           meta, report))
    z = cuda.blockIdx.y
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    row0 = 0
    for y in range(z):
        if live[y] != 0:
            row0 += n_nodes[y] + 1
    t = n_nodes[z] + 1 if live[z] != 0 else 0
    start = state[z, 0]
    if i == 0:
        seqs[z, 0] = start
        seqs[z, 1] = t
        seqs[z, 2] = row0
        seqs[z, 3] = z
        if z == seqs.shape[0] - 1:
            meta[0] = 0
            meta[1] = row0 + t
            report[0, 3] = 0
    if i < t:
        r = row0 + i
        if i == 0:
            ids[r] = bonus[z]
            positions[r] = start
            parents[r] = -1
        else:
            ids[r] = tokens[z, i - 1]
            positions[r] = start + depths[z, i - 1]
            parents[r] = tree_parents[z, i]


@cached
@cuda.jit
def _batch_after_accept_kernel(keep, info, tokens, n_nodes, live, seqs, state, start_n, n_new, bonus, report, cap,
                               budget, ends, stops, hidden, layer_ids, features, packed):
    """After ``follow_trees``, slot z = grid z; a slot is live this round when it had verify rows
    (seqs[z, 1] > 0: ``live`` is written here, so no block reads it). Blocks of y = 0 (thread j
    over the x blocks): start_n[z] = (start, n) for its compaction, n_new[z] = n context rows for
    its drafter, bonus[z] = the new bonus, state[z] = (start + n, round + 1, _), budget[z] =
    min(cap, rows allowed - the next start - 1); report[z] = [n, new bonus, N, _, accepted
    tokens...]; live[z] = 0 when the round ends its sequence (``RoundLog.commit`` then
    ``bonus_ends``: a stop id among the committed tokens (the old bonus and the accepted nodes')
    or as the new bonus, or start + n + 1 >= ends[z]). A slot that is not live takes n = 0 and
    budget 0 (its state and bonus stay). Blocks of y >= 1 (as many x blocks as nodes, none for
    ``ar``): the slot's next context rows, the drafter's layers of hidden row row0 + keep[z, j] for
    j < n, columns (y - 1) * blockDim + thread, into features [S F, Y M] at row f0 + j: f0 = z F
    (a slot's own F rows), or (``packed``: one drafter forward for every slot) the sum of the n of
    the slots before it (0 for a slot not live: ``follow_trees``' info)."""
    grid_dependency_after((keep, info, tokens, n_nodes, live, seqs, state, start_n, n_new, bonus, report, cap, budget,
                           ends, stops, hidden, layer_ids, features, packed))
    z = cuda.blockIdx.z
    alive = seqs[z, 1] != 0
    n = info[z, 0] if alive else 0
    if cuda.blockIdx.y > 0:
        j = cuda.blockIdx.x
        if j < n:
            f0 = z * (features.shape[0] // live.shape[0])
            if packed:
                f0 = 0
                for y in range(z):
                    f0 += info[y, 0]
            gather_feature(hidden, layer_ids, keep[z], j, (cuda.blockIdx.y - 1) * cuda.blockDim.x + cuda.threadIdx.x,
                           features[f0:], seqs[z, 2])
        return
    j = cuda.grid(1)
    if j == 0:
        start = state[z, 0]
        start_n[z, 0] = start
        start_n[z, 1] = n
        n_new[z] = n
        report[z, 0] = n
        report[z, 2] = n_nodes[z] if alive else 0
        if alive:
            ended = start + n + 1 >= ends[z]
            for i in range(n + 1):              # the old bonus, the accepted nodes' tokens, the new bonus
                tok = bonus[z] if i == 0 else (info[z, 1] if i == n else tokens[z, keep[z, i] - 1])
                for k in range(stops[0]):
                    if tok == stops[1 + k]:
                        ended = True
            if ended:
                live[z] = 0
            state[z, 0] = start + n
            state[z, 1] += 1
            budget[z] = max(0, min(cap, state[z, 2] - start - n - 1))
            bonus[z] = info[z, 1]
        else:
            budget[z] = 0
        report[z, 1] = bonus[z]
    elif j < n:
        report[z, 3 + j] = tokens[z, keep[z, j] - 1]


# A batched prefill's inputs, staged by the host in one page-locked buffer and copied with one
# copy: BATCH_PREFILL_HEAD uint32 = (the seed, low and high halves; the first draw's seed, the
# same; the number of stop ids n; the forward's rows T), then SLOT_WORDS a slot = (its prompt's
# first row in the forward, its length P, its cache rows allowed, round 1's budget, its end), then
# the stop ids (n of them, in room for the configuration's ``stops`` array), then the T prompt ids,
# the prompts one after another in slot order.
BATCH_PREFILL_HEAD = 6
SLOT_WORDS = 5


@cached
@cuda.jit
def _batch_prefill_inputs_kernel(staged, state, budget, live, ends, n_ctx, seed, post_seqs, post_seeds, report,
                                 stops, ids, positions, parents, meta, seqs):
    """A batched prefill's inputs from its staged buffer. Thread z < S a slot: state[z] = (P, 1,
    rows allowed), budget, live = 1, ends, n_ctx = P (the drafter's first context rows), the
    forward's table seqs[z] = (0, P, first row, z) (an empty cache), the draw's table post_seqs[z]
    = (0, 1, the prompt's last row, z) (``sample_post``: that row drawn as row 0 of a sequence
    alone) with seed post_seeds[z] = the first draw's seed. Thread i < ids.shape[0] a row of the
    forward: row i < T of the slot whose rows hold it (a binary search of the first rows) takes
    its prompt id, position i - first row and a chain within its prompt (parents numbered within
    it); rows past T id 0, position 0, no parent. Thread 0: seed [1] = the generation's seed (the
    rounds' draws), meta = (0, T), the batch's non-finite flags (report[0, 3]) cleared, stops =
    (n, the ids)."""
    grid_dependency_after((staged, state, budget, live, ends, n_ctx, seed, post_seqs, post_seeds, report, stops, ids,
                           positions, parents, meta, seqs))
    i = cuda.grid(1)
    S = state.shape[0]
    first = (uint64(staged[3]) << uint64(32)) | uint64(staged[2])
    stops_at = BATCH_PREFILL_HEAD + SLOT_WORDS * S      # then the ids, after room for stops[1:]
    ids_at = stops_at + stops.shape[0] - 1
    if i < S:
        w = BATCH_PREFILL_HEAD + SLOT_WORDS * i
        r0, p = int32(staged[w]), int32(staged[w + 1])
        state[i, 0] = p
        state[i, 1] = 1
        state[i, 2] = int32(staged[w + 2])
        budget[i] = int32(staged[w + 3])
        ends[i] = int32(staged[w + 4])
        live[i] = 1
        n_ctx[i] = p
        seqs[i, 0] = 0
        seqs[i, 1] = p
        seqs[i, 2] = r0
        seqs[i, 3] = i
        post_seqs[i, 0] = 0
        post_seqs[i, 1] = 1
        post_seqs[i, 2] = r0 + p - 1
        post_seqs[i, 3] = i
        post_seeds[i] = first
    t = int32(staged[5])
    if i < ids.shape[0]:
        if i < t:
            lo, hi = 0, S - 1                 # the last slot whose first row is <= i
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if int32(staged[BATCH_PREFILL_HEAD + SLOT_WORDS * mid]) <= i:
                    lo = mid
                else:
                    hi = mid - 1
            j = i - int32(staged[BATCH_PREFILL_HEAD + SLOT_WORDS * lo])
            ids[i] = int32(staged[ids_at + i])
            positions[i] = j
            parents[i] = j - 1
        else:
            ids[i] = 0
            positions[i] = 0
            parents[i] = -1
    if i == 0:
        seed[0] = (uint64(staged[1]) << uint64(32)) | uint64(staged[0])
        meta[0] = 0
        meta[1] = t
        report[0, 3] = 0
        n = int32(staged[4])
        stops[0] = n
        for k in range(n):
            stops[1 + k] = int32(staged[stops_at + k])


@cached
@cuda.jit
def _batch_prefill_tail_kernel(post, post_seqs, n_ctx, bonus, report, hidden, layer_ids, rows_in_order, features,
                               packed):
    """After a batched prefill's forward and its draw (``post``: each slot's last prompt row
    drawn, ``post_seqs`` as ``_batch_prefill_inputs_kernel`` wrote it), slot z = grid z: its bonus
    in bonus[z] and report[z, 1] for the host; blocks of grid y >= 1 (none for ``ar``): its
    drafter's first context rows, the drafter's layers of its prompt rows r0 + j for j < P = n_ctx[z]
    (x blocks), columns (y - 1) * blockDim + thread, into features at row f0 + j: f0 = z F (a
    slot's own F rows), or (``packed``) r0, the prompts' rows packed as the forward packed them."""
    grid_dependency_after((post, post_seqs, n_ctx, bonus, report, hidden, layer_ids, rows_in_order, features, packed))
    z = cuda.blockIdx.z
    last = post_seqs[z, 2]
    if cuda.blockIdx.y > 0:
        j = cuda.blockIdx.x
        p = n_ctx[z]
        if j < p:
            r0 = last - p + 1
            f0 = r0 if packed else z * (features.shape[0] // n_ctx.shape[0])
            gather_feature(hidden, layer_ids, rows_in_order, j, (cuda.blockIdx.y - 1) * cuda.blockDim.x
                           + cuda.threadIdx.x, features[f0:], r0)
    elif cuda.grid(1) == 0:
        bonus[z] = post[last]
        report[z, 1] = post[last]


# -- the round -------------------------------------------------------------------------------------

class BatchDeviceRound:
    """What a batch of S sequences keeps on the device between rounds, and the round's CUDA graph:
    the cache pool (a slot a sequence), a drafter cache a slot, the trees, the state, the report.

    Sequences of different prompt lengths and cache limits share the pool's capacity (the largest);
    ``state[s, 2]`` holds each one's own limit. A configuration (drafter, method, K, cap, slots,
    capacity, feature rows, temperature) is kept per target for later calls (``batch_round_for``):
    its prefill resets the caches, and its graph is replayed as it is. It holds the scratch its
    graphs point at (the round's in ``held``, each prefill graph's in its ``prefill_launches``
    entry), so a larger cache that makes the models allocate new scratch leaves the graphs'
    pointers valid.
    """

    def __init__(self, target, drafter, method: str, K: int, cap: int, slots: int, capacity: int,
                 feature_rows: int, temperature: float):
        cfg = target.config
        S = slots
        # weak: _BATCH_ROUNDS is keyed weakly by the target, and the drafter refers to it too
        self.target = weakref.proxy(target)
        self.drafter = None if drafter is None else weakref.proxy(drafter)
        self.drafter_ref = None if drafter is None else weakref.ref(drafter)
        self.method = method
        self.K, self.cap, self.S, self.temperature = K, cap, S, temperature
        self.layers = () if method == "ar" else tuple(drafter.target_layer_ids)
        i32 = lambda *shape: cuda.device_array(shape, np.int32)          # noqa: E731
        self.pool = target.new_cache_pool(S, capacity)
        self.tbufs = kn.TreeBatchBuffers.allocate(S, max(cap, 1))
        self.tbufs.n_nodes.copy_to_device(np.zeros(S, np.int32))        # ar: no trees
        rows = S * (self.tbufs.capacity + 1)                               # the most verify rows
        self.ws = target.workspace(rows)
        self.rows = rows
        self.seqs = i32(S, 4)
        self.launch = target.pooled_launch(self.ws, self.pool, self.seqs, self.tbufs.capacity + 1, self.layers)
        self.post = i32(self.ws.rows)
        self.keep, self.info = i32(S, self.tbufs.capacity + 1), i32(S, 2)
        self.bonus, self.start_n, self.n_ctx = i32(S), i32(S, 2), i32(S)
        self.state, self.budget, self.live, self.ends = i32(S, 3), i32(S), i32(S), i32(S)
        self.stops = i32(1 + STOP_IDS)                     # (n, the stop ids); larger when a call has more
        self.report = i32(S, 4 + self.tbufs.capacity)      # a slot: [n, bonus, N, flags (slot 0), tokens...]
        # two of each: the host reads one round's while the next round's copy is queued
        self.host_reports = tuple(cuda.pinned_array(self.report.shape, np.int32) for _ in range(2))
        self.host_offsets = tuple(cuda.pinned_array(self.launch.offsets.shape, np.int32) for _ in range(2))
        self.seed = cuda.device_array(1, np.uint64)            # the generation's seed
        self.report_head = self.report[0]                      # slot 0's row: the batch's flags (column 3)
        self.round_seeds = cuda.device_array(S, np.uint64)
        self.graph = None
        self.generations = 0                 # prefills so far (the host resets the drafter caches from the
                                             # second, unless a drafter prefill resets them on the device)
        self.held = ()                       # scratch the graph points at
        self.dcaches, self.dpool, self.level_scratch = [], None, None
        # one drafter forward for every slot where the drafter has it (a pool of context caches,
        # the slots' new context rows packed; its logits come a tree's depths a slot, so it must
        # take ``depths``), else a draft a slot (its own cache and F rows)
        self.packed = (method != "ar" and hasattr(drafter, "draft_batch_device")
                       and getattr(drafter, "partial_depths", False))
        self.F = feature_rows
        if method != "ar":
            L, V = tree_depths(drafter.block_size, cap), cfg.vocab_size   # the depths a tree can reach
            self.draft_kw = depths_kwargs(drafter, L)
            if self.packed:
                self.dpool = drafter.new_pool(S, capacity)
            else:
                self.dcaches = [drafter.new_cache(capacity) for _ in range(S)]
            self.features = cuda.device_array((S * feature_rows, len(self.layers) * cfg.hidden_size), np.float32)
            self.layer_ids = cuda.to_device(np.array(self.layers, np.int32))
            self.rows_in_order = cuda.to_device(np.arange(feature_rows, dtype=np.int32))   # the prefill's keep
            self.lp = cuda.device_array((S, L, K), np.float32)
            self.ids = cuda.device_array((S, L, K), np.int32)
            self.draft_rows = cuda.to_device(np.array([S * L], np.int32))   # every slot's L draft rows
            # the top-K of every slot's rows in one launch (packed drafts), else of one slot's
            self.topk_scratch = kn.TopKScratch.allocate(S * L if self.packed else L, V, K, 0)
            if cap >= LEVEL_BUILD_FROM:
                self.level_scratch = kn.LevelScratch.allocate(L, cap, 0)
        # A packed drafter with a device prefill (``prefill_batch_device``) takes the prompts'
        # context rows in the prefill; then a round's draft sees at most the rows a round accepts
        # a slot (a path of min(L, cap) nodes and its root), and its launches are sized for those,
        # not the prompts. (A drafter that drafts a slot at a time keeps the whole F rows a slot.)
        self.drafter_prefill = self.packed and hasattr(drafter, "prefill_batch_device")
        # (the rows of features a packed draft takes: a round's, or every slot's F)
        self.packed_draft_rows = S * (accepted_rows_max(drafter.block_size, cap) if self.drafter_prefill else feature_rows)
        if method == "ar":      # stand-ins of the kernels' types (never read: no gather blocks)
            self.layer_ids = self.rows_in_order = cuda.device_array(1, np.int32)
            self.features = cuda.device_array((S, 1), np.float32)
        self.feature_args = (self.ws.hidden, self.layer_ids, self.features, self.packed)
        # the prefill's inputs: staged in page-locked memory, one copy, spread by
        # _batch_prefill_inputs_kernel; its draw's table and seeds, a post a prefill workspace;
        # (workspace rows, longest prompt bucket) -> [its pooled launch, its graph, the scratch
        # the graph holds]
        self.staged_host, self.staged = None, None
        self.post_seqs, self.post_seeds = i32(S, 4), cuda.device_array(S, np.uint64)
        self.prefill_posts = {}
        self.prefill_launches = {}

    def prefill(self, prompts, max_tokens, ends, stops, seed: int, graph: bool, stream) -> np.ndarray:
        """Every prompt in one batched forward into its slot, its bonus sampled, the drafter's first
        context rows gathered, the round state set (``ends`` [S]: prompt + max_new_tokens a slot;
        ``stops`` the stop ids). Every slot live: the caller marks the ones its bonus ends. The
        host stages the prompts and the round state in page-locked memory
        (``BATCH_PREFILL_HEAD``) and makes one copy; the rest is ``enqueue_prefill``, every size
        on the device, with ``graph`` one CUDA graph a (prefill workspace, longest prompt rounded
        up to a power of two), captured on its first use; the host reads the report once.
        -> the bonus tokens [S] (host)."""
        S, target = self.S, self.target
        stops = np.asarray(sorted(stops), np.int32)
        if stops.size + 1 > self.stops.shape[0]:       # a new array: the graphs pointing at the old one go
            self.close()
            self.stops = cuda.device_array(stops.size + 1, np.int32)
            self.staged_host = None
        ids_at = BATCH_PREFILL_HEAD + SLOT_WORDS * S + self.stops.shape[0] - 1
        if self.staged_host is None:                  # room for S prompts of the pool's capacity
            self.staged_host = cuda.pinned_array(ids_at + S * self.pool.c_kv.shape[2], np.uint32)
            self.staged = cuda.device_array(self.staged_host.shape[0], np.uint32)
        if self.generations and not self.drafter_prefill:     # (a drafter prefill resets on the device)
            for cache in self.dcaches:
                cache.reset()
            if self.dpool is not None:
                self.dpool.reset()
        self.generations += 1
        lens = np.array([p.shape[0] for p in prompts], np.int64)
        rows = np.concatenate([[0], np.cumsum(lens)])
        t = int(rows[-1])
        staged = self.staged_host             # (free: the previous generation ended with a sync)
        staged[0:4].view(np.uint64)[:] = (seed, round_seed(seed, 0))
        staged[4:6] = (stops.size, t)
        staged[BATCH_PREFILL_HEAD:BATCH_PREFILL_HEAD + SLOT_WORDS * S].reshape(S, SLOT_WORDS)[:] = np.stack(
            [rows[:-1], lens, max_tokens, np.maximum(0, np.minimum(self.cap, np.asarray(max_tokens) - lens - 1)),
             ends], 1)
        staged[BATCH_PREFILL_HEAD + SLOT_WORDS * S:][:stops.size] = stops
        staged[ids_at:ids_at + t] = np.concatenate(prompts)
        self.staged[:ids_at + t].copy_to_device(staged[:ids_at + t], stream=stream)   # (the words in use)
        ws = target.workspace(t)
        key = (ws.rows, min(ws.rows, _pow2(int(lens.max()))))
        entry = self.prefill_launches.get(key)
        if entry is None:
            launch = target.pooled_launch(ws, self.pool, self.seqs, key[1], self.layers)
            entry = self.prefill_launches[key] = [launch, None, None]
        launch = entry[0]
        if not graph:
            self.enqueue_prefill(launch, stream)
        else:
            if entry[1] is None:
                # capture_graph warms up on its own stream: the staged inputs must be in first.
                # The warm-up run and the capture write the same rows, the prompts'.
                stream.synchronize()
                entry[1] = capture_graph(lambda s: self.enqueue_prefill(launch, s))
                entry[2] = ws.mla_scratch              # held: the graph points at it (the packed
                                                       # drafter's scratch lives in its workspace)
            replay_graph(entry[1], stream)
        for cache, n in zip(self.pool.caches, lens):
            cache.length = int(n)
        report = self.host_reports[0]         # (no round yet: its buffers are free)
        self.report.copy_to_host(report, stream=stream)
        stream.synchronize()
        _check_finite(report[0], "the prefill", stream)
        return report[:, 1].copy()

    def enqueue_prefill(self, launch, stream) -> None:
        """The batched prefill's device work from its staged inputs (``self.staged``), every size
        read from the device (capturable): the inputs spread to ``launch``'s workspace and the
        round state, the forward of every slot's prompt into its slot, the non-finite check, one
        draw of every slot's last prompt row (``sample_post``'s sequence table, each row drawn
        as ``generate`` draws it) and one launch for the bonuses and the drafter's first context
        rows, which a drafter with ``prefill_batch_device`` then takes into its pool (n_ctx set
        to 0)."""
        ws, S = launch.ws, self.S
        _batch_prefill_inputs_kernel[ceil_div(max(S, ws.rows), THREADS), THREADS, stream](
            self.staged, self.state, self.budget, self.live, self.ends, self.n_ctx, self.seed, self.post_seqs,
            self.post_seeds, self.report, self.stops, ws.ids, ws.positions, ws.parents, ws.meta, self.seqs)
        self.target.forward_pooled(launch, stream=stream)
        _nonfinite_kernel[(ceil_div(ws.rows, 4), ceil_div(ws.logits.shape[1], 64), 1), (4, 64), stream](
            ws.logits, ws.n_rows, TARGET_BIT, ws.logits, ws.n_rows, TARGET_BIT, self.report_head)
        post = self.prefill_posts.get(ws.rows)
        if post is None:
            post = self.prefill_posts[ws.rows] = cuda.device_array(ws.rows, np.int32)
        kn.sample_post(ws.logits, self.temperature, 0, out=post, seed_device=self.post_seeds, seqs=self.post_seqs,
                       stream=stream)
        gather = 0 if self.method == "ar" else ceil_div(self.features.shape[1], THREADS)
        _batch_prefill_tail_kernel[(launch.max_rows, 1 + gather, S), THREADS, stream](
            post, self.post_seqs, self.n_ctx, self.bonus, self.report, ws.hidden, self.layer_ids, self.rows_in_order,
            self.features, self.packed)
        if self.drafter_prefill:             # the prompts' context rows into the drafter's pool
            self.drafter.prefill_batch_device(self.features, self.n_ctx, self.bonus, self.dpool, stream=stream)

    def enqueue_round(self, stream) -> None:
        """One round of every slot, every size read from the device (capturable)."""
        S, ws, tb, C1 = self.S, self.ws, self.tbufs, self.tbufs.capacity + 1
        if self.temperature > 0:
            for z in range(S):
                kn.enqueue_round_seed(self.seed, self.state[z, 1:2], self.round_seeds[z:z + 1], stream=stream)
        if self.method != "ar":     # (a finished slot drafts too, with no new context: it is not read)
            L = self.lp.shape[1]
            if self.packed:         # every slot's draft in one forward, their top-K in one launch
                logits_d = self.drafter.draft_batch_device(self.features[:self.packed_draft_rows], self.n_ctx,
                                                           self.bonus, self.dpool, stream=stream, **self.draft_kw)
                kn.topk_logprobs(logits_d, self.K, out=(self.lp.reshape(S * L, self.K), self.ids.reshape(S * L, self.K)),
                                 scratch=self.topk_scratch, stream=stream)
            else:
                F = self.F
                for z in range(S):
                    logits_d = self.drafter.draft_device(self.features[z * F:(z + 1) * F], self.n_ctx[z:z + 1],
                                                         self.bonus[z:z + 1], self.dcaches[z], stream=stream,
                                                         **self.draft_kw)[:L]
                    kn.topk_logprobs(logits_d, self.K, out=(self.lp[z], self.ids[z]), scratch=self.topk_scratch,
                                     stream=stream)
            if self.level_scratch is None:
                kn.build_trees(self.lp, self.ids, self.cap, out=tb, budget_device=self.budget, stream=stream)
            else:
                for z in range(S):
                    one = kn.TreeBuffers(tb.tokens[z], tb.depths[z], tb.parents[z], tb.ranks[z], tb.scores[z],
                                         tb.n_nodes[z:z + 1])
                    kn.build_tree_levels(self.lp[z], self.ids[z], self.cap, out=one, scratch=self.level_scratch,
                                         budget_device=self.budget[z:z + 1], stream=stream)
        _batch_verify_inputs_kernel[(ceil_div(C1, THREADS), S), THREADS, stream](
            self.bonus, tb.tokens, tb.depths, tb.parents, tb.n_nodes, self.live, self.state, self.seqs,
            ws.ids, ws.positions, ws.parents, ws.meta, self.report)
        self.target.forward_pooled(self.launch, stream=stream)
        if self.method == "ar":
            second = (ws.logits, ws.n_rows, TARGET_BIT)
        else:
            second = (self.lp.reshape(S * self.lp.shape[1], self.K), self.draft_rows, DRAFTER_BIT)
        grid = (ceil_div(max(self.rows, second[0].shape[0]), 4), ceil_div(max(ws.logits.shape[1], self.K), 64), 2)
        _nonfinite_kernel[grid, (4, 64), stream](ws.logits, ws.n_rows, TARGET_BIT, *second, self.report_head)
        kn.sample_post(ws.logits[:self.rows], self.temperature, 0, out=self.post[:self.rows],
                       seed_device=self.round_seeds, seqs=self.seqs, stream=stream)
        kn.follow_trees(tb, self.post, self.seqs, out=(self.keep, self.info), stream=stream)
        gather = 0 if self.method == "ar" else ceil_div(self.features.shape[1], THREADS)
        _batch_after_accept_kernel[(C1 if gather else ceil_div(C1, THREADS), 1 + gather, S), THREADS, stream](
            self.keep, self.info, tb.tokens, tb.n_nodes, self.live, self.seqs, self.state, self.start_n, self.n_ctx,
            self.bonus, self.report, self.cap, self.budget, self.ends, self.stops, *self.feature_args)
        self.pool.enqueue_compact(self.start_n, self.keep, n_max=C1, stream=stream)     # every slot, one launch

    def run_round(self, graph: bool, stream, buffer: int):
        """Enqueue one round: its graph (captured after a first eager round), else its launches;
        then the copies of the report and the expert counts into host buffer ``buffer`` (0 or 1).
        -> an event recorded after the copies."""
        if graph and self.graph is not None:
            replay_graph(self.graph, stream)
        else:
            self.enqueue_round(stream)
        self.report.copy_to_host(self.host_reports[buffer], stream=stream)
        self.launch.offsets.copy_to_host(self.host_offsets[buffer], stream=stream)
        done = cuda.event()
        done.record(stream)
        return done

    def capture(self) -> None:
        """Capture ``enqueue_round`` as one CUDA graph (after an eager round has compiled every
        kernel and made every scratch)."""
        self.graph = capture_graph(self.enqueue_round, warm_up=False)
        self.held = (self.ws.mla_scratch,) + (() if self.method == "ar" or self.packed else
                                              (self.drafter.workspace(self.F).scratch,))

    def close(self) -> None:
        """Destroy the round's graph and the prefill's (a new one is captured on next use)."""
        if self.graph is not None:
            destroy_graph(self.graph)
            self.graph = None
        for entry in self.prefill_launches.values():
            if entry[1] is not None:
                destroy_graph(entry[1])
            entry[1:] = [None, None]


_BATCH_ROUNDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # target -> {key: BatchDeviceRound}
KEPT_BATCH_ROUNDS = 4                 # configurations kept per target (least recently used dropped)


def batch_round_for(target, drafter, method: str, K: int, cap: int, slots: int, capacity: int, feature_rows: int,
                    temperature: float) -> BatchDeviceRound:
    """The ``BatchDeviceRound`` of this configuration: a kept one when the drafter allows it
    (``decode.device.reusable``), else a new one."""
    from .device import reusable
    args = (target, drafter, method, K, cap, slots, capacity, feature_rows, temperature)
    if not reusable(drafter, method):
        return BatchDeviceRound(*args)
    kept = _BATCH_ROUNDS.setdefault(target, {})
    key = (id(drafter), *args[2:])
    br = kept.pop(key, None)
    if br is not None and drafter is not None and br.drafter_ref() is not drafter:
        br.close()                            # a new drafter at a dropped one's id
        br = None
    if br is None:
        br = BatchDeviceRound(*args)
        while len(kept) >= KEPT_BATCH_ROUNDS:
            kept.pop(next(iter(kept))).close()
    kept[key] = br                        # most recently used last
    return br


def generate_batch_device(target, drafter, args, *, method: str, budget: int, temperature: float, seed: int,
                          graph=None) -> tuple:
    """The body of ``generate_batch`` for a device target with cache pools (and a device drafter):
    ``args`` the checked arguments of each prompt (``check_generate_inputs``), every one with
    ``n_new >= 1``. -> (a ``RoundLog`` a prompt, the rounds' (live, rows, accepted, unique experts)
    tuples, stage times by the host's clock: "prefill" (with its sync), "round" (from the first
    round's launch to the last round's end, the graph's capture not counted))
    ``graph``: True replays each round as one CUDA graph (captured after a first eager round),
    False launches every kernel from Python, None: True where ``decode.device.capturable``."""
    from .device import capturable
    from .rounds import RoundLog
    can = capturable(drafter, method)
    if graph not in (None, False, True):
        raise ValueError(f"graph must be None, False or True, got {graph!r}")
    if graph is None:
        graph = can
    elif graph and not can:
        raise ValueError("graph=True needs a real GPU and a drafter whose draft can be captured "
                         "(capturable = True, as CudaDrafter)")
    S = len(args)
    chain = method == "dflash"
    L = 0 if method == "ar" else drafter.block_size - 1
    K = 1 if chain else min(budget, target.config.vocab_size)
    cap = 0 if method == "ar" else (L if chain else budget)
    prompts = [a.prompt for a in args]
    max_tokens = [a.max_tokens for a in args]
    capacity = _pow2(max(max_tokens))
    feature_rows = _pow2(max(max(p.shape[0] for p in prompts), cap + 1))
    stream = cuda.stream()
    times = {"prefill": 0.0, "round": 0.0}
    t0 = time.perf_counter()
    br = batch_round_for(target, drafter, method, K, cap, S, capacity, feature_rows, temperature)
    logs = [RoundLog(method, int(a.prompt.shape[0]), a.n_new, a.stops) for a in args]
    rounds = []
    try:
        ends = [a.prompt.shape[0] + a.n_new for a in args]
        bonus = br.prefill(prompts, max_tokens, ends, args[0].stops, seed, graph, stream)
        live = np.ones(S, np.int32)
        for z, log in enumerate(logs):
            log.target_forwards += 1
            if log.bonus_ends(int(bonus[z])):
                live[z] = 0
        br.live.copy_to_device(live, stream=stream)
        times["prefill"] = time.perf_counter() - t0
        captured = br.graph is not None        # a kept configuration replays its graph from round 1
        most = 1 if method == "ar" else L + 1  # tokens a round commits at most
        launched = 0

        def launch():
            nonlocal launched
            launched += 1
            return (launched - 1) % 2, br.run_round(graph, stream, (launched - 1) % 2)

        # Rounds in flight: the next round is launched before the host reads this one's report
        # (the accept launch ends sequences on the device), so the GPU does not wait while the host
        # commits tokens. Not while a first eager round is still to be captured, nor when every
        # live sequence can end by length in this round; a round launched ahead of stop tokens
        # that end every sequence runs with no live slot, unread.
        ahead = None
        t1 = time.perf_counter()
        while live.any():
            current = ahead if ahead is not None else launch()
            ahead = (launch() if (captured or not graph)
                     and any(len(logs[z].tokens) + most + 1 < logs[z].n_new for z in np.flatnonzero(live)) else None)
            buffer, done = current
            done.synchronize()
            rep, offsets = br.host_reports[buffer].copy(), br.host_offsets[buffer].copy()
            _check_finite(rep[0], f"round {max(log.target_forwards for log in logs)}", stream)
            if not np.array_equal(rep[:, 0] > 0, live > 0):
                raise RuntimeError(f"the batched round's live slots {np.flatnonzero(rep[:, 0] > 0).tolist()} are not "
                                   f"the host's {np.flatnonzero(live).tolist()} (a device/host stop-rule mismatch)")
            rows = accepted = 0
            alive = int(live.sum())
            for z in np.flatnonzero(live):
                log = logs[z]
                n, new_bonus, n_tree = int(rep[z, 0]), int(rep[z, 1]), int(rep[z, 2])
                if method != "ar":
                    log.drafter_forwards += 1
                log.target_forwards += 1
                rows += n_tree + 1
                accepted += n
                if log.commit([int(bonus[z])] + [int(x) for x in rep[z, 4:3 + n]], n_tree):
                    live[z] = 0
                    continue
                bonus[z] = new_bonus
                if log.bonus_ends(new_bonus):
                    live[z] = 0
            rounds.append((alive, rows, accepted, unique_experts(target.config, offsets)))
            if graph and not captured:
                t2 = time.perf_counter()
                br.capture()               # after a first eager round: everything is compiled
                captured = True
                t1 += time.perf_counter() - t2      # (not a round's time)
        stream.synchronize()               # a round launched ahead past the end
        times["round"] = time.perf_counter() - t1
    finally:
        try:
            stream.synchronize()      # nothing of this call left running on the kept configuration
        except Exception:             # (a broken stream: the first error is the one to see)
            pass
    return logs, rounds, times
