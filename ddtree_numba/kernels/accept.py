"""Tree acceptance on the GPU; twins: ``reference.accept.sample_post`` and ``follow_tree``.

Shapes: N+1 tree nodes (root included), V vocabulary.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float64, int32, uint64

from .._checks import check_array, check_follow_inputs, check_sample_inputs
from ..tree import Tree
from .._device import cached, check_threads, device_function, grid_dependency, is_device, to_device
from .tree_build import TreeBuffers

THREADS = 256
_NONE = 2**31 - 1


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
    grid_dependency()   # PDL: nothing before it touches global memory (_device.py)
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
    def kernel(logits, temperature, seeds, post):
        grid_dependency()   # PDL: nothing before it touches global memory (_device.py)
        row = cuda.blockIdx.x
        seed = seeds[0]
        t = cuda.threadIdx.x
        V = logits.shape[1]
        red_val = cuda.shared.array(T, float64)
        red_id = cuda.shared.array(T, int32)
        best = -math.inf
        best_id = _NONE
        for v in range(t, V, T):  # ascending ids: a strict > keeps the lower id on ties
            val = float64(logits[row, v])
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
            post[row] = red_id[0]

    return kernel


def sample_post(logits, temperature, seed, *, out=None, seed_device=None, stream=0, threads=THREADS):
    """The target's token at every node: arg-max at T = 0, else the seeded Gumbel-max draw.

    logits [N+1, V] float32 -> post [N+1] int32; the same draws as ``reference.sample_post``.
    ``seed_device``: a uint64 [1] device array whose value is the seed, read when the kernel runs
    (a captured round replays with each round's own seed); ``seed`` is then ignored.
    """
    temperature, seed = check_sample_inputs(logits, temperature, seed)
    if seed_device is None:
        seed_device = to_device(np.array([seed], np.uint64), stream)
    else:
        check_array("seed_device", seed_device, 1, np.uint64, shape=(1,))
    check_threads(threads)
    n = logits.shape[0]
    if out is None:
        post = cuda.device_array(n, np.int32, stream=stream)
    else:
        check_array("out", out, 1, np.int32, shape=(n,))
        post = out
    if n:
        _sample_post_kernel(threads)[n, threads, stream](
            to_device(logits, stream), temperature, seed_device, post)
    if out is None and not is_device(logits):
        return post.copy_to_host(stream=stream)
    return post


@functools.lru_cache(maxsize=None)
def _follow_tree_kernel(threads):
    T = threads

    @cached
    @cuda.jit
    def kernel(parents, tokens, n_nodes, post, keep, info):
        grid_dependency()   # PDL: nothing before it touches global memory (_device.py)
        t = cuda.threadIdx.x
        n = n_nodes[0]
        cur = cuda.shared.array(1, int32)
        nxt = cuda.shared.array(1, int32)
        if t == 0:
            cur[0] = 0
            keep[0] = 0
            info[0] = 1
        cuda.syncthreads()  # the walk starts at the root
        while True:
            c = cur[0]
            if t == 0:
                nxt[0] = _NONE
            cuda.syncthreads()  # nxt is reset before anyone proposes
            want = post[c]
            for j in range(c + 1 + t, n + 1, T):  # children have larger ids than their parent
                if parents[j] == c and tokens[j - 1] == want:
                    cuda.atomic.min(nxt, 0, j)
            cuda.syncthreads()  # the (unique) matching child, if any, is in nxt
            j = nxt[0]
            if j == _NONE:
                break
            cuda.syncthreads()  # everyone has read nxt and cur before thread 0 moves on
            if t == 0:
                cur[0] = j
                keep[info[0]] = j
                info[0] += 1
            cuda.syncthreads()  # the step is recorded before the next reads cur
        if t == 0:
            info[1] = post[c]

    return kernel


def follow_tree(tree, post, *, out=None, stream=0, threads=THREADS):
    """Walk from the root while a child holds the target's token; on the GPU.

    ``tree`` is a host ``Tree`` or the ``TreeBuffers`` of a GPU build; post [N+1] int32
    (for buffers: [capacity+1]). Returns (keep [n] int32, bonus int) like the twin, or,
    when ``out = (keep [capacity+1] int32, info [2] int32)`` device arrays are given,
    fills them (``info = (n, bonus)``) and returns ``out`` without synchronising.
    """
    check_threads(threads)
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
    if out is None:
        keep = cuda.device_array(cap + 1, np.int32, stream=stream)
        info = cuda.device_array(2, np.int32, stream=stream)
    else:
        keep, info = out
        check_array("out[0]", keep, 1, np.int32, shape=(cap + 1,))
        check_array("out[1]", info, 1, np.int32, shape=(2,))
    _follow_tree_kernel(threads)[1, threads, stream](
        parents, tokens, n_nodes, to_device(post, stream), keep, info)
    if out is not None:
        return out
    n, bonus = info.copy_to_host(stream=stream)
    return keep.copy_to_host(stream=stream)[:n], int(bonus)
