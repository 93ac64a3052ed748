"""Matching configuration and per-tool threshold calibration.

Each tool's semantic threshold comes from its own recordings: it sits above the highest cosine
similarity between two recorded calls of that tool whose free text differed *and* whose real
results differed, and never below a floor. Free-text fields the tool echoes back in its results
(``echo``, substring search) are treated as identifiers: for such tools any change of the text
changes the answer, whatever its meaning.

A threshold counts as calibrated only when the recordings hold **evidence near it**: at least
``evidence_pairs`` (default 2) pairs of recorded calls with different free text and different
answers whose similarity lies within ``evidence_band`` (default 0.1) below the threshold — with the
default floor, pairs at cosine 0.8 or more, texts that share most of their words. Without such
pairs the threshold is only the floor, and nothing recorded says whether texts that close mean the
same to *this* tool: code-like text (SQL's ``ASC``/``DESC``, a literal's case) scores 0.9 to 1.0
while its answers differ, and a tool whose recordings are all far apart (three unrelated queries)
tells nothing about its neighbourhoods. So without evidence the semantic tier does not answer for
the tool (the miss says so). Why these values: a pair far below the threshold (two unrelated
queries at 0.3) constrains nothing where the tier decides; 0.1 below it is the nearest band that
still holds the pairs a user actually records (one word swapped or added); and one pair can be a
quirk of one text, while two distinct pairs show the tool separating close texts more than once.
A threshold fixed in the config (``threshold = …``) is the operator's judgement and is used as is.

Per-tool overrides live in a TOML file (``replay-sim.toml`` by convention)::

    [defaults]
    floor = 0.9            # a calibrated threshold is never below this
    margin = 0.02          # threshold = max(floor, highest conflicting similarity + margin)
    semantic = true        # allow the semantic tier at all
    evidence_pairs = 2     # conflicting pairs needed near the threshold to trust it
    evidence_band = 0.1    # "near": at most this far below the threshold

    [tools."memory/search_nodes"]   # "<server>/<tool>"; "*/<tool>" matches any server
    free_text = ["query"]           # the fields compared by meaning (replaces the heuristic)
    identifiers = ["query"]         # fields always compared exactly
    threshold = 0.95                # fixed threshold, no calibration
    floor = 0.93
    semantic = false                # exact and canonical tiers only
    read_only = true                # overrides annotations.readOnlyHint
    min_confidence = 0.99           # this tool's answers need this confidence (see below)

``min_confidence`` (in ``[defaults]`` or per tool) is an operating point: an answer is served
when its learned confidence (:mod:`replay_sim.resolve.confidence`) reaches it, else the miss
policy runs. Unset, the strict tiers decide alone (a tool whose wrong answer is costly can demand
more than ``serve --min-confidence``; the per-tool value wins over the command's).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from replay_sim.errors import ConfigError
from replay_sim.schema import ToolSchema

__all__ = ["Calibration", "MatchConfig", "ToolOverride", "calibrate_threshold", "reflected_fields"]

_OVERRIDE_KEYS = {
    "free_text", "identifiers", "threshold", "floor", "margin", "semantic", "read_only", "min_confidence"
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ToolOverride:
    """Settings for one tool (None: use the default / the schema heuristic)."""

    free_text: tuple[str, ...] | None = None
    identifiers: tuple[str, ...] = ()
    threshold: float | None = None
    floor: float | None = None
    margin: float | None = None
    semantic: bool | None = None
    read_only: bool | None = None
    min_confidence: float | None = None


@dataclass(frozen=True, slots=True)
class MatchConfig:
    """How calls are matched: threshold floor and margin, and per-tool overrides.

    Attributes:
        floor: Lowest threshold calibration may produce.
        margin: Added to the highest conflicting similarity.
        semantic: Whether the semantic tier is enabled at all.
        reflect_fraction: A free-text field is "echoed" when at least this share of a tool's
            successful recordings contain its value verbatim (case-insensitively).
        evidence_pairs: Pairs with different answers needed near a threshold to trust it.
        evidence_band: How far below the threshold such a pair may lie.
        tools: Overrides by ``"server/tool"`` or ``"*/tool"``.
        min_confidence: The operating point of every tool without its own (None: strict tiers only).
    """

    floor: float = 0.9
    margin: float = 0.02
    semantic: bool = True
    reflect_fraction: float = 0.25
    evidence_pairs: int = 2
    evidence_band: float = 0.1
    tools: dict[str, ToolOverride] = field(default_factory=dict)
    min_confidence: float | None = None

    @classmethod
    def load(cls, path: str | Path) -> MatchConfig:
        """Read a TOML matching config.

        Raises:
            ConfigError: The file is unreadable, not TOML, or has an unknown/mistyped entry.
        """
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read matching config: {exc}") from exc
        return cls.from_dict(data, str(path))

    @classmethod
    def from_dict(cls, data: dict[str, Any], path: str = "matching config") -> MatchConfig:
        """A config from TOML-shaped data (``defaults`` and ``tools`` tables), as :meth:`as_dict` writes it.

        Raises:
            ConfigError: An unknown or mistyped entry (the message names ``path`` and the entry).
        """
        defaults, table = data.get("defaults", {}), data.get("tools", {})
        if not isinstance(defaults, dict) or not isinstance(table, dict):
            raise ConfigError(f"{path}: [defaults] and [tools] must be tables")
        unknown = set(defaults) - {
            "floor", "margin", "semantic", "reflect_fraction", "evidence_pairs", "evidence_band",
            "min_confidence",
        }  # fmt: skip
        if unknown:
            raise ConfigError(f"{path}: [defaults] has unknown keys {sorted(unknown)}")
        tools: dict[str, ToolOverride] = {}
        for name, entry in table.items():
            where = f"{path}: [tools.{name!r}]"
            if "/" not in name or not isinstance(entry, dict):
                raise ConfigError(f'{where}: expected a table named "<server>/<tool>" or "*/<tool>"')
            if bad := set(entry) - _OVERRIDE_KEYS:
                raise ConfigError(f"{where}: unknown keys {sorted(bad)} (allowed: {sorted(_OVERRIDE_KEYS)})")
            try:
                tools[name] = ToolOverride(
                    free_text=None if "free_text" not in entry else _names(entry["free_text"]),
                    identifiers=_names(entry.get("identifiers", [])),
                    threshold=None if "threshold" not in entry else float(entry["threshold"]),
                    floor=None if "floor" not in entry else float(entry["floor"]),
                    margin=None if "margin" not in entry else float(entry["margin"]),
                    semantic=None if "semantic" not in entry else _boolean(entry["semantic"]),
                    read_only=None if "read_only" not in entry else _boolean(entry["read_only"]),
                    min_confidence=_probability(entry.get("min_confidence")),
                )
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"{where}: {exc}") from exc
        base = cls()  # instance defaults: on a slots dataclass ``cls.floor`` is a descriptor, not 0.9
        try:
            return cls(
                floor=float(defaults.get("floor", base.floor)),
                margin=float(defaults.get("margin", base.margin)),
                semantic=_boolean(defaults.get("semantic", base.semantic)),
                reflect_fraction=float(defaults.get("reflect_fraction", base.reflect_fraction)),
                evidence_pairs=_count(defaults.get("evidence_pairs", base.evidence_pairs)),
                evidence_band=float(defaults.get("evidence_band", base.evidence_band)),
                tools=tools,
                min_confidence=_probability(defaults.get("min_confidence")),
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{path}: [defaults]: {exc}") from exc

    def override(self, server: str, tool: str) -> ToolOverride:
        """The override for a tool (exact server first, then ``*``), or an empty one."""
        return self.tools.get(f"{server}/{tool}") or self.tools.get(f"*/{tool}") or ToolOverride()

    def apply(self, server: str, schema: ToolSchema) -> ToolSchema:
        """``schema`` with this config's overrides for it applied."""
        over = self.override(server, schema.name)
        if over == ToolOverride():
            return schema
        return ToolSchema(
            schema.name,
            schema.input_schema,
            schema.annotations,
            free_text=None if over.free_text is None else frozenset(over.free_text),
            identifiers=frozenset(over.identifiers),
            read_only=over.read_only,
        )

    def as_dict(self) -> dict[str, Any]:
        """The config as plain JSON data in the TOML file's shape (recorded in snapshot manifests)."""
        data = dataclasses.asdict(self)
        tools = data.pop("tools")
        if data["min_confidence"] is None:  # unset: the same config (and snapshot id) as before it existed
            del data["min_confidence"]
        data = {"defaults": data}
        data["tools"] = {
            name: {k: v for k, v in over.items() if v not in (None, ())} for name, over in tools.items()
        }
        return json.loads(json.dumps(data, sort_keys=True))

    def token(self) -> str:
        """A short hash of the whole config."""
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()[:16]


def _names(value: Any) -> tuple[str, ...]:
    """A TOML list of field names; a bare string must not become a tuple of its letters."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"expected a list of field names, got {value!r}")
    return tuple(value)


def _probability(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise ValueError(f"min_confidence must be a number from 0 to 1, not {value!r}")
    return float(value)


def _count(value: Any) -> int:
    """A TOML integer that is not negative (``true`` is not 1)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"expected a whole number of pairs, got {value!r}")
    return value


def _boolean(value: Any) -> bool:
    """A TOML boolean; ``"false"`` or ``0`` must not silently mean true."""
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Calibration:
    """A tool's threshold and the evidence behind it.

    Attributes:
        threshold: ``max(floor, conflict + margin)``; above 1 the tier cannot answer.
        conflict: Highest similarity of two recordings with different text and different answers
            (-1 when there is none).
        near: Distinct pairs of such recordings within ``band`` below the threshold.
        needed: Pairs required for the threshold to count as calibrated.
        band: How far below the threshold a pair may lie to count.
    """

    threshold: float
    conflict: float
    near: int
    needed: int
    band: float

    @property
    def calibrated(self) -> bool:
        """Whether the recordings hold enough evidence near the threshold to trust it."""
        return self.near >= self.needed


def _codes(values: Sequence[str]) -> np.ndarray:
    """Equal strings get equal integers (vectorised equality tests)."""
    seen: dict[str, int] = {}
    return np.array([seen.setdefault(v, len(seen)) for v in values], dtype=np.int64)


def calibrate_threshold(
    vectors: np.ndarray,
    texts: Sequence[str],
    answers: Sequence[str],
    floor: float,
    margin: float,
    band: float = 0.1,
    pairs: int = 2,
) -> Calibration:
    """A tool's semantic threshold from its recordings, and the evidence for it.

    Args:
        vectors: Unit vectors of the recordings' call texts, one row each.
        texts: The call texts (pairs with equal text are skipped: their results differ by state).
        answers: Canonical answers (result or error) of the recordings.
        floor: Lowest allowed threshold.
        margin: Added to the highest conflicting similarity.
        band: A conflicting pair counts as evidence within this distance below the threshold.
        pairs: Distinct conflicting text pairs needed near the threshold.

    Returns:
        The :class:`Calibration`; a threshold above 1 disables the tier.
    """
    n = len(texts)
    text_codes, answer_codes = _codes(texts), _codes(answers)
    worst = -1.0
    closest: dict[tuple[int, int], float] = {}  # distinct text pair -> its highest similarity
    lowest = floor - band  # the threshold is never below the floor: nothing lower can count
    step = max(1, min(1024, (1 << 22) // max(n, 1)))  # blocks keep memory flat for big tools
    for start in range(0, n, step):
        sims = vectors[start : start + step] @ vectors.T
        rows = slice(start, start + step)
        conflict = (answer_codes[rows, None] != answer_codes[None, :]) & (
            text_codes[rows, None] != text_codes[None, :]
        )
        if not conflict.any():
            continue
        worst = max(worst, float(sims[conflict].max()))
        for i, j in zip(*np.nonzero(conflict & (sims >= lowest)), strict=True):
            a, b = sorted((int(text_codes[start + i]), int(text_codes[j])))
            closest[(a, b)] = max(closest.get((a, b), -1.0), float(sims[i, j]))
    threshold = max(floor, worst + margin)
    near = sum(1 for similarity in closest.values() if similarity >= threshold - band)
    return Calibration(threshold, worst, near, pairs, band)


def reflected_fields(
    samples: Sequence[tuple[dict[str, Any], str]], fields: Sequence[str], fraction: float
) -> set[str]:
    """Free-text fields a tool echoes back verbatim in its results.

    Args:
        samples: ``(arguments, result text)`` of successful recordings.
        fields: Candidate free-text fields.
        fraction: Share of samples (with a value of 3+ characters) that must contain it.

    Returns:
        The echoed fields.
    """
    found = set()
    lowered = [(args, text.lower()) for args, text in samples]
    for name in fields:
        values = [(str(a[name]).strip().lower(), t) for a, t in lowered if isinstance(a.get(name), str)]
        values = [(v, t) for v, t in values if len(v) >= 3]
        if values and sum(v in t for v, t in values) >= max(1.0, fraction * len(values)):
            found.add(name)
    return found
