"""The leave-one-out examples kept beside the model, and which of them a grown store makes stale.

Learning the model forms one example per recording (:mod:`.leaveoneout`); the examples are kept in
the index folder (:data:`EXAMPLES_FILE`) with the store they were formed on and what else they
depend on (:func:`basis`). When the store grows, the model is fitted again on the kept examples
plus those formed afresh — at ``index build`` (:func:`plan`, :mod:`.learning`) and while a
writable store is served (:mod:`.growing`).

An example depends on more than its own recording: hiding one recording changes the candidates
its neighbours are offered. Every candidate of a hidden recording is a recording of the same tool
(its exact key, its canonical form, its nearest recording by embedding), its counts are the
tool's, and its state (and the gap to another state) is read through the server's tools'
effects. So a new recording of a tool makes every example of that tool stale, and a changed
effect on a server every example of that server; :func:`plan` forms exactly those again. What
else would change them — the listings (canonical forms), the matching config, the embedding
model, the feature set, a recording taken back — makes every example stale (:func:`plan` says
None: learn from scratch).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from replay_sim.errors import ReplaySimError
from replay_sim.resolve.confidence.features import FEATURES, repeated_calls
from replay_sim.resolve.confidence.forming import Resolver
from replay_sim.resolve.confidence.leaveoneout import Example, learn_from, validated
from replay_sim.resolve.confidence.model import ConfidenceModel, write_atomically
from replay_sim.store import Recording

__all__ = ["EXAMPLES_FILE", "Kept", "Plan", "basis", "digest", "fitted", "plan", "tool_counts"]

EXAMPLES_FILE = "confidence-examples.json"
"""The kept examples' file in the index folder (beside :data:`~.model.MODEL_FILE`)."""
_FORMAT = 1

Tool = tuple[str, str, str]
"""``(server, method, name)``."""


def digest(value: Any) -> str:
    """A short, stable digest of JSON data."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def basis(resolver: Resolver, servers: Iterable[str]) -> dict[str, Any]:
    """What the examples depend on besides the recordings: a change of any invalidates some.

    ``features``, ``config`` (the matching config), ``embedding`` (the index's model) and
    ``listings`` invalidate every example; ``effects`` (per server, a digest of its tools' effects)
    those of a server whose digest changed.
    """
    store = resolver.store
    try:
        embedding: str | None = resolver.index().model_id
    except ReplaySimError:
        embedding = None
    recorded = sorted(set(servers))
    listings = {
        name: store.listings(name) for name in sorted({*recorded, *(s.name for s in store.servers())})
    }
    effects = {}
    for server in recorded:
        verdicts = resolver.lookup.effects(server)
        effects[server] = digest(
            {
                t: [str(v.effect), v.source, [[k, str(w.effect)] for k, w in v.kinds]]
                for t, v in verdicts.items()
            }
        )
    return {
        "features": [f.name for f in FEATURES],
        "config": digest(resolver.config.as_dict()),
        "embedding": embedding,
        "listings": digest(listings),
        "effects": effects,
    }


def _bits(x: np.ndarray) -> str:
    """A 0/1 feature vector as digits (``"0100…"``, in :data:`FEATURES` order)."""
    return ((np.asarray(x) > 0).astype(np.uint8) + 48).tobytes().decode("ascii")


def _vector(bits: str) -> np.ndarray:
    """The feature vector of :func:`_bits`' digits."""
    return (np.frombuffer(bits.encode("ascii"), dtype=np.uint8) - 48).astype(float)


@dataclass(frozen=True)
class Kept:
    """Leave-one-out examples kept with the model.

    Attributes:
        examples: One per recording that had a candidate, by hidden recording id.
        on: The store's ``(calls, highest call id)`` the examples were formed on.
        basis: What they depend on besides the recordings (:func:`basis`) when last formed whole.
        stale: Tools with recordings added while serving (:mod:`.growing` forms only the new
            recordings' examples): the next ``index build`` forms every example of these again.
    """

    examples: tuple[Example, ...]
    on: tuple[int, int]
    basis: dict[str, Any]
    stale: frozenset[Tool] = field(default_factory=frozenset)

    def as_json(self) -> str:
        """The file's content: one example a line, ``[hidden, server, tool, kind, other_state,
        features as 0/1 digits, right]``."""
        head = {"format": _FORMAT, "on": list(self.on), "basis": self.basis, "stale": sorted(self.stale)}
        rows = [
            json.dumps([e.hidden, e.server, e.tool, e.kind, int(e.other_state), _bits(e.x), int(e.right)])
            for e in sorted(self.examples, key=lambda e: e.hidden)
        ]
        return json.dumps(head, sort_keys=True)[:-1] + ', "examples": [\n' + ",\n".join(rows) + "\n]}\n"

    def save(self, directory: Path) -> None:
        """Write them into an index folder (atomically).

        Raises:
            VectorIndexError: The folder cannot be written (names it).
        """
        write_atomically(directory / EXAMPLES_FILE, self.as_json(), "the confidence examples")

    @classmethod
    def load(cls, directory: Path | None) -> Kept | None:
        """The examples kept in an index folder, or None (none, unreadable or of another format)."""
        if directory is None:
            return None
        try:
            data = json.loads((directory / EXAMPLES_FILE).read_text(encoding="utf-8"))
            if data.get("format") != _FORMAT or len(data["basis"]["features"]) != len(FEATURES):
                return None
            found = tuple(
                Example(str(s), str(t), int(h), str(k), bool(o), _vector(str(x)), bool(r))
                for h, s, t, k, o, x, r in data["examples"]
            )
            stale = frozenset((str(a), str(b), str(c)) for a, b, c in data.get("stale", []))
            return cls(found, (int(data["on"][0]), int(data["on"][1])), dict(data["basis"]), stale)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError):
            return None


@dataclass(frozen=True)
class Plan:
    """What a grown store asks of the kept examples: those still valid, and what to form again.

    Attributes:
        keep: Kept examples of recordings nothing new touched.
        form: Recordings whose examples are formed again: the new ones, those of a tool that got
            new recordings (or is :attr:`Kept.stale`), those of a server whose effects changed.
        new: How many of ``form`` are recordings added since the examples were formed.
    """

    keep: list[Example]
    form: set[int]
    new: int


def plan(kept: Kept, recordings: Sequence[Recording], now: dict[str, Any]) -> Plan | None:
    """The examples a grown store can keep, or None when every one must be formed again.

    Args:
        kept: The kept examples.
        recordings: Every recording of the store now.
        now: The store's :func:`basis` now.
    """
    if any(kept.basis.get(k) != now.get(k) for k in ("features", "config", "embedding", "listings")):
        return None
    calls, last = kept.on
    if sum(1 for r in recordings if r.id <= last) != calls:
        return None  # recordings taken back (or another store): not a grown one
    new = [r for r in recordings if r.id > last]
    before, after = kept.basis.get("effects", {}), now.get("effects", {})
    changed = {s for s in after if s in before and before[s] != after[s]}
    touched = {(r.server, r.method, r.name) for r in new} | set(kept.stale)
    form = {r.id for r in recordings if (r.server, r.method, r.name) in touched or r.server in changed}
    return Plan([e for e in kept.examples if e.hidden not in form], form, len(new))


def tool_counts(recordings: Iterable[Recording]) -> dict[str, tuple[int, int]]:
    """Per tool (``server\\ttool``), its repeated calls that agreed and disagreed (what the model keeps)."""
    by_tool: dict[tuple[str, str], list[Recording]] = defaultdict(list)
    for rec in recordings:
        if rec.method == "tools/call":
            by_tool[(rec.server, rec.name)].append(rec)
    return {f"{s}\t{t}": repeated_calls(recs) for (s, t), recs in by_tool.items()}


def fitted(
    found: Sequence[Example],
    tools: dict[str, tuple[int, int]],
    on: tuple[int, int],
    update: dict[str, Any] | None = None,
) -> ConfidenceModel:
    """The model of a store's examples, with its own calibration and what it was learned on.

    Args:
        found: Every example, formed whole or kept and formed again (the same model either way).
        tools: Per tool, its repeated-call counts on the store ``on``.
        on: The store's ``(calls, highest call id)`` the examples and counts are of.
        update: How it was updated incrementally (None: learned from every recording).
    """
    ordered = sorted(found, key=lambda e: e.hidden)  # the order a whole learn forms them in
    return dataclasses.replace(
        learn_from(ordered, tools),
        calibration=validated(ordered),
        learned_on=on,
        source="learned" if update is None else "incremental",
        update=update,
    )
