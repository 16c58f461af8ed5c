"""Tree acceptance on the GPU; twins: ``reference.accept.sample_post``, ``follow_tree`` and
``follow_trees``.

Shapes: N+1 tree nodes (root included), V vocabulary.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import config, cuda, float64, int32, uint64

from .._checks import check_array, check_follow_inputs, check_sample_inputs
from ..tree import Tree
from .._device import cached, check_threads, device_function, grid_dependency_after, is_device, to_device
from .rope import _no_seqs    # an empty sequence table: one tree, post from row 0
from .tree_build import MAX_BUDGET, TreeBuffers

# Threads a block (a row to draw, a tree to walk). The results do not depend on it (the arg-max
# keeps the lowest id on ties however the row is split; a node has at most one child that matches,
# found by an atomic minimum), so the simulator, which runs a Python thread a CUDA thread, takes fewer.
THREADS = 32 if config.ENABLE_CUDASIM else 256
_NONE = 2**31 - 1
CHILD_SLOTS = MAX_BUDGET + 1   # the walk's table: a tree of up to MAX_BUDGET nodes and its root


@device_function
def _splitmix64(x):
    """The splitmix64 finaliser on a uint64 (wrapping), as ``reference.accept.splitmix64``."""
    x = x + uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> uint64(30))) * uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> uint64(27))) * uint64(0x94D049BB133111EB)
    return x ^ (x >> uint64(31))


@cached
@cuda.jit
def _round_seed_kernel(seed, rounds, out):
    grid_dependency_after((seed, rounds, out))   # PDL: nothing before it touches global memory (_device.py)
    if cuda.grid(1) == 0:
        out[0] = _splitmix64(seed[0] ^ _splitmix64(uint64(rounds[0])))


def enqueue_round_seed(seed, rounds, out, *, stream=0) -> None:
    """out[0] = the sampling seed of round rounds[0], as ``reference.accept.round_seed`` gives it
    for (seed[0], rounds[0]), computed when the kernel runs (a captured round replays with each
    round's seed); twin: ``reference.accept.enqueue_round_seed``.
    seed [1] uint64, rounds [>= 1] int32 (rounds[0] >= 0), out [1] uint64: device arrays."""
    check_array("seed", seed, 1, np.uint64, shape=(1,))
    check_array("rounds", rounds, 1, np.int32)
    check_array("out", out, 1, np.uint64, shape=(1,))
    _round_seed_kernel[1, 1, stream](seed, rounds, out)


@functools.lru_cache(maxsize=None)
def _sample_post_kernel(threads):
    T = threads

    @cached
    @cuda.jit
    def kernel(logits, temperature, seeds, seqs, post):
        # a block a row. A batch (seqs [S, 4] = (s0, t, row0, slot) a sequence, not empty): row
        # row0 + i of sequence z draws as row i of that sequence alone, with its seed seeds[z];
        # a row in no sequence is not written
        grid_dependency_after((logits, temperature, seeds, seqs, post))   # PDL (_device.py)
        row = cuda.blockIdx.x
        g = row                                   # the global row, written in post
        z = 0
        if seqs.shape[0] > 0:
            z = -1
            for y in range(seqs.shape[0]):
                if seqs[y, 2] <= g and g < seqs[y, 2] + seqs[y, 1]:
                    z = y
            if z < 0:
                return
            row = g - seqs[z, 2]
        seed = seeds[z]
        t = cuda.threadIdx.x
        V = logits.shape[1]
        red_val = cuda.shared.array(T, float64)
        red_id = cuda.shared.array(T, int32)
        best = -math.inf
        best_id = _NONE
        for v in range(t, V, T):  # ascending ids: a strict > keeps the lower id on ties
            val = float64(logits[g, v])
            if temperature > 0.0:
                h = _splitmix64(seed ^ _splitmix64((uint64(row) << uint64(32)) | uint64(v)))
                u = (float64(h >> uint64(11)) + 0.5) * (1.0 / 9007199254740992.0)
                val = val / temperature - math.log(-math.log(u))
            if best_id == _NONE or val > best:
                best = val
                best_id = v
        red_val[t] = best
        red_id[t] = best_id
        cuda.syncthreads()  # every thread's candidate is in
        stride = T // 2
        while stride > 0:
            if t < stride:
                ov = red_val[t + stride]
                oi = red_id[t + stride]
                if oi != _NONE and (red_id[t] == _NONE or ov > red_val[t]
                                    or (ov == red_val[t] and oi < red_id[t])):
                    red_val[t] = ov
                    red_id[t] = oi
            cuda.syncthreads()  # this level of the arg-max tree is done
            stride //= 2
        if t == 0:
            post[g] = red_id[0]

    return kernel


def sample_post(logits, temperature, seed, *, out=None, seed_device=None, seqs=None, stream=0,
                threads=THREADS):
    """The target's token at every node: arg-max at T = 0, else the seeded Gumbel-max draw.

    logits [N+1, V] float32 -> post [N+1] int32; the same draws as ``reference.sample_post``.
    ``seed_device``: a uint64 [1] device array whose value is the seed, read when the kernel runs
    (a captured round replays with each round's own seed); ``seed`` is then ignored.
    ``seqs``: several trees' rows side by side (the batched device round): [S, 4] int32 device =
    (s0, t, row0, slot) a tree; rows row0 .. row0 + t draw as ``sample_post`` of those rows alone
    with seed ``seed_device[z]`` (uint64 [S], required), rows in no tree are not written.
    """
    temperature, seed = check_sample_inputs(logits, temperature, seed)
    if seqs is not None:
        check_array("seqs", seqs, 2, np.int32, shape=(None, 4))
        if seed_device is None:
            raise ValueError("sample_post with seqs needs seed_device: a seed a tree")
        check_array("seed_device", seed_device, 1, np.uint64, shape=(seqs.shape[0],))
    elif seed_device is None:
        seed_device = to_device(np.array([seed], np.uint64), stream)
    else:
        check_array("seed_device", seed_device, 1, np.uint64, shape=(1,))
    threads = check_threads(threads)
    n = logits.shape[0]
    if out is None:
        post = cuda.device_array(n, np.int32, stream=stream)
    else:
        check_array("out", out, 1, np.int32, shape=(n,))
        post = out
    if n:
        _sample_post_kernel(threads)[n, threads, stream](
            to_device(logits, stream), temperature, seed_device, _no_seqs() if seqs is None else seqs, post)
    if out is None and not is_device(logits):
        return post.copy_to_host(stream=stream)
    return post


@functools.lru_cache(maxsize=None)
def _follow_tree_kernel(threads):
    T = threads

    @cached
    @cuda.jit
    def kernel(parents_all, tokens_all, n_nodes, post_all, seqs, keep_all, info_all):
        # a block a tree: block s walks tree s, whose root's target token is post_all[row0] with
        # row0 = seqs[s, 2] (a batch's verify rows), or post_all[0] when seqs is empty (one tree);
        # a tree with no verified rows (seqs[s, 1] == 0) is not walked: info = (0, 0)
        grid_dependency_after((parents_all, tokens_all, n_nodes, post_all, seqs, keep_all, info_all))
        b_ = cuda.blockIdx.x
        parents = parents_all[b_]
        tokens = tokens_all[b_]
        keep = keep_all[b_]
        info = info_all[b_]
        row0 = 0
        t = cuda.threadIdx.x
        if seqs.shape[0] > 0:
            row0 = seqs[b_, 2]
            if seqs[b_, 1] == 0:
                if t == 0:
                    info[0] = 0
                    info[1] = 0
                return
        n = n_nodes[b_]
        # child[c]: the least node j whose parent is c and whose token is the target's at c (the
        # one the walk would take there), else _NONE; every node j tests itself at once, then
        # thread 0 follows the pointers from the root. (The walk was a block-wide scan of the
        # candidates at each step, four barriers and a read-back of info through global memory a
        # step: a chain about as long as the accepted path times a few trips to L2.)
        child = cuda.shared.array(CHILD_SLOTS, int32)
        for c in range(t, n + 1, T):
            child[c] = _NONE
        cuda.syncthreads()  # no child recorded yet
        for j in range(1 + t, n + 1, T):
            p = parents[j]
            if tokens[j - 1] == post_all[row0 + p]:
                cuda.atomic.min(child, p, j)
        cuda.syncthreads()  # every node has tested itself
        if t == 0:
            keep[0] = 0
            c = 0
            m = 1
            j = child[0]
            while j != _NONE:
                keep[m] = j
                m += 1
                c = j
                j = child[c]
            info[0] = m
            info[1] = post_all[row0 + c]

    return kernel


def _check_walk_capacity(cap: int) -> None:
    if cap > MAX_BUDGET:
        raise ValueError(f"the GPU walk takes trees of up to MAX_BUDGET = {MAX_BUDGET} nodes (every tree the "
                         f"package builds), got {cap}")


def follow_tree(tree, post, *, out=None, stream=0, threads=THREADS):
    """Walk from the root while a child holds the target's token; on the GPU.

    ``tree`` is a host ``Tree`` or the ``TreeBuffers`` of a GPU build; post [N+1] int32
    (for buffers: [capacity+1]). Returns (keep [n] int32, bonus int) like the twin, or,
    when ``out = (keep [capacity+1] int32, info [2] int32)`` device arrays are given,
    fills them (``info = (n, bonus)``) and returns ``out`` without synchronising.
    """
    threads = check_threads(threads)
    if isinstance(tree, TreeBuffers):
        cap = tree.capacity
        check_array("post", post, 1, np.int32, shape=(cap + 1,))
        parents, tokens, n_nodes = tree.parents, tree.tokens, tree.n_nodes
    elif isinstance(tree, Tree):
        check_follow_inputs(tree, post)
        cap = tree.num_nodes
        parents, tokens = to_device(tree.parents, stream), to_device(tree.tokens, stream)
        n_nodes = to_device(np.array([cap], np.int32), stream)
    else:
        raise ValueError(f"tree must be a Tree or TreeBuffers, got {type(tree).__name__}")
    _check_walk_capacity(cap)
    if out is None:
        keep = cuda.device_array(cap + 1, np.int32, stream=stream)
        info = cuda.device_array(2, np.int32, stream=stream)
    else:
        keep, info = out
        check_array("out[0]", keep, 1, np.int32, shape=(cap + 1,))
        check_array("out[1]", info, 1, np.int32, shape=(2,))
    _follow_tree_kernel(threads)[1, threads, stream](
        parents.reshape(1, cap + 1), tokens.reshape(1, tokens.shape[0]), n_nodes,
        to_device(post, stream), _no_seqs(), keep.reshape(1, cap + 1), info.reshape(1, 2))
    if out is not None:
        return out
    n, bonus = info.copy_to_host(stream=stream)
    return keep.copy_to_host(stream=stream)[:n], int(bonus)


def follow_trees(trees, post, seqs, *, out, stream=0, threads=THREADS):
    """``follow_tree`` for every tree of a batch, a block a tree, from device arrays (no checks
    of their values; the batched device round's launch). Twin: ``reference.follow_trees``.

    trees ``TreeBatchBuffers`` (S trees of capacity C), post [R] int32 device: the target's token
    at every verify row of the batch, seqs [S, 4] int32 device = (cache rows, t, row0, slot) a
    tree: tree s's node i was verified at row row0 + i, and a tree with t = 0 (a finished
    sequence) is not walked. out = (keep [S, C+1] int32, info [S, 2] int32) device: keep[s, :n]
    and info[s] = (n, bonus), (0, 0) for a tree not walked. Returns ``out``, not synchronised.
    """
    threads = check_threads(threads)
    S, C = trees.trees, trees.capacity
    _check_walk_capacity(C)
    keep, info = out
    check_array("seqs", seqs, 2, np.int32, shape=(S, 4))
    check_array("out[0]", keep, 2, np.int32, shape=(S, C + 1))
    check_array("out[1]", info, 2, np.int32, shape=(S, 2))
    check_array("post", post, 1, np.int32)
    if S:
        _follow_tree_kernel(threads)[S, threads, stream](trees.parents, trees.tokens, trees.n_nodes, post, seqs,
                                                         keep, info)
    return out
