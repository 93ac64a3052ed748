"""Matching configuration and per-tool threshold calibration.

Each tool's semantic threshold comes from its own recordings: it sits above the highest cosine
similarity between two recorded calls of that tool whose free text differed *and* whose real
results differed, and never below a floor. Free-text fields the tool echoes back in its results
(``echo``, substring search) are treated as identifiers: for such tools any change of the text
changes the answer, whatever its meaning.

Per-tool overrides live in a TOML file (``replay-sim.toml`` by convention)::

    [defaults]
    floor = 0.9            # a calibrated threshold is never below this
    margin = 0.02          # threshold = max(floor, highest conflicting similarity + margin)
    semantic = true        # allow the semantic tier at all

    [tools."memory/search_nodes"]   # "<server>/<tool>"; "*/<tool>" matches any server
    free_text = ["query"]           # the fields compared by meaning (replaces the heuristic)
    identifiers = ["query"]         # fields always compared exactly
    threshold = 0.95                # fixed threshold, no calibration
    floor = 0.93
    semantic = false                # exact and canonical tiers only
    read_only = true                # overrides annotations.readOnlyHint
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

__all__ = ["MatchConfig", "ToolOverride", "calibrate_threshold", "reflected_fields"]

_OVERRIDE_KEYS = {"free_text", "identifiers", "threshold", "floor", "margin", "semantic", "read_only"}


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


@dataclass(frozen=True, slots=True)
class MatchConfig:
    """How calls are matched: threshold floor and margin, and per-tool overrides.

    Attributes:
        floor: Lowest threshold calibration may produce.
        margin: Added to the highest conflicting similarity.
        semantic: Whether the semantic tier is enabled at all.
        reflect_fraction: A free-text field is "echoed" when at least this share of a tool's
            successful recordings contain its value verbatim (case-insensitively).
        tools: Overrides by ``"server/tool"`` or ``"*/tool"``.
    """

    floor: float = 0.9
    margin: float = 0.02
    semantic: bool = True
    reflect_fraction: float = 0.25
    tools: dict[str, ToolOverride] = field(default_factory=dict)

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
        unknown = set(defaults) - {"floor", "margin", "semantic", "reflect_fraction"}
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
                tools=tools,
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


def _boolean(value: Any) -> bool:
    """A TOML boolean; ``"false"`` or ``0`` must not silently mean true."""
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def calibrate_threshold(
    vectors: np.ndarray, texts: Sequence[str], answers: Sequence[str], floor: float, margin: float
) -> tuple[float, float]:
    """A tool's semantic threshold from its recordings.

    Args:
        vectors: Unit vectors of the recordings' call texts, one row each.
        texts: The call texts (pairs with equal text are skipped: their results differ by state).
        answers: Canonical answers (result or error) of the recordings.
        floor: Lowest allowed threshold.
        margin: Added to the highest conflicting similarity.

    Returns:
        ``(threshold, highest conflicting similarity)``; a threshold above 1 disables the tier.
    """
    worst = -1.0
    n = len(texts)
    for start in range(0, n, 1024):  # blocks keep memory flat for big tools
        sims = vectors[start : start + 1024] @ vectors.T
        for i in range(sims.shape[0]):
            row = start + i
            for j in np.argsort(-sims[i]):
                if sims[i, j] <= worst:
                    break
                if answers[j] != answers[row] and texts[j] != texts[row]:
                    worst = float(sims[i, j])
                    break
    return max(floor, worst + margin), worst


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
