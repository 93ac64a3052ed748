"""The calibration view (``/api/calibration``, the dashboard's "Confidence calibration" section).

What the served index's confidence model is and how far to trust it: where it came from (learned
at ``index build`` from how many leave-one-out examples, ``incremental`` — refitted as the store
grew, ``update`` saying where and how many examples were kept and formed — or the prior), the
operating points in force (served, per tool), its weights, and its reliability diagram — the
model's own examples, each scored by a model that never saw its server
(:func:`~replay_sim.resolve.confidence.leaveoneout.validated`), binned by confidence against how
often the candidate was right, with the expected calibration error — and the same measured on
the population the model is fitted toward (:mod:`~replay_sim.resolve.confidence.population`: real
servers' answers, each server scored by the model fitted without it). ``replay-sim eval
--calibration`` draws the diagram on a probe set with live truth.
"""

from __future__ import annotations

from typing import Any

from replay_sim.replay.core.replay import Replay
from replay_sim.resolve.confidence.features import FEATURES
from replay_sim.resolve.confidence.population import summary

__all__ = ["calibration"]


def calibration(replay: Replay) -> dict[str, Any]:
    """The calibration view as JSON.

    Returns:
        ``{"model", "update", "examples", "positives", "min_confidence", "per_tool", "bias", "weights",
        "reliability", "population"}``; ``reliability`` is None for the prior or a model learned
        before it was kept (``replay-sim index build`` learns it again), ``population`` (the
        population's diagram) None when the package holds no population.
    """
    judge = replay.resolver.confidence
    model, config = judge.model, judge.config
    per_tool = {
        name: o.min_confidence for name, o in sorted(config.tools.items()) if o.min_confidence is not None
    }
    return {
        "model": model.source,
        "update": model.update,
        "examples": model.examples,
        "positives": model.positives,
        "min_confidence": judge.min_confidence if judge.min_confidence is not None else config.min_confidence,
        "per_tool": per_tool,
        "bias": round(model.bias, 4),
        "weights": [
            {"feature": f.name, "weight": round(w, 4), "says": f.says}
            for f, w in zip(FEATURES, model.weights, strict=True)
            if w
        ],
        "reliability": model.calibration,
        "population": summary(),
    }
