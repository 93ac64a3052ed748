"""The confidence model: a small logistic regression with sign-constrained weights.

``P(the real server answers what the candidate says) = sigmoid(bias + Σ wᵢ·xᵢ)`` over the binary
features of :mod:`replay_sim.resolve.confidence.features`. Each weight is held to the sign its
feature's meaning allows (evidence of disagreement never raises a confidence, a closer text never
lowers it), so the model is monotone where it should be, and a confidence is explained by its
largest terms ``wᵢ·xᵢ`` (:meth:`ConfidenceModel.explain`). Fitted by projected gradient descent on
the log loss with an L2 penalty (numpy only): a feature seen in few examples stays near its prior
weight, the way Laplace smoothing keeps a rare bin near its prior.

:data:`PRIOR` is written by hand: weights a reader can check, certain for an exact repeat from the
episode's state and doubtful for anything else. What real servers showed is fitted toward it
(:mod:`~replay_sim.resolve.confidence.population`), and a store's own examples toward that.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from replay_sim.errors import VectorIndexError
from replay_sim.resolve.confidence.features import FEATURES

__all__ = ["MODEL_FILE", "PRIOR", "ConfidenceModel", "fit"]

MODEL_FILE = "confidence.json"
"""The model's file in the index folder (so a snapshot's id covers it)."""
_FORMAT = 1


@dataclass(frozen=True)
class ConfidenceModel:
    """Weights over :data:`FEATURES`, with what they were learned from.

    Attributes:
        bias: The log-odds of a candidate with no feature on (an exact repeat from this state).
        weights: One per feature, in :data:`FEATURES` order.
        examples: Leave-one-out examples it was fitted on (0: the prior).
        positives: Of those, how many candidates were right.
        tools: Per tool (``server\\ttool``), its repeated calls that agreed and disagreed, counted
            over the whole store when the model was learned (what serving reads first).
        source: ``learned`` (from every recording), ``incremental`` (kept examples reused, only
            those of new or affected recordings formed: :mod:`.incremental`, :mod:`.growing`) or
            ``prior``.
        calibration: How well it was calibrated on its own examples, cross-validated (the
            reliability diagram the dashboard draws, :func:`~.leaveoneout.validated`), or None.
        learned_on: The store's ``(calls, highest call id)`` when it was learned: ``tools`` holds
            for that store only (once it grew, serving counts the tool's recordings itself).
        update: For an ``incremental`` model, how it was last updated: ``{"where": "index build" |
            "serving", "kept": examples reused, "formed": recordings whose examples were formed}``.
    """

    bias: float
    weights: tuple[float, ...]
    examples: int = 0
    positives: int = 0
    tools: dict[str, tuple[int, int]] | None = None
    source: str = "learned"
    calibration: dict[str, Any] | None = None
    learned_on: tuple[int, int] | None = None
    update: dict[str, Any] | None = None

    def counts(self, server: str, tool: str, store: tuple[int, int] | None) -> tuple[int, int] | None:
        """A tool's repeated calls that agreed and disagreed, if counted on the store as it is now.

        Args:
            server: The tool's server.
            tool: The tool.
            store: The store's ``(calls, highest call id)`` now (None: unknown).
        """
        if store is None or store != self.learned_on:
            return None  # grown (sandbox answers, backfill, an import while serving): count again
        return (self.tools or {}).get(f"{server}\t{tool}")

    def predict(self, x: np.ndarray) -> float:
        """The confidence of one feature vector."""
        z = self.bias + float(np.dot(self.weights, x))
        return 1.0 / (1.0 + math.exp(-z))

    def predict_many(self, rows: np.ndarray) -> np.ndarray:
        """Confidences of many feature vectors (rows)."""
        return 1.0 / (1.0 + np.exp(-(self.bias + rows @ np.asarray(self.weights))))

    def explain(self, x: np.ndarray, top: int = 3) -> tuple[tuple[str, float], ...]:
        """What drove a confidence: the base log-odds (``base``), then the largest feature terms."""
        terms = [(f.name, float(w * v)) for f, w, v in zip(FEATURES, self.weights, x, strict=True) if v and w]
        terms.sort(key=lambda t: -abs(t[1]))
        return (("base", round(self.bias, 3)), *((name, round(term, 3)) for name, term in terms[:top]))

    def as_json(self) -> dict[str, Any]:
        """The model as JSON (the file's content)."""
        return {
            "format": _FORMAT,
            "source": self.source,
            "bias": round(self.bias, 6),
            "weights": {f.name: round(w, 6) for f, w in zip(FEATURES, self.weights, strict=True)},
            "examples": self.examples,
            "positives": self.positives,
            "tools": {k: list(v) for k, v in sorted((self.tools or {}).items())},
            "calibration": self.calibration,
            "learned_on": None if self.learned_on is None else list(self.learned_on),
            "update": self.update,
        }

    def save(self, directory: Path) -> Path:
        """Write the model into an index folder (atomically).

        Raises:
            VectorIndexError: The folder cannot be written (names it).
        """
        path = directory / MODEL_FILE
        text = json.dumps(self.as_json(), indent=1, sort_keys=True) + "\n"
        write_atomically(path, text, "the confidence model")
        return path

    @classmethod
    def load(cls, directory: Path | None) -> ConfidenceModel | None:
        """The model kept in an index folder, or None when there is none (or it is unreadable).

        An unreadable or foreign file is not fatal: serving falls back to :data:`PRIOR` and says so
        in each answer's provenance (``"model": "prior"``).
        """
        if directory is None:
            return None
        try:
            data = json.loads((directory / MODEL_FILE).read_text(encoding="utf-8"))
            if data.get("format") != _FORMAT:
                return None
            weights = tuple(float(data["weights"].get(f.name, 0.0)) for f in FEATURES)
            tools = {k: (int(v[0]), int(v[1])) for k, v in data.get("tools", {}).items()}
            calibration, on, update = data.get("calibration"), data.get("learned_on"), data.get("update")
            return cls(
                float(data["bias"]), weights, int(data["examples"]), int(data["positives"]), tools,
                str(data.get("source", "learned")), calibration if isinstance(calibration, dict) else None,
                None if on is None else (int(on[0]), int(on[1])),
                update if isinstance(update, dict) else None,
            )  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
            return None


def _prior() -> ConfidenceModel:
    # call_disagrees: a server that answered one call two ways from one state gives each answer
    # about half the time, so its weight nearly cancels the base (no real server of the
    # population showed one: this is the weight it has).
    named = {
        "canonical": -0.5, "nearest": -3.0, "identifiers_differ": -2.0, "similarity>=0.9": 1.0,
        "similarity>=0.95": 1.0, "other_state": -4.0, "diverged": -2.0, "call_agrees": 1.0,
        "call_disagrees": -5.0, "call_varies": -1.0, "tool_consistent": 0.5, "tool_inconsistent": -1.5,
        "failure": -0.5, "gap_writes": -2.0, "gap_same_tool": -1.0, "gap_names_shared": -2.0,
    }  # fmt: skip
    return ConfidenceModel(6.0, tuple(named.get(f.name, 0.0) for f in FEATURES), source="prior")


PRIOR = _prior()
"""The hand-written root of every fit: an exact repeat from this state at 0.998."""


def fit(
    rows: np.ndarray,
    labels: np.ndarray,
    *,
    counts: np.ndarray | None = None,
    l2: float = 2.0,
    base: float | None = 50.0,
    steps: int = 4000,
    prior: ConfidenceModel = PRIOR,
) -> tuple[float, tuple[float, ...]]:
    """Fit ``bias`` and sign-constrained weights to leave-one-out examples.

    Args:
        rows: One feature vector per example (0/1).
        labels: 1 where the candidate's answer was the real one.
        counts: How many examples each row stands for (None: one each). The same objective as the
            rows repeated: :func:`~.leaveoneout.learn_from` fits each distinct ``(features, label)``
            once, so a fit costs the same on 100 examples as on 100,000.
        l2: Pull toward ``prior``, in examples: a feature (or the bias) seen in few examples
            stays near the prior's weight, the way Laplace smoothing keeps a rare bin near its prior;
            the bias says how certain an exact repeat from the episode's state is, which a store
            holding each call once cannot show.
        base: The bias's own pull toward the prior, in examples. Every row shares the bias, but
            only an exact repeat from the episode's state (no feature on) is evidence of it; held
            firmly, the other candidates' outcomes move their own features' weights instead of
            the base (a store of candidates often wrong would otherwise drag every strict hit's
            confidence down with them, and an operating point of 0.99 refuse them all). None:
            the prior's bias, not fitted (a store's fit toward the population, whose strict hits
            are the evidence of it).
        steps: Gradient steps (the problem is convex and tiny; this is far past convergence).
        prior: The weights pulled toward: :data:`PRIOR`, or the population's model that is
            itself fitted toward it (:mod:`~.population`).

    Returns:
        ``(bias, weights)``.
    """
    d = rows.shape[1]
    weight = np.ones(len(rows)) if counts is None else np.asarray(counts, dtype=float)
    n = float(weight.sum())
    if n == 0:
        return prior.bias, prior.weights
    signs = np.array([f.sign for f in FEATURES], dtype=float)
    X = np.hstack([np.ones((len(rows), 1)), rows])
    y = labels.astype(float)
    pulled = np.r_[prior.bias, prior.weights]
    theta = pulled.copy()
    penalty = np.full(d + 1, l2 / n)
    penalty[0] = 0.0 if base is None else base / n
    rate = 1.0 / (float(np.max(np.sum(X * X, axis=1))) / 4 + float(penalty.max()) + 1e-9)  # 1/L
    momentum = theta.copy()
    for step in range(steps):  # accelerated projected gradient (FISTA)
        p = 1.0 / (1.0 + np.exp(-(X @ momentum)))
        grad = X.T @ ((p - y) * weight) / n + penalty * (momentum - pulled)
        nxt = momentum - rate * grad
        if base is None:
            nxt[0] = pulled[0]
        w = nxt[1:]
        w[(signs > 0) & (w < 0)] = 0.0
        w[(signs < 0) & (w > 0)] = 0.0
        momentum = nxt + (step / (step + 3)) * (nxt - theta)
        theta = nxt
    return float(theta[0]), tuple(float(v) for v in theta[1:])


def write_atomically(path: Path, text: str, what: str) -> None:
    """Write ``text`` to ``path`` through a temporary file beside it: a reader never sees half of it.

    Raises:
        VectorIndexError: The folder cannot be written (names it and ``what`` was written).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise VectorIndexError(f"{path}: cannot write {what}: {exc.strerror or exc}") from exc
