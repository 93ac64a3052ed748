"""A confidence on every resolution, and the operating point that decides what is served.

The resolver hands each resolution to :meth:`Confidence.judge`: a hit gets the confidence of the
recording it serves; a miss gets the confidence of the best candidate the store holds
(:func:`~replay_sim.resolve.confidence.forming.form`). Where an operating point is set
(``--min-confidence P``, the matching config's per-tool ``min_confidence``, or per request), a hit
below it becomes a miss (the miss policy runs) and a miss whose candidate reaches it is served.
Without one, nothing changes but the provenance: today's strict tiers decide.

An exact hit costs a dict lookup once its recording was judged (the hot path): the confidence
depends only on the recording, how it matched and whether it came from the episode's state.

When a served writable store grows past what the model was learned on, :class:`~.growing.Growth`
refits it in the background and the judge swaps the new model in (:meth:`Confidence.adopt`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from replay_sim.errors import ReplaySimError
from replay_sim.resolve.calibration import MatchConfig
from replay_sim.resolve.confidence.features import Formed, bearing, describe
from replay_sim.resolve.confidence.forming import KIND_TIER, Resolver, Signatures, form, from_hit
from replay_sim.resolve.confidence.growing import Growth
from replay_sim.resolve.confidence.model import ConfidenceModel
from replay_sim.resolve.confidence.population import prior
from replay_sim.resolve.confidence.repeats import RepeatedCalls
from replay_sim.resolve.lineage import DIVERGED, Trail
from replay_sim.resolve.reasons import differences_from
from replay_sim.resolve.resolution import Candidate, Problem, Resolution, Tier

__all__ = ["Confidence", "Judged"]

Judged = tuple[float, tuple[tuple[str, float], ...]]
"""A confidence and the features that drove it."""
_UNSERVED = frozenset({Problem.UNKNOWN_TOOL})


class Confidence:
    """Judges resolutions with a confidence model and gates them at an operating point.

    Args:
        model: The learned model (None: the population's, :func:`~.population.prior`).
        config: The matching config (its default and per-tool ``min_confidence``).
        min_confidence: The operating point set by the caller (``serve --min-confidence``); None
            leaves the config's, and without either the strict tiers decide alone.
        directory: The index folder the model was read from: where its kept examples are, which
            a growing store's refits start from (None: the model never changes).
    """

    def __init__(
        self,
        model: ConfidenceModel | None,
        config: MatchConfig,
        min_confidence: float | None = None,
        directory: Path | None = None,
    ) -> None:
        self.model = model or prior()
        self.growth = None if directory is None else Growth(directory, self.adopt, lambda: self.model)
        self.config = config
        self.min_confidence = min_confidence
        self._judged: dict[tuple[Any, ...], Judged] = {}
        self._repeated: dict[tuple[str, str, str], tuple[int, int]] = {}
        self._counted = RepeatedCalls()  # counted again from the recordings added since
        self._exact: dict[tuple[int, float | None], Resolution] = {}  # the hot path: judged exact hits
        self._signatures: Signatures | None = None  # formed on need, forgotten with what was judged
        self._lock = threading.Lock()
        self._version: object = None
        self._mark: object = None

    @classmethod
    def load(
        cls, directory: Path | None, config: MatchConfig, min_confidence: float | None = None
    ) -> Confidence:
        """The confidence judge with the model kept in an index folder (if any)."""
        return cls(ConfidenceModel.load(directory), config, min_confidence, directory)

    def adopt(self, model: ConfidenceModel) -> None:
        """Serve ``model`` from now on (a refit, :mod:`~.growing`), forgetting what the old one judged."""
        with self._lock:
            self.model = model
            self._judged.clear()
            self._repeated.clear()
            self._exact.clear()
            self._signatures = None

    def clear(self) -> None:
        """Forget what was judged (the store changed)."""
        with self._lock:
            self._judged.clear()
            self._repeated.clear()
            self._exact.clear()
            self._signatures = None

    def operating_point(self, server: str, tool: str, requested: float | None = None) -> float | None:
        """The confidence an answer of this tool must reach: per request, per tool, served, default."""
        if requested is not None:
            return requested
        over = self.config.override(server, tool).min_confidence
        if over is not None:
            return over
        return self.min_confidence if self.min_confidence is not None else self.config.min_confidence

    def judge_miss(
        self,
        resolver: Resolver,
        server: str,
        method: str,
        name: str,
        arguments: dict[str, Any],
        history: Sequence[str] | Trail,
        miss: Resolution,
    ) -> Resolution:
        """A miss a sandbox was to answer, served as a miss after all (no instance answered it), with
        its best candidate's confidence: judged only now (:meth:`judge`; ``arguments`` redacted,
        ``history`` as :meth:`Resolver.resolve`'s). Anything but such a miss is returned as it is."""
        if miss.tier is not Tier.MISS or miss.confidence is not None or server not in resolver.lookup.strict:
            return miss
        try:
            trail = resolver.lookup.trail(history)
            return self.judge(resolver, server, method, name, arguments, trail, miss, sandboxed_misses=True)
        except ReplaySimError:  # (an unreadable store): served without a confidence
            return miss

    def _repeats(self, resolver: Resolver, server: str, method: str, name: str) -> tuple[int, int]:
        key = (server, method, name)
        found = self._repeated.get(key)
        if found is None:
            mark = resolver.version()
            now = None if mark is None else (mark.calls, mark.last)
            kept = self.model.counts(server, name, now) if method == "tools/call" else None
            found = kept or self._counted.of(resolver.store, server, method, name)
            self._repeated[key] = found
        return found

    def _current(self, resolver: Resolver) -> None:
        """Forget what was judged when the store's recordings changed (counts may have)."""
        mark = resolver.version()
        if mark is self._mark:
            return
        seen = None if mark is None else (mark.surface, mark.calls, mark.last)
        if seen != self._version:
            self.clear()
            self._version = seen
            grown = mark is not None and self.model.learned_on not in (None, (mark.calls, mark.last))
            if grown and self.growth is not None:
                self.growth.grew(resolver)  # the model was learned on a smaller store: refit it
        self._mark = mark

    def features(self, resolver: Resolver, formed: Formed, method: str) -> np.ndarray:
        """A candidate's feature vector, read from the store as it is now."""
        rec = formed.recording
        effect = resolver.lookup.effect(rec.server, rec.name) if method == "tools/call" else None
        repeats = self._repeats(resolver, rec.server, method, rec.name)
        same_call = bearing(formed, resolver.lookup.by_key(rec.key), resolver.lookup.state_of)
        signatures = self._signatures
        if signatures is None:  # (read once: another thread may forget them meanwhile)
            signatures = self._signatures = Signatures(resolver)
        return describe(formed, same_call, repeats, effect, separated=signatures.separated_from(rec))

    def of(self, resolver: Resolver, formed: Formed, method: str) -> Judged:
        """The confidence of a candidate, and its drivers (cached per recording and match)."""
        rec = formed.recording
        self._current(resolver)
        gap = tuple(g.id for g, _ in formed.gap)
        cache = (
            rec.id,
            formed.kind,
            formed.other_state,
            formed.diverged,
            formed.score,
            formed.same_identifiers,
            gap,
        )
        found = self._judged.get(cache)
        if found is None:
            model = self.model
            x = self.features(resolver, formed, method)
            found = (round(model.predict(x), 4), model.explain(x))
            if model is self.model:  # not swapped meanwhile (:meth:`adopt`)
                self._judged[cache] = found
        return found

    def judge(
        self,
        resolver: Resolver,
        server: str,
        method: str,
        name: str,
        arguments: dict[str, Any],
        trail: Trail,
        resolution: Resolution,
        requested: float | None = None,
        *,
        sandboxed_misses: bool = False,
    ) -> Resolution:
        """``resolution`` with its confidence, served or refused at the call's operating point.

        A miss of a server a sandbox answers (:attr:`~replay_sim.resolve.lineage.StateLookup.strict`)
        with no operating point is left unjudged (confidence None): its instance answers it, and
        forming its best candidate — an exact recording from another state, weighed against every
        recording of its call — would be work for nothing on the sandbox's answer path. It is
        judged (``sandboxed_misses``) when it is served as a miss after all
        (:meth:`judge_miss`).

        Args:
            resolver: The resolver that resolved the call.
            server: Recorded server name.
            method: The MCP method.
            name: The tool, prompt or resource.
            arguments: The call's arguments.
            trail: The episode's trail (before this call).
            resolution: What the strict tiers answered.
            requested: The request's own operating point (``_meta``), if any.
            sandboxed_misses: Judge a miss a sandbox was to answer too.
        """
        exact = resolution.recording.id if resolution.tier is Tier.EXACT and resolution.recording else None
        if exact is not None:  # an exact hit judged before: a dict lookup
            self._current(resolver)
            found = self._exact.get((exact, requested))
            if found is not None:
                return found
        model = self.model
        point = self.operating_point(server, name, requested)
        formed = from_hit(resolution)
        if formed is None and resolution.tier is Tier.MISS:
            if point is None and not sandboxed_misses and server in resolver.lookup.strict:
                return resolution
            nearest = [(c.recording_id, c.score) for c in resolution.candidates]
            formed = form(resolver, server, method, name, arguments, trail, nearest=nearest)
        if formed is None:
            return resolution
        confidence, drivers = self.of(resolver, formed, method)
        judged = dataclasses.replace(resolution, confidence=confidence, drivers=drivers)
        if resolution.hit and point is not None and confidence < point:
            return self._refused(resolver, server, method, name, arguments, judged, point)
        if exact is not None and model is self.model:
            self._exact[(exact, requested)] = judged  # the same recording, key and step every time
        if point is None:
            return judged
        if not resolution.hit and confidence >= point and resolution.problem not in _UNSERVED:
            rec = formed.recording
            state = "another state" if formed.other_state else "this state"
            return dataclasses.replace(
                judged, tier=KIND_TIER[formed.kind], score=formed.score, recording=rec, step=rec.key,
                differences=differences_from(rec, arguments) if formed.kind != "exact" else [],
                candidates=[], problem=None,
                reason=f"served at confidence {confidence:.3f} >= {point} ({formed.kind} match "
                f"recorded from {state}; strict tiers: {resolution.reason or 'miss'})",
            )  # fmt: skip
        return judged

    def _refused(
        self,
        resolver: Resolver,
        server: str,
        method: str,
        name: str,
        arguments: dict[str, Any],
        hit: Resolution,
        point: float,
    ) -> Resolution:
        """A hit whose confidence is below the operating point, as a miss the miss policy answers."""
        rec = hit.recording
        assert rec is not None and hit.confidence is not None
        changes = method == "tools/call" and resolver.lookup.changes_state(server, name, arguments)
        return dataclasses.replace(
            hit, tier=Tier.MISS, score=0.0, recording=None, step=(DIVERGED if changes else "") + hit.key,
            candidates=[Candidate(rec.id, hit.score, hit.differences)], differences=[],
            reason=f"recording #{rec.id} answers this {hit.tier.value}ly, but its confidence "
            f"{hit.confidence:.3f} is below the operating point {point}",
        )  # fmt: skip
