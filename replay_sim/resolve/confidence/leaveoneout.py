"""Labelled examples from the store itself: hide each recording, ask what the rest would answer.

For every recorded call, the recording is hidden and the best candidate the rest of the store
holds for it is formed as serving forms one (:func:`~replay_sim.resolve.confidence.forming.form`)
— from the state the call was made in (its session's prefix), the hidden recording left out of
every count. The candidate is *right* when its answer is what the server really said (the hidden
recording's answer, ``_meta`` aside). The model (:mod:`~replay_sim.resolve.confidence.model`) is
fitted on these examples at ``index build`` and kept in the index folder with the examples, so a
snapshot's id covers it; when the store grows, only the examples of new and affected recordings
are formed again (:mod:`~replay_sim.resolve.confidence.incremental`, and while serving
:mod:`~replay_sim.resolve.confidence.growing`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from replay_sim.resolve.confidence.diagram import as_json
from replay_sim.resolve.confidence.features import CallAnswers, bearing, describe
from replay_sim.resolve.confidence.forming import Resolver, Signatures, form, index_neighbours
from replay_sim.resolve.confidence.model import ConfidenceModel, fit
from replay_sim.resolve.confidence.population import STRENGTH, prior
from replay_sim.resolve.toolstate import answer_of
from replay_sim.store import Recording

FOLDS = 5
"""At most this many folds when the model's own calibration is measured (:func:`validated`)."""
SAMPLE = 20_000
"""At most this many examples (a fixed sample) score the model's own calibration: predicting more
costs time, and the diagram needs no more than this to be exact to a few in 1,000."""

__all__ = ["FOLDS", "SAMPLE", "Example", "examples", "histories", "learn_from", "validated"]


@dataclass(frozen=True, slots=True)
class Example:
    """One hidden recording, the candidate the rest of the store offered, and whether it was right.

    Attributes:
        server: The hidden recording's server (cross-validation holds whole servers out).
        tool: Its tool, prompt or resource.
        hidden: Its id.
        kind: The candidate's match (``exact``, ``canonical``, ``nearest``).
        other_state: Whether the candidate was made from another state.
        x: The candidate's features.
        right: Whether its answer was the real one.
    """

    server: str
    tool: str
    hidden: int
    kind: str
    other_state: bool
    x: np.ndarray
    right: bool


def histories(recordings: Sequence[Recording]) -> dict[int, list[str]]:
    """Each recording's session prefix: the keys of the calls made before it, oldest first."""
    sessions: dict[str, list[Recording]] = defaultdict(list)
    for rec in recordings:
        if rec.session is not None:
            sessions[rec.session].append(rec)
    prefixes: dict[int, list[str]] = {}
    for calls in sessions.values():
        calls.sort(key=lambda r: (r.seq or 0, r.id))
        for i, rec in enumerate(calls):
            prefixes[rec.id] = [r.key for r in calls[:i]]
    return prefixes


def examples(
    resolver: Resolver,
    progress: Callable[[int, int], None] | None = None,
    *,
    recordings: Sequence[Recording] | None = None,
    only: Container[int] | None = None,
) -> list[Example]:
    """Leave-one-out examples over the recordings of the resolver's store.

    Args:
        resolver: A resolver over the store, its index current (the neighbours come from it).
        progress: Called with ``(done, total)`` now and then.
        recordings: The store's recordings (None: read them); at least the whole sessions and
            tools of those hidden, which give each its session prefix and its tool's counts.
        only: Hide only these recordings (None: every one) — the new and affected recordings of
            a grown store (:mod:`~replay_sim.resolve.confidence.incremental`).
    """
    if recordings is None:
        recordings = resolver.store.recordings()
    prefixes = histories(recordings)
    answers: dict[int | None, str] = {}

    def answer(rec: Recording) -> str:  # each recording's canonical answer, formed once
        said = answers.get(rec.id)
        if said is None:
            said = answers[rec.id] = answer_of(rec)
        return said

    tools: dict[tuple[str, str, str], list[Recording]] = defaultdict(list)
    for rec in recordings:
        tools[(rec.server, rec.method, rec.name)].append(rec)
    repeats = {tool: CallAnswers() for tool in tools}
    for tool, recs in tools.items():
        for rec in recs:
            repeats[tool].add(rec.key, answer(rec))
    signatures = Signatures(resolver)
    hidden = [rec for rec in recordings if only is None or rec.id in only]
    neighbours = index_neighbours(resolver)
    found: list[Example] = []
    for done, rec in enumerate(hidden):
        if progress is not None and done % 100 == 0:
            progress(done, len(hidden))
        trail = resolver.lookup.trail(prefixes.get(rec.id, []))
        near = neighbours(rec.server, rec.name, rec) if rec.method == "tools/call" else []
        formed = form(
            resolver, rec.server, rec.method, rec.name, rec.arguments, trail, nearest=near, exclude=rec.id
        )
        if formed is None:
            continue  # nothing else recorded comes close: nothing to learn from
        effect = resolver.lookup.effect(rec.server, rec.name) if rec.method == "tools/call" else None
        repeated = repeats[(rec.server, rec.method, rec.name)].without(rec.key, answer(rec))
        same_call = bearing(formed, resolver.lookup.by_key(formed.recording.key), resolver.lookup.state_of)
        separated = signatures.separated_from(formed.recording)
        x = describe(formed, same_call, repeated, effect, exclude=rec.id, separated=separated, answer=answer)
        right = answer(formed.recording) == answer(rec)
        found.append(Example(rec.server, rec.name, rec.id, formed.kind, formed.other_state, x, right))
    if progress is not None:
        progress(len(hidden), len(hidden))
    return found


def learn_from(
    found: Sequence[Example],
    tools: dict[str, tuple[int, int]] | None = None,
    *,
    leave_out: frozenset[str] = frozenset(),
) -> ConfidenceModel:
    """Fit a model on examples, toward the population's model (:func:`~.population.prior`).

    Args:
        found: Leave-one-out examples.
        tools: Per-tool repeated-call counts to keep with the model.
        leave_out: Cross-validation: the servers the model will be scored on, whose examples
            neither the store's nor the population's are used.
    """
    toward = prior(leave_out)
    used = [e for e in found if e.server not in leave_out]
    if not used:
        return toward
    rows = np.stack([e.x for e in used])
    labels = np.fromiter((e.right for e in used), dtype=float, count=len(used))
    # The same fit with each distinct (binary features, label) once, weighted by its count.
    code = (rows > 0).astype(np.int64) @ (1 << np.arange(rows.shape[1], dtype=np.int64)) * 2 + labels
    _, first, counts = np.unique(code, return_index=True, return_counts=True)
    bias, weights = fit(rows[first], labels[first], counts=counts, l2=STRENGTH, base=None, prior=toward)
    return ConfidenceModel(bias, weights, len(used), int(labels.sum()), tools)


def validated(found: Sequence[Example], folds: int = FOLDS, sample: int = SAMPLE) -> dict[str, Any] | None:
    """The model's calibration on its own examples, each predicted by a model that never saw its group.

    The groups are the store's servers (at most ``folds`` folds of them, so a store of many servers
    costs ``folds`` fits), or its tools when it holds one server: as ``eval --calibration`` scores
    a probe set, the model is never scored on what it learned from. A store of more than ``sample``
    examples is scored on a fixed sample of them.

    Returns:
        ``{"validated": "by server" | "by tool", "folds", "examples", "ece", "bins"}`` (each bin
        ``[low, high, examples, mean confidence, accuracy]``), or None when the examples come from
        one tool (nothing to hold out).
    """
    if len(found) > sample:  # a fixed sample: the same store gives the same file (and snapshot id)
        keep = np.sort(np.random.default_rng(0).choice(len(found), size=sample, replace=False))
        found = [found[int(i)] for i in keep]
    by, group = ("server", [e.server for e in found])
    if len(set(group)) < 2:
        by, group = ("tool", [f"{e.server}\t{e.tool}" for e in found])
    names = sorted(set(group))
    if len(names) < 2:
        return None
    fold_of = {name: i % folds for i, name in enumerate(names)}
    pairs: list[tuple[float, bool]] = []
    for fold in sorted(set(fold_of.values())):
        inside = [e for e, g in zip(found, group, strict=True) if fold_of[g] == fold]
        rest = [e for e, g in zip(found, group, strict=True) if fold_of[g] != fold]
        held = frozenset(name for name in names if fold_of[name] == fold) if by == "server" else frozenset()
        model = learn_from(rest, leave_out=held)  # nor the population's examples of its servers
        scores = model.predict_many(np.array([e.x for e in inside]))
        pairs += [(float(c), e.right) for c, e in zip(scores, inside, strict=True)]
    return as_json(pairs, f"by {by}", len(set(fold_of.values())))
