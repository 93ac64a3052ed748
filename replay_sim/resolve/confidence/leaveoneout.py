"""Labelled examples from the store itself: hide each recording, ask what the rest would answer.

For every recorded call, the recording is hidden and the best candidate the rest of the store
holds for it is formed as serving forms one (:func:`~replay_sim.resolve.confidence.forming.form`)
— from the state the call was made in (its session's prefix), the hidden recording left out of
every count. The candidate is *right* when its answer is what the server really said (the hidden
recording's answer, ``_meta`` aside). The model (:mod:`~replay_sim.resolve.confidence.model`) is
fitted on these examples at ``index build`` and kept in the index folder, so a snapshot's id
covers it; it is learned again whenever the store grows (the examples take well under a second
per thousand recordings once the index is built).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from replay_sim.resolve.calibration import MatchConfig
from replay_sim.resolve.confidence.features import describe, repeated_calls
from replay_sim.resolve.confidence.forming import form, index_neighbours
from replay_sim.resolve.confidence.model import PRIOR, ConfidenceModel, fit
from replay_sim.resolve.toolstate import answer_of
from replay_sim.store import Recording, Store

if TYPE_CHECKING:
    from replay_sim.resolve.resolver import Resolver

__all__ = ["Example", "examples", "learn", "learn_from"]


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


def _histories(recordings: Sequence[Recording]) -> dict[int, list[str]]:
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


def examples(resolver: Resolver, progress: Callable[[int, int], None] | None = None) -> list[Example]:
    """Leave-one-out examples over every recording of the resolver's store.

    Args:
        resolver: A resolver over the store, its index current (the neighbours come from it).
        progress: Called with ``(done, total)`` now and then.
    """
    recordings = resolver.store.recordings()
    prefixes = _histories(recordings)
    tools: dict[tuple[str, str, str], list[Recording]] = defaultdict(list)
    for rec in recordings:
        tools[(rec.server, rec.method, rec.name)].append(rec)
    neighbours = index_neighbours(resolver)
    found: list[Example] = []
    for done, rec in enumerate(recordings):
        if progress is not None and done % 100 == 0:
            progress(done, len(recordings))
        trail = resolver.lookup.trail(prefixes.get(rec.id, []))
        near = neighbours(rec.server, rec.name, rec) if rec.method == "tools/call" else []
        formed = form(
            resolver, rec.server, rec.method, rec.name, rec.arguments, trail, nearest=near, exclude=rec.id
        )
        if formed is None:
            continue  # nothing else recorded comes close: nothing to learn from
        effect = resolver.lookup.effect(rec.server, rec.name) if rec.method == "tools/call" else None
        repeats = repeated_calls(tools[(rec.server, rec.method, rec.name)], exclude=rec.id)
        x = describe(formed, resolver.lookup.by_key(formed.recording.key), repeats, effect, exclude=rec.id)
        right = answer_of(formed.recording) == answer_of(rec)
        found.append(Example(rec.server, rec.name, rec.id, formed.kind, formed.other_state, x, right))
    if progress is not None:
        progress(len(recordings), len(recordings))
    return found


def learn_from(
    found: Sequence[Example], tools: dict[str, tuple[int, int]] | None = None, *, leave_out: str | None = None
) -> ConfidenceModel:
    """Fit a model on examples (``leave_out``: a server whose examples are not used).

    Args:
        found: Leave-one-out examples.
        tools: Per-tool repeated-call counts to keep with the model.
        leave_out: Cross-validation: the server the model will be scored on.
    """
    used = [e for e in found if e.server != leave_out]
    if not used:
        return PRIOR
    rows = np.array([e.x for e in used])
    labels = np.array([e.right for e in used], dtype=float)
    bias, weights = fit(rows, labels)
    return ConfidenceModel(bias, weights, len(used), int(labels.sum()), tools)


def _tool_counts(store: Store) -> dict[str, tuple[int, int]]:
    by_tool: dict[tuple[str, str], list[Recording]] = defaultdict(list)
    for rec in store.recordings(method="tools/call"):
        by_tool[(rec.server, rec.name)].append(rec)
    return {f"{s}\t{t}": repeated_calls(recs) for (s, t), recs in by_tool.items()}


def learn(
    store: Store,
    directory: Path,
    config: MatchConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ConfidenceModel:
    """Learn the confidence model of a store and keep it in its (current) index folder.

    Args:
        store: The recordings.
        directory: The index folder (built from ``store``); the model is written there.
        config: The matching config the replay will use.
        progress: Called with ``(done, total)`` now and then.

    Raises:
        VectorIndexError: The folder cannot be written.
    """
    from replay_sim.resolve.resolver import Resolver  # the resolver imports the judge

    resolver = Resolver(store, config=config, index_dir=directory, auto_index=False)
    model = learn_from(examples(resolver, progress), _tool_counts(store))
    model.save(directory)
    return model
