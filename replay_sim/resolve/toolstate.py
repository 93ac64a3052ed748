"""Per-tool matching state: normalised recordings, canonical keys, identifier groups, threshold.

Built lazily by the resolver for one (server, tool) from that tool's recordings and thrown away
when the store changes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from replay_sim.canonical import answer_text, call_key, canonical_json, normalize
from replay_sim.freetext import looks_like_code
from replay_sim.resolve.calibration import Calibration, MatchConfig, calibrate_threshold, reflected_fields
from replay_sim.resolve.dialect import SchemaEvidence
from replay_sim.resolve.index import IndexSet, call_text
from replay_sim.resolve.invariance import Observation, apply, learn
from replay_sim.schema import ToolSchema
from replay_sim.store import Recording
from replay_sim.store.records import EPISODE_ORIGINS

__all__ = ["ToolState", "answer_of", "field_diffs"]

_DIFF_CHARS = 200


def answer_of(recording: Recording) -> str:
    """The canonical form of what the server said (:func:`~replay_sim.canonical.answer_text`)."""
    return answer_text(recording.result, recording.error)


def _short(value: Any) -> Any:
    """Keep diagnostics small: enormous values are cut to a readable prefix."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return value if len(text) <= _DIFF_CHARS else text[:_DIFF_CHARS] + "…"


def field_diffs(recorded: dict[str, Any], requested: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(name, recorded value, requested value)`` for every top-level argument that differs."""
    names = sorted(set(recorded) | set(requested))
    return [
        (n, _short(recorded.get(n)), _short(requested.get(n)))
        for n in names
        if canonical_json(recorded.get(n)) != canonical_json(requested.get(n))
    ]


class ToolState:
    """What the resolver knows about one tool's recordings.

    Args:
        server: Server name.
        schema: The tool's schema (config overrides applied).
        recordings: All its ``tools/call`` recordings, in recorded order.
        config: Matching config (floor, margin, reflection share, overrides).
        state_of: The state a recording was made from (equal states compare equal); learning
            which argument differences the server ignores compares calls made from one state.
    """

    def __init__(
        self,
        server: str,
        schema: ToolSchema,
        recordings: Sequence[Recording],
        config: MatchConfig,
        state_of: Callable[[Recording], Hashable],
    ) -> None:
        self.server = server
        self.schema = schema
        self.recordings = list(recordings)
        self.config = config
        self.override = config.override(server, schema.name)
        self.free_text = sorted(schema.free_text or ())
        # Recordings an episode's calls made (a sandbox, a backfill, an LLM): their arguments are
        # that episode's, never shown to another (:attr:`~replay_sim.resolve.resolution.Candidate.private`).
        self.private = frozenset(r.id for r in self.recordings if r.origin in EPISODE_ORIGINS)
        # What the server answered counts whatever the schema says of the arguments: servers coerce.
        valid = self.recordings
        self.evidence = SchemaEvidence(schema, self.recordings)
        # Free text some recording holds as code (SQL, an expression, a path): nothing is assumed of it.
        self.code_shaped = {
            f for f in self.free_text for r in valid if looks_like_code(str(r.arguments.get(f) or ""))
        }
        samples = [(r.arguments, canonical_json(r.result)) for r in valid if not r.failed]
        # An explicit free_text override is trusted; otherwise echoed text is an identifier.
        self.echoed = (
            set()
            if self.override.free_text is not None
            else reflected_fields(samples, self.free_text, config.reflect_fraction)
        )
        base = {r.id: schema.normalise(r.arguments) for r in valid}
        # Which differences the server ignores: shown by the recordings of a read-only tool. By
        # default, surrounding whitespace of prose it neither echoes nor stores, unless refuted.
        self.invariances = (
            learn(
                [Observation(state_of(r), base[r.id], answer_of(r), r.failed) for r in valid],
                assumed_space=[] if self.echoed else [f for f in self.free_text if f not in self.code_shaped],
            )
            if schema.read_only
            else {}
        )
        self.semantic = bool(
            self.free_text and not self.echoed and schema.read_only and self.override.semantic is not False
        )
        self.normalised: dict[int, dict[str, Any]] = {}
        self.canonical: dict[str, list[Recording]] = {}
        self._ckey: dict[int, str] = {}
        self._groups: dict[str, list[int]] = {}
        for rec in self.recordings:
            self.normalised[rec.id] = normalize(rec.arguments)
        for rec in valid:
            args = self.normalised[rec.id] = apply(base[rec.id], self.invariances)
            ckey = self._ckey[rec.id] = call_key(server, "tools/call", schema.name, args)
            self.canonical.setdefault(ckey, []).append(rec)
            self._groups.setdefault(self._identity(args), []).append(rec.id)
        self._threshold: float | None = None
        self.conflict: float | None = None
        self.calibration: Calibration | None = None

    def normalise(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Canonical-tier form of valid arguments: schema defaults, then the ignored differences."""
        return apply(self.schema.normalise(arguments), self.invariances)

    def _identity(self, normalised: dict[str, Any]) -> str:
        return canonical_json({k: v for k, v in normalised.items() if k not in self.free_text})

    def group(self, normalised: dict[str, Any]) -> list[int]:
        """Ids of valid recordings whose non-free-text arguments equal the call's."""
        return self._groups.get(self._identity(normalised), [])

    def same_call(self, recording_id: int) -> list[Recording]:
        """Every recording canonically equal to ``recording_id`` (one call, several states)."""
        return self.canonical[self._ckey[recording_id]]

    def semantic_ready(self, normalised: dict[str, Any], max_chars: int) -> bool:
        """Whether the semantic tier may judge this call (free text present, prose, not enormous)."""
        if not self.semantic or self.code_text(normalised):
            return False
        texts = [normalised.get(f) for f in self.free_text]
        present = [t for t in texts if t is not None]
        return bool(present) and all(isinstance(t, str) and len(t) <= max_chars for t in present)

    def code_text(self, arguments: dict[str, Any]) -> list[str]:
        """The free-text fields whose value is shaped like code: compared exactly, never by meaning."""
        return [f for f in self.free_text if isinstance(v := arguments.get(f), str) and looks_like_code(v)]

    def threshold(self, index: IndexSet) -> float:
        """The tool's semantic threshold (configured, or calibrated from its recordings once)."""
        if self.override.threshold is not None:
            return self.override.threshold
        if self._threshold is None:
            ids = sorted(self._ckey)
            part = index.partition(self.server, self.schema.name)
            if part is None or not ids:
                self._threshold = 2.0
                return self._threshold
            by_id = {r.id: r for r in self.recordings}
            vectors = part.vectors(ids).astype(np.float32)
            texts = [call_text(self.normalised[i], self.free_text) for i in ids]
            answers = [answer_of(by_id[i]) for i in ids]
            floor = self.config.floor if self.override.floor is None else self.override.floor
            margin = self.config.margin if self.override.margin is None else self.override.margin
            self.calibration = calibrate_threshold(
                vectors, texts, answers, floor, margin, self.config.evidence_band, self.config.evidence_pairs
            )
            self.conflict = self.calibration.conflict
            # No evidence near the threshold, no semantic answers (see calibration's docstring).
            self._threshold = self.calibration.threshold if self.calibration.calibrated else 2.0
        return self._threshold

    def lexical_nearest(self, normalised: dict[str, Any], k: int) -> list[tuple[int, float]]:
        """Nearest recordings by share of equal arguments (when no embeddings are available)."""
        scored = []
        for rid, args in self.normalised.items():
            names = set(args) | set(normalised)
            same = sum(canonical_json(args.get(n)) == canonical_json(normalised.get(n)) for n in names)
            scored.append((rid, same / len(names) if names else 1.0))
        return sorted(scored, key=lambda p: (-p[1], p[0]))[:k]
