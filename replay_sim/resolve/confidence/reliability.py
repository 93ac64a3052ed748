"""Calibration measured on a probe set: reliability, expected calibration error, operating points.

Scored **cross-validated by server**: the confidence of a probe on server S comes from a model
learned on the leave-one-out examples of every other server of the store, so the model never
sees the server it is scored on. At each operating point the probes are replayed with that
threshold (:func:`~replay_sim.resolve.evaluate.evaluate`: precision and truth recall) and the
served answers' confidences are compared with whether they were right (ECE). At operating point
0 every candidate the store holds is served: its reliability diagram shows how the confidence of
*any* candidate tracks its correctness.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from replay_sim.resolve.confidence.diagram import ece, reliability
from replay_sim.resolve.confidence.features import FEATURES, Formed
from replay_sim.resolve.confidence.judge import Confidence
from replay_sim.resolve.confidence.leaveoneout import Example, examples, learn_from
from replay_sim.resolve.confidence.model import ConfidenceModel
from replay_sim.resolve.confidence.population import Observed
from replay_sim.resolve.evaluate import Grade, Probe, Report, evaluate, truth_of
from replay_sim.resolve.resolver import Resolver
from replay_sim.resolve.toolstate import answer_of
from replay_sim.store import Recording

__all__ = [
    "OPERATING_POINTS",
    "Scored",
    "cross_validated",
    "ece",
    "observe",
    "plot",
    "reliability",
    "render_calibration",
]

OPERATING_POINTS: tuple[float | None, ...] = (None, 0.99, 0.95, 0.9, 0.8, 0.5, 0.0)
"""The operating points scored by ``eval --calibration`` (None: the strict tiers, today's default)."""


@dataclass
class Scored:
    """One operating point's report, and each served answer's ``(confidence, right)``."""

    point: float | None
    report: Report
    served: list[tuple[float, bool]] = field(default_factory=list)


def cross_validated(
    resolver: Resolver, probes: Sequence[Probe], points: Sequence[float | None] = OPERATING_POINTS
) -> list[Scored]:
    """Score the resolver at each operating point, each server's confidences from the others' model.

    Args:
        resolver: The resolver (its index current or buildable); its confidence model is swapped
            per server while scoring and restored after.
        probes: Probes with live truth.
        points: Operating points (None: strict tiers only).
    """
    resolver.index()
    found: list[Example] = examples(resolver)
    models = {s: learn_from(found, leave_out=frozenset({s})) for s in {p.server for p in probes}}
    judge = resolver.confidence
    kept_model, kept_point, growth = judge.model, judge.min_confidence, judge.growth
    judge.growth = None  # each server's model is the one scored: no refit swaps it meanwhile
    scored = []
    try:
        for point in points:
            judge.min_confidence = point
            scored.append(_score(resolver, probes, models, point))
    finally:
        judge.model, judge.min_confidence, judge.growth = kept_model, kept_point, growth
        judge.clear()
    return scored


def _score(
    resolver: Resolver, probes: Sequence[Probe], models: dict[str, ConfidenceModel], point: float | None
) -> Scored:
    judge = resolver.confidence
    answered: list[tuple[Recording | None, float | None]] = []

    def resolve(
        server: str, method: str, params: dict[str, Any], history: list[str]
    ) -> tuple[Recording | None, str, str]:
        if judge.model is not models[server]:
            judge.model = models[server]
            judge.clear()
        found = resolver.resolve(server, method, params, history)
        answered.append((found.recording, found.confidence))
        return found.recording, found.step, found.reason or found.tier.value

    report = evaluate(resolver.store, probes, resolve, resolver.tool_schema)
    steps = [step for probe in probes for step in probe.steps]
    served = [
        (conf, answer_of(rec) == truth_of(step))
        for (rec, conf), step in zip(answered, steps, strict=True)
        if rec is not None and conf is not None
    ]
    return Scored(point, report, served)


def render_calibration(scored: Sequence[Scored], baselines: Mapping[str, Report] | None = None) -> str:
    """Markdown: precision, recall and ECE per operating point, then the reliability diagram at 0.

    Args:
        scored: The operating points (:func:`cross_validated`).
        baselines: Systems scored on the same probes (the exact cache, the nearest neighbour),
            shown first by name.
    """
    lines = [
        "| operating point | correct hit | wrong hit | needless miss | precision | truth recall | ECE |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, report in (baselines or {}).items():
        lines.append(_row(name, report, None))
    for s in scored:
        label = "strict tiers (default)" if s.point is None else f"--min-confidence {s.point}"
        lines.append(_row(label, s.report, ece(s.served)))
    loosest = min(scored, key=lambda s: 2.0 if s.point is None else s.point)
    lines += [
        "",
        f"Reliability (every candidate served, operating point {loosest.point}; "
        f"ECE {ece(loosest.served):.3f}, {len(loosest.served)} answers):",
        "",
        "| confidence | answers | mean confidence | accuracy |",
        "|---|---|---|---|",
    ]
    for low, high, n, mean, acc in reliability(loosest.served):
        lines.append(f"| {low:.1f}-{high:.1f} | {n} | {mean:.3f} | {acc:.3f} |")
    return "\n".join(lines)


def _row(label: str, report: Report, error: float | None) -> str:
    counts = report.total()
    precision, recall = report.rates()
    shown = "—" if error is None else f"{error:.3f}"
    return (
        f"| {label} | {counts[Grade.CORRECT_HIT]} | {counts[Grade.WRONG_HIT]} | "
        f"{counts[Grade.NEEDLESS_MISS]} | {precision:.1%} | {recall:.1%} | {shown} |"
    )


def observe(resolver: Resolver, probes: Sequence[Probe]) -> list[Observed]:
    """The candidates the resolver forms for the probes' steps, labelled by each step's truth: the
    population's evidence (:mod:`~.population`).

    Each step's best candidate is served (operating point 0, the loosest point
    :func:`cross_validated` scores, so the episode's history is what serving every candidate
    makes it) and its features are read as serving reads them.
    """
    judge = _Observing(resolver.confidence)
    resolver.confidence = judge
    counted: Counter[tuple[str, tuple[str, ...], bool]] = Counter()
    try:
        for probe in probes:
            history: list[str] = []
            for step in probe.steps:
                judge.clear()  # a candidate judged before is not described again
                judge.seen = None
                found = resolver.resolve(probe.server, step["method"], step["params"], history)
                history.append(found.step)
                if found.recording is not None and judge.seen is not None:
                    on = tuple(f.name for f, v in zip(FEATURES, judge.seen, strict=True) if v)
                    counted[(probe.server, on, answer_of(found.recording) == truth_of(step))] += 1
    finally:
        resolver.confidence = judge.inner
    merged: dict[tuple[str, tuple[str, ...]], list[int]] = {}
    for (server, on, right), n in counted.items():
        merged.setdefault((server, on), [0, 0])[0 if right else 1] += n
    return [Observed(server, on, right, wrong) for (server, on), (right, wrong) in sorted(merged.items())]


class _Observing(Confidence):
    """A resolver's judge at operating point 0 that keeps the features of the candidate it judged last."""

    def __init__(self, inner: Confidence) -> None:
        super().__init__(inner.model, inner.config, 0.0)
        self.inner = inner
        self.seen: np.ndarray | None = None

    def features(self, resolver: Any, formed: Formed, method: str) -> np.ndarray:
        self.seen = super().features(resolver, formed, method)
        return self.seen


def plot(scored: Sequence[Scored], path: Path) -> bool:
    """Write the reliability diagram as a PNG when matplotlib is installed; False when it is not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    loosest = min(scored, key=lambda s: 2.0 if s.point is None else s.point)
    rows = reliability(loosest.served)
    fig, ax = plt.subplots(figsize=(4, 4))
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey")
    ax.plot([r[3] for r in rows], [r[4] for r in rows], marker="o")
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy")
    ax.set_title(f"reliability (ECE {ece(loosest.served):.3f})")
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return True
