"""A reliability diagram's bins and the expected calibration error of ``(confidence, right)`` pairs.

Shared by ``eval --calibration`` (pairs from a probe set, :mod:`.reliability`) and by the model
itself, which keeps the diagram of its own leave-one-out examples, cross-validated, for the
dashboard (:func:`~replay_sim.resolve.confidence.leaveoneout.validated`), as the population keeps
its own (:func:`~replay_sim.resolve.confidence.population.validated`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["Bin", "as_json", "ece", "reliability"]

Bin = tuple[float, float, int, float, float]
"""``(bin low, bin high, answers, mean confidence, accuracy)``."""


def ece(pairs: Sequence[tuple[float, bool]], bins: int = 10) -> float:
    """Expected calibration error: the served-weighted gap between confidence and accuracy per bin."""
    if not pairs:
        return 0.0
    conf = np.array([c for c, _ in pairs])
    right = np.array([r for _, r in pairs], dtype=float)
    which = np.minimum((conf * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        mask = which == b
        if mask.any():
            total += mask.sum() / len(pairs) * abs(right[mask].mean() - conf[mask].mean())
    return float(total)


def reliability(pairs: Sequence[tuple[float, bool]], bins: int = 10) -> list[Bin]:
    """The non-empty bins of a reliability diagram, lowest first."""
    rows = []
    for b in range(bins):
        low, high = b / bins, (b + 1) / bins
        inside = [(c, r) for c, r in pairs if low <= c < high or (b == bins - 1 and c == 1.0)]
        if inside:
            mean = sum(c for c, _ in inside) / len(inside)
            rows.append((low, high, len(inside), mean, sum(r for _, r in inside) / len(inside)))
    return rows


def as_json(pairs: Sequence[tuple[float, bool]], validated: str, folds: int) -> dict[str, Any]:
    """A cross-validated diagram as kept in JSON: ``{"validated", "folds", "examples", "ece",
    "bins"}``, each bin ``[low, high, examples, mean confidence, accuracy]``."""
    return {
        "validated": validated,
        "folds": folds,
        "examples": len(pairs),
        "ece": round(ece(pairs), 4),
        "bins": [
            [low, high, n, round(mean, 4), round(acc, 4)] for low, high, n, mean, acc in reliability(pairs)
        ],
    }
