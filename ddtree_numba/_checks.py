"""Input checks shared by the numpy twins and the kernel launchers.

Each raises ``ValueError`` naming the argument and what is wrong; nothing is clipped.
Device arrays are checked for shape and dtype only (reading their values would copy
them to the host); host arrays are also checked for their values. A stage whose twin and
launcher take the same arguments has one ``check_<stage>_inputs`` here, called by both.
"""

from __future__ import annotations

import numpy as np

from .tree import Tree


def is_host(a) -> bool:
    return isinstance(a, np.ndarray)


def check_array(name, a, ndim, dtypes, shape=None):
    """Shape/dtype check that works for numpy and numba device arrays."""
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
        raise ValueError(f"{name} must be an array, got {type(a).__name__}")
    if len(a.shape) != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(a.shape)}")
    if isinstance(dtypes, type) or isinstance(dtypes, np.dtype):
        dtypes = (dtypes,)
    if np.dtype(a.dtype) not in [np.dtype(d) for d in dtypes]:
        names = " or ".join(np.dtype(d).name for d in dtypes)
        raise ValueError(f"{name} must have dtype {names}, got {np.dtype(a.dtype).name}")
    if shape is not None:
        for axis, (got, want) in enumerate(zip(a.shape, shape)):
            if want is not None and got != want:
                raise ValueError(
                    f"{name} has shape {tuple(a.shape)}; axis {axis} must be {want}"
                )


# The tensor-core GEMMs' arithmetic (kernels/linear.py, twin reference/linear.py; docs/DESIGN.md §4)
PRECISIONS = ("bf16", "fp32")


def check_precision(precision) -> str:
    """``precision`` if it is one of ``PRECISIONS``, else a ValueError listing them."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return precision


def check_int(name, value, lo=None, hi=None):
    """An integer argument inside [lo, hi]."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if lo is not None and value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"{name} must be <= {hi}, got {value}")
    return int(value)


def check_flag(name, value, allow_none=False):
    """``value`` as a bool (True / False, a numpy bool too; None where ``allow_none``), else a
    ``ValueError`` naming it: a string such as "no" is not False."""
    if value is None and allow_none:
        return None
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be {'None, ' if allow_none else ''}True or False, got {value!r}")
    return bool(value)


def check_logits_values(name, logits):
    """Host logits: no NaN, no +inf, and every row has a finite entry."""
    if not is_host(logits):
        return
    if np.isnan(logits).any():
        raise ValueError(f"{name} contains NaN")
    if np.isposinf(logits).any():
        raise ValueError(f"{name} contains +inf")
    if logits.size and not np.isfinite(logits).any(axis=-1).all():
        raise ValueError(f"{name} has a row with no finite entry (all -inf)")


def check_parents_values(parents):
    """parents[0] == -1 and 0 <= parents[i] < i."""
    if not is_host(parents):
        return
    if parents.shape[0] == 0 or parents[0] != -1:
        raise ValueError("parents[0] must be -1 (node 0 is the root)")
    idx = np.arange(parents.shape[0])
    bad = (parents[1:] < 0) | (parents[1:] >= idx[1:])
    if bad.any():
        i = int(np.flatnonzero(bad)[0]) + 1
        raise ValueError(f"parents[{i}] = {parents[i]} must satisfy 0 <= parents[i] < {i}")


def check_keep_values(keep, rows_after_start):
    """keep[0] == 0, strictly increasing, and inside the rows after start."""
    if not is_host(keep):
        return
    if keep.shape[0] == 0:
        raise ValueError("keep must hold at least the root (keep[0] = 0)")
    if keep[0] != 0:
        raise ValueError(f"keep[0] must be 0 (the root), got {keep[0]}")
    if (np.diff(keep) <= 0).any():
        raise ValueError("keep must be strictly increasing")
    if keep[-1] >= rows_after_start:
        raise ValueError(
            f"keep[-1] = {keep[-1]} points past the array: only {rows_after_start} rows after start"
        )


# -- the inputs of the DDTree stages, shared by each twin and its kernel launcher ---------------

def check_build_inputs(lp, ids, budget) -> int:
    """``build_tree``'s inputs: lp [L, K] float32 (host rows <= 0, descending), ids [L, K] int32,
    budget >= 0; returns the budget."""
    check_array("lp", lp, 2, np.float32)
    check_array("ids", ids, 2, np.int32, shape=lp.shape)
    budget = check_int("budget", budget, 0)
    if is_host(lp) and np.isnan(lp).any():
        raise ValueError("lp contains NaN")
    if is_host(lp) and (lp > 0).any():
        raise ValueError("lp must be log-probabilities (<= 0)")
    if is_host(lp) and (lp[:, 1:] > lp[:, :-1]).any():         # (-inf entries compare without a warning)
        raise ValueError("lp rows must be sorted in descending order (as topk_logprobs returns)")
    if is_host(ids) and ids.size and ids.min() < 0:
        raise ValueError(f"ids must be token ids >= 0, got {int(ids.min())}")
    return budget


def check_batch_build_inputs(lp, ids, budget) -> int:
    """``build_trees``' inputs: lp [S, L, K] float32 and ids [S, L, K] int32, each sequence's
    [L, K] as ``build_tree`` takes them (host arrays checked sequence by sequence), budget >= 0."""
    check_array("lp", lp, 3, np.float32)
    check_array("ids", ids, 3, np.int32, shape=lp.shape)
    budget = check_int("budget", budget, 0)
    if is_host(lp):
        for s in range(lp.shape[0]):
            try:
                check_build_inputs(lp[s], ids[s], budget)
            except ValueError as err:
                raise ValueError(f"sequence {s}: {err}") from None
    return budget


def is_real_number(value) -> bool:
    """A Python or numpy int or float, not a bool (nor a string that float() would take): what a
    real-valued argument (a temperature, a scale, an eps) must be before its range is checked."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


# Below this a float32 logit / T can overflow float64 (3.4e38 / 1e-270 > 1.8e308), and the draw
# would compare infinities; 0 is greedy decoding.
MIN_TEMPERATURE = 1e-250


def check_temperature(temperature) -> float:
    """A sampling temperature: a real number (not a bool or a string), finite, 0 (greedy) or at
    least ``MIN_TEMPERATURE``, as float."""
    if not is_real_number(temperature):
        raise ValueError(f"temperature must be a number, got {temperature!r}")
    temperature = float(temperature)
    if not temperature >= 0.0 or not np.isfinite(temperature):
        raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
    if 0.0 < temperature < MIN_TEMPERATURE:
        raise ValueError(f"temperature {temperature} is below {MIN_TEMPERATURE}, where logits / temperature overflow "
                         "float64; use 0 for greedy decoding")
    return temperature


def check_sample_inputs(logits, temperature, seed) -> tuple[float, int]:
    """``sample_post``'s inputs: logits [N+1, V] float32 (host: no NaN / +inf, a finite entry per
    row), temperature finite >= 0, seed in [0, 2**64); returns (temperature, seed)."""
    check_array("logits", logits, 2, np.float32)
    if logits.shape[1] == 0:
        raise ValueError("logits has no entries (V = 0): there is no token to draw")
    check_logits_values("logits", logits)
    return check_temperature(temperature), check_int("seed", seed, 0, 2**64 - 1)


def check_follow_inputs(tree: Tree, post) -> None:
    """``follow_tree``'s inputs: a ``Tree`` with consistent arrays, post [N+1] int32 (host: >= 0)."""
    if not isinstance(tree, Tree):
        raise ValueError(f"tree must be a Tree, got {type(tree).__name__}")
    n = tree.num_nodes
    check_array("tree.parents", tree.parents, 1, np.int32, shape=(n + 1,))
    check_array("tree.tokens", tree.tokens, 1, np.int32, shape=(n,))
    check_parents_values(tree.parents)
    check_array("post", post, 1, np.int32)
    if post.shape[0] < n + 1:
        raise ValueError(f"post has {post.shape[0]} entries; the tree has {n + 1} nodes")
    if post.shape[0] > n + 1:
        raise ValueError(f"post has {post.shape[0]} entries, more than the tree's {n + 1} nodes")
    if is_host(post) and (post < 0).any():
        raise ValueError("post holds a negative token id")


def check_compact_inputs(rows, start, keep) -> int:
    """``compact_rows``'s inputs: rows [S, W], 0 <= start <= S, keep [n] int32 (keep[0] = 0,
    strictly increasing, inside the rows after start); returns start."""
    check_array("rows", rows, 2, (np.float32, np.float16, np.uint16, np.int32))
    start = check_int("start", start, 0, rows.shape[0])
    check_array("keep", keep, 1, np.int32)
    check_keep_values(keep, rows.shape[0] - start)
    return start
