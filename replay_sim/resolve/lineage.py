"""Episode state: which recordings were made from the state an episode is in.

A server's answers depend on the state-changing calls made before them. A recording is made from
this episode's state when the *state-changing* calls before it in its recorded session (calls of
tools not known to be effect-free, that did not fail) are exactly the ones this episode made, in
order. Which tools are effect-free is declared (the matching config, ``readOnlyHint``) or learned
from the recordings (:mod:`replay_sim.effects`: a read that gave the same answer before and after
a tool's calls; a read-only hint is dropped when recordings of one call from one state disagree).
Effect-free calls never change state, so they are ignored when comparing; they only break ties
(the longest common tail of the whole history wins, then the earliest recording).

Once an episode makes a state-changing call that no recording answers, the real server's state is
unknown, and every later call of that episode is a miss: a stale answer would be something the
real server would not have said.

An episode's history is a :class:`Trail` of *steps*, one per call: the key of the recording that
answered it, or — for a miss — the requested key, marked with :data:`DIVERGED` when the call
changed state. Steps describe themselves, so one episode's calls never affect another's, and the
trail keeps its derived state up to date as it grows: a call costs the same at step 5 and 5,000.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import sys
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from replay_sim.canonical import answer_text
from replay_sim.effects import Call, Declaration, Verdict, declare, learn
from replay_sim.errors import StoreError
from replay_sim.resolve.calibration import MatchConfig
from replay_sim.resolve.schemas import RecordedSchemas
from replay_sim.schema import ToolSchema
from replay_sim.store import Recording, Store

__all__ = [
    "DIVERGED",
    "EFFECTS_META_PREFIX",
    "StateLookup",
    "Trail",
    "history_affinity",
    "keep_effects",
    "recorded_effects",
    "remembered_effects",
    "store_effects",
]

DIVERGED = "!"
"""Prefix of the step of a state-changing call no recording answered."""

EFFECTS_META_PREFIX = "effects:"
"""Meta key prefix (then the server's name) of the verdicts a store keeps (:func:`remembered_effects`)."""


def history_affinity(recording: Recording, history: Sequence[str], prefix: Sequence[str]) -> int:
    """How many trailing calls of the recording's session prefix this episode's history repeats."""
    matched = 0
    for recorded, made in zip(reversed(prefix), reversed(history), strict=False):
        if recorded != made:
            break
        matched += 1
    return matched


class _LRU(OrderedDict[str, Any]):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def put(self, key: str, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        if len(self) > self.size:
            self.popitem(last=False)


class Trail:
    """One episode's steps on one server, with what they imply kept current.

    Attributes:
        steps: One per call, oldest first (see the module docstring).
        state: The state-changing recorded calls among them, in order.
        diverged: The first step that changed state without a recording, if any.
    """

    __slots__ = ("diverged", "state", "steps")

    def __init__(self) -> None:
        self.steps: list[str] = []
        self.state: tuple[str, ...] = ()
        self.diverged: str | None = None

    def __len__(self) -> int:
        return len(self.steps)


def _dry_run(tool: str, arguments: Any) -> bool:
    """Whether a call asks for a dry run (:meth:`~replay_sim.schema.ToolSchema.changes_state`)."""
    return not ToolSchema(tool, {}).changes_state(arguments)


def recorded_effects(
    store: Store, server: str, schema: Callable[[str, str], Any], config: MatchConfig | None = None
) -> dict[str, Verdict]:
    """Every tool's effect on one recorded server, declared or learned (:func:`replay_sim.effects.learn`).

    Args:
        store: The recording store.
        server: Recorded server name.
        schema: ``(server, tool) -> ToolSchema | None`` (annotations).
        config: The matching config, whose ``read_only`` overrides any annotation or evidence.

    Returns:
        Verdicts by tool name: every listed tool and every tool recorded.
    """
    return _learned(store, server, schema, config or MatchConfig())[0]


def _learned(
    store: Store, server: str, schema: Callable[[str, str], Any], config: MatchConfig
) -> tuple[dict[str, Verdict], dict[str, Declaration]]:
    """:func:`recorded_effects`, and the declarations they were learned with."""
    outcomes = store.outcomes(server)  # not Recordings: a large store's are slow to build
    # Failed as Recording.failed says: a JSON-RPC error, or an isError result.
    failed = [
        error is not None or bool((result or {}).get("isError")) for *_, result, error, _, _ in outcomes
    ]
    succeeded: dict[str, bool] = defaultdict(bool)
    for (_, _, _, key, *_), fails in zip(outcomes, failed, strict=True):
        succeeded[key] |= not fails
    sessions: dict[Any, list[tuple[int, Call]]] = defaultdict(list)
    for (rid, method, name, key, arguments, result, error, session, seq), fails in zip(
        outcomes, failed, strict=True
    ):
        inert = method != "tools/call" or not succeeded[key] or _dry_run(name, arguments)
        call = Call(rid, method, name, key, answer_text(result, error), fails, inert)
        # A call recorded outside any session is a session of its own, from the initial state.
        sessions[session if session is not None else ("", rid)].append((seq or 0, call))
    runs = [
        [c for _, c in sorted(calls, key=lambda sc: (sc[0], sc[1].id or 0))] for calls in sessions.values()
    ]
    names = {name for _, method, name, *_ in outcomes if method == "tools/call"}
    declared = _declarations(server, names, schema, config)
    return learn(runs, declared), declared


def _declarations(
    server: str, called: Iterable[str], schema: Callable[[str, str], Any], config: MatchConfig
) -> dict[str, Declaration]:
    """The declared effect of every tool called or listed (every listed tool gets a verdict)."""
    names = set(called)
    listed = getattr(schema, "tools", None)
    if callable(listed):
        names |= set(listed(server) or ())
    declared: dict[str, Declaration] = {}
    for name in names:
        tool = schema(server, name)
        declared[name] = declare(
            None if tool is None else tool.annotations, config.override(server, name).read_only
        )
    return declared


@functools.cache
def _learner() -> str:
    """A digest of the code that decides a verdict ("" when it cannot be read: nothing is kept).

    Kept verdicts learned by other code are learned again, so a change of what the evidence
    means never leaves a store answering with verdicts the running code would not reach.
    """
    digest = hashlib.sha256()
    try:
        # The modules' source, named (a function may be wrapped); __name__ is _learned's.
        for module in (learn.__module__, answer_text.__module__, ToolSchema.__module__, __name__):
            digest.update(Path(str(sys.modules[module].__file__)).read_bytes())
    except (OSError, KeyError):
        return ""
    return digest.hexdigest()[:16]


def _declared_json(declared: dict[str, Declaration]) -> dict[str, list[Any]]:
    return {t: [str(d.effect), d.fixed, d.source, d.reason] for t, d in sorted(declared.items())}


def remembered_effects(
    store: Store,
    server: str,
    schema: Callable[[str, str], Any],
    config: MatchConfig | None = None,
    *,
    wait: bool = False,
) -> dict[str, Verdict]:
    """:func:`recorded_effects`, kept in the store's meta: learned once per state of the store.

    The verdicts kept under :data:`EFFECTS_META_PREFIX` + ``server`` are used when nothing they
    were learned from moved: the calls (append-only: the store's fingerprint), every tool's
    declaration (listings and the matching config) and the code that learns them. Otherwise they
    are learned again, and kept when the store is writable and no other process is writing it
    (a server never waits to keep them; with ``wait``, another writer's lock is waited for).

    Args and returns: as :func:`recorded_effects`.
    """
    config = config or MatchConfig()
    learner = _learner()
    basis = store.fingerprint()  # read before the calls: calls added meanwhile leave what is kept stale
    key = EFFECTS_META_PREFIX + server
    kept: Any = store.meta(key) if learner else None
    try:
        if kept["calls"] == basis and kept["learner"] == learner:
            declared = _declared_json(_declarations(server, kept["declared"], schema, config))
            if declared == kept["declared"]:
                return {t: Verdict.from_dict(v) for t, v in kept["verdicts"].items()}
    except (KeyError, TypeError, ValueError):
        pass  # nothing kept, or not in this form: learned again
    verdicts, declarations = _learned(store, server, schema, config)
    if learner and not store.readonly:
        entry = {
            "calls": basis,
            "learner": learner,
            "declared": _declared_json(declarations),
            "verdicts": {t: v.as_dict() for t, v in verdicts.items()},
        }
        with contextlib.suppress(StoreError):  # another process is writing: learned again next time
            store.set_meta(key, entry, wait=wait)
    return verdicts


def keep_effects(store: Store, config: MatchConfig | None = None) -> None:
    """Learn every recorded server's tool effects and keep them in the store (:func:`remembered_effects`).

    ``replay-sim index build`` and ``snapshot freeze`` call it, so the first replay started after
    them reads the verdicts back instead of learning them (0.25 s a 10,000-call server). Verdicts
    kept already and still current are left as they are; another writer's lock is waited for.

    Args:
        store: The recording store; a read-only one keeps nothing.
        config: The matching config the replay will be served with (another one learns again).
    """
    if store.readonly:
        return
    schemas = RecordedSchemas(store, config)
    servers = {s.name for s in store.servers()} | {server for server, _, _ in store.names()}
    for server in sorted(servers):
        remembered_effects(store, server, schemas, config, wait=True)


def store_effects(store: Store, config: MatchConfig | None = None) -> dict[str, dict[str, Verdict]]:
    """Every recorded server's tools and their effects (:func:`recorded_effects`), by server name."""
    schemas = RecordedSchemas(store, config)
    servers = sorted({s.name for s in store.servers()} | {row["server"] for row in store.stats()})
    return {server: recorded_effects(store, server, schemas, config) for server in servers}


class StateLookup:
    """Recordings by key, and the one made from an episode's state, with the caches that make it fast.

    Args:
        store: The recording store.
        schema: ``(server, tool) -> ToolSchema | None`` (annotations; the config applied).
        cache_size: Entries of each LRU cache.
        config: The matching config (its ``read_only`` overrides what the recordings show).
    """

    def __init__(
        self,
        store: Store,
        schema: Callable[[str, str], Any],
        cache_size: int = 65536,
        config: MatchConfig | None = None,
    ) -> None:
        self.store = store
        self.schema = schema
        self.config = config or MatchConfig()
        self._keys = _LRU(cache_size)  # key -> recordings
        self._mutating: dict[str, bool] = {}
        self._sessions: dict[str, list[tuple[int, str]]] = {}
        self._prefixes: dict[int, list[str]] = {}
        self._prefix_mut: dict[int, tuple[str, ...]] = {}
        self._effects: dict[str, dict[str, Verdict]] = {}
        self._effective: dict[tuple[str, str], ToolSchema] = {}

    def clear(self) -> None:
        """Forget everything read from the store (it changed)."""
        self._keys.clear()
        self._mutating.clear()
        self._sessions.clear()
        self._prefixes.clear()
        self._prefix_mut.clear()
        self._effects.clear()
        self._effective.clear()

    def effects(self, server: str) -> dict[str, Verdict]:
        """Every tool's effect on ``server``, declared or learned from its recordings (cached)."""
        found = self._effects.get(server)
        if found is None:
            found = self._effects[server] = remembered_effects(self.store, server, self.schema, self.config)
        return found

    def effect(self, server: str, tool: str) -> Verdict:
        """One tool's effect (a tool never listed nor recorded: unknown, so state-changing)."""
        found = self.effects(server).get(tool)
        return found if found is not None else learn([], {tool: declare(None)})[tool]

    def changes_state(self, server: str, tool: str, arguments: Any) -> bool:
        """Whether a call of ``tool`` with these arguments counts as a state change."""
        return self.effect(server, tool).changes_state and not _dry_run(tool, arguments)

    def effective(self, server: str, schema: ToolSchema) -> ToolSchema:
        """``schema`` with ``read_only`` set to what the tool's effect says (learned or declared)."""
        cached = self._effective.get((server, schema.name))
        if cached is None or cached.input_schema is not schema.input_schema:
            read_only = not self.effect(server, schema.name).changes_state
            cached = (
                schema if schema.read_only == read_only else dataclasses.replace(schema, read_only=read_only)
            )
            self._effective[(server, schema.name)] = cached
        return cached

    def by_key(self, key: str) -> list[Recording]:
        """Recordings with this exact key, in recorded order (cached)."""
        found = self._keys.get(key)
        if found is None:
            found = self.store.recordings(key=key)
            self._keys.put(key, found)
        return found

    def advance(self, trail: Trail, step: str) -> None:
        """Add one call's step to a trail and update what the trail implies."""
        trail.steps.append(step)
        if step.startswith(DIVERGED):
            trail.diverged = trail.diverged or step[len(DIVERGED) :]
        elif self.is_mutating(step):
            trail.state = (*trail.state, step)

    def trail(self, history: Sequence[str] | Trail) -> Trail:
        """``history`` as a :class:`Trail` (a plain sequence of steps is replayed onto a new one)."""
        if isinstance(history, Trail):
            return history
        trail = Trail()
        for step in history:
            self.advance(trail, step)
        return trail

    def is_mutating(self, key: str) -> bool:
        """Whether the recorded call with this key changed the server's state."""
        cached = self._mutating.get(key)
        if cached is None:
            found = self.by_key(key)
            cached = False
            if found and found[0].method == "tools/call" and any(not r.failed for r in found):
                cached = self.changes_state(found[0].server, found[0].name, found[0].arguments)
            self._mutating[key] = cached
        return cached

    def _prefix(self, recording: Recording) -> list[str]:
        """Keys of the calls made before ``recording`` in its recorded session (cached)."""
        cached = self._prefixes.get(recording.id)
        if cached is None:
            cached = []
            if recording.session is not None:
                calls = self._sessions.get(recording.session)
                if calls is None:
                    calls = [(r.seq or 0, r.key) for r in self.store.recordings(session=recording.session)]
                    self._sessions[recording.session] = calls
                cached = [key for seq, key in calls if seq < (recording.seq or 0)]
            self._prefixes[recording.id] = cached
        return cached

    def state_of(self, recording: Recording) -> tuple[str, ...]:
        """The state-changing calls made before ``recording`` in its session."""
        cached = self._prefix_mut.get(recording.id)
        if cached is None:
            cached = tuple(k for k in self._prefix(recording) if self.is_mutating(k))
            self._prefix_mut[recording.id] = cached
        return cached

    def from_state(self, recordings: Sequence[Recording], trail: Trail) -> list[Recording]:
        """Those of ``recordings`` made from the state this episode is in."""
        return [r for r in recordings if self.state_of(r) == trail.state]

    def choose(self, recordings: Sequence[Recording], trail: Trail, strict: bool = True) -> Recording | None:
        """The recording made from this episode's state that best matches its steps.

        Args:
            recordings: Candidates, all answering the same call.
            trail: The episode's steps so far.
            strict: Return None when no candidate was made from this state (else: best history match).

        Returns:
            The chosen recording, or None.
        """
        if not recordings:
            return None
        eligible = self.from_state(recordings, trail)
        if not eligible:
            if strict:
                return None
            eligible = list(recordings)
        if len(eligible) == 1:
            return eligible[0]
        return max(eligible, key=lambda r: (history_affinity(r, trail.steps, self._prefix(r)), -r.id))
