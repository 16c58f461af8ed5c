"""Comparing a forward against its golden: non-finite masks first, then relative error, with
the worst element named (as FlashMLA's ``tests/ref.py`` does)."""

from __future__ import annotations

import numpy as np


def max_rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """``max |got - want| / max |want|`` over the finite entries (0 for an all-zero ``want``)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    ok = np.isfinite(want)
    scale = np.abs(want[ok]).max() if ok.any() else 0.0
    diff = np.abs(got[ok] - want[ok]).max() if ok.any() else 0.0
    return float(diff / scale) if scale > 0 else float(diff)


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float, what: str = "array") -> float:
    """Raise AssertionError unless shapes, inf/nan masks and values (within ``rtol`` of the
    largest ``|want|``) agree; returns the relative error."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        raise AssertionError(f"{what}: shape {got.shape} != expected {want.shape}")
    for name, fn in (("nan", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        bad = fn(got) != fn(want)
        if bad.any():
            raise AssertionError(f"{what}: {name} mask differs first at {np.argwhere(bad)[0].tolist()}")
    err = max_rel_error(got, want)
    if err > rtol:
        diff = np.where(np.isfinite(want), np.abs(got.astype(np.float64) - want), 0.0)
        at = np.unravel_index(np.argmax(diff), diff.shape)
        raise AssertionError(
            f"{what}: relative error {err:.3e} > {rtol:.1e}; worst at {list(map(int, at))}: "
            f"got {got[at]!r}, expected {want[at]!r}"
        )
    return err
