"""Compares a job's whole final state with a reference run's: every tensor of the model's
``state_dict()`` (parameters *and* buffers), the optimizer's ``state_dict()`` (moments, step
counts, hyperparameters) and anything else saved beside them (an LR scheduler's state).

Floating-point tensors are compared by relative L2 difference (``bitwise=True``: exactly,
bit for bit); integer and boolean tensors (BatchNorm's ``num_batches_tracked``, step
counters) and plain values always exactly. Keys must match on both sides.
"""

from __future__ import annotations

from typing import Any, List, Tuple

import torch

REL_TOL = 1e-5


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    den = float(b.norm())
    num = float((a - b).norm())
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def differences(got: Any, want: Any, *, bitwise: bool = False, rel_tol: float = REL_TOL,
                path: str = "") -> Tuple[List[str], float]:
    """(what differs, the largest relative difference of a floating-point tensor)."""
    out: List[str] = []
    worst = 0.0
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return [f"{path}: {type(got).__name__} instead of a dict"], worst
        for k in sorted(set(got) | set(want), key=str):
            if k not in got or k not in want:
                out.append(f"{path}/{k}: only in {'the reference' if k in want else 'this run'}")
                continue
            d, w = differences(got[k], want[k], bitwise=bitwise, rel_tol=rel_tol,
                               path=f"{path}/{k}")
            out += d
            worst = max(worst, w)
        return out, worst
    if isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            return [f"{path}: {got!r:.60} instead of {want!r:.60}"], worst
        for i, (g, w) in enumerate(zip(got, want)):
            d, r = differences(g, w, bitwise=bitwise, rel_tol=rel_tol, path=f"{path}/{i}")
            out += d
            worst = max(worst, r)
        return out, worst
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return [f"{path}: {type(got).__name__} instead of a tensor"], worst
        if got.shape != want.shape or got.dtype != want.dtype:
            return [f"{path}: {got.dtype}{list(got.shape)} instead of "
                    f"{want.dtype}{list(want.shape)}"], worst
        g, w = got.detach().cpu(), want.detach().cpu()
        if not w.is_floating_point() or bitwise:
            if not torch.equal(g, w):
                n = int((g != w).sum())
                what = "bitwise" if w.is_floating_point() else "exactly"
                extra = f"{g.flatten()[:3].tolist()} vs {w.flatten()[:3].tolist()}" \
                    if g.numel() <= 3 else f"{n} of {w.numel()} elements"
                out.append(f"{path}: differs {what} ({extra}, relative "
                           f"{_rel(g, w) if w.is_floating_point() else float('nan'):.3g})")
            return out, (_rel(g, w) if w.is_floating_point() else 0.0)
        r = _rel(g, w)
        if not r < rel_tol:
            out.append(f"{path}: relative difference {r:.3g} (bound {rel_tol:g})")
        return out, r
    if got != want and not (isinstance(want, float) and isinstance(got, float)
                            and abs(got - want) <= rel_tol * abs(want) and not bitwise):
        out.append(f"{path}: {got!r} instead of {want!r}")
    return out, worst


def assert_same_state(got: Any, want: Any, *, bitwise: bool = False,
                      rel_tol: float = REL_TOL) -> float:
    """Asserts the whole state matches; returns the largest relative difference."""
    diffs, worst = differences(got, want, bitwise=bitwise, rel_tol=rel_tol)
    assert not diffs, (f"{len(diffs)} differences from the reference run (largest relative "
                       f"{worst:.3g}):\n  " + "\n  ".join(diffs[:25]))
    return worst
