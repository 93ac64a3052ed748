"""Episode state: which recordings were made from the state an episode is in.

A server's answers depend on the state-changing calls made before them. A recording is made from
this episode's state when the *state-changing* calls before it in its recorded session (calls of
tools not known to be effect-free, that did not fail) are exactly the ones this episode made, in
order. Which tools are effect-free is declared (the matching config, ``readOnlyHint``) or learned
from the recordings (:mod:`replay_sim.effects`: a read that gave the same answer before and after
a tool's calls; a read-only hint is dropped when recordings of one call from one state disagree),
and the verdicts are kept in the store (:mod:`replay_sim.resolve.tooleffects`).
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

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from replay_sim.canonical import canonical_json
from replay_sim.effects import Effect, Verdict, declare, kind_of, learn
from replay_sim.resolve.calibration import MatchConfig
from replay_sim.resolve.tooleffects import dry_run, remembered_effects
from replay_sim.schema import ToolSchema
from replay_sim.store import Recording, Store
from replay_sim.store.changes import Appended

__all__ = ["DIVERGED", "StateLookup", "Trail", "history_affinity"]

DIVERGED = "!"
"""Prefix of the step of a state-changing call no recording answered."""


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
        blamed: That call, as a miss names it (``put({"key":"k"}), a call of unknown effect``), when
            the replay that made it said (:meth:`StateLookup.blame`); None otherwise.
    """

    __slots__ = (
        "__weakref__",
        "blamed",
        "diverged",
        "state",
        "steps",
    )  # weakly referable: a sandbox binds to it

    def __init__(self) -> None:
        self.steps: list[str] = []
        self.state: tuple[str, ...] = ()
        self.diverged: str | None = None
        self.blamed: str | None = None

    def __len__(self) -> int:
        return len(self.steps)


def _as_replay_reads(verdicts: dict[str, Verdict]) -> dict[str, Any]:
    """What replay reads of learned verdicts: each tool's effect and its kinds' (not the evidence)."""
    return {
        tool: (verdict.effect, tuple((kind, of_kind.effect) for kind, of_kind in verdict.kinds))
        for tool, verdict in verdicts.items()
    }


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
        self._in_session: dict[str, set[int]] = {}  # session -> recordings whose prefix is cached
        self._effects: dict[str, dict[str, Verdict]] = {}
        self._effective: dict[tuple[str, str], ToolSchema] = {}
        self._counted: dict[str, bool] = {}
        self.strict: frozenset[str] = frozenset()
        """Servers a sandbox can run: their states count every call not declared read-only."""

    def answer_strictly(self, servers: Any) -> None:
        """Never guess on these servers (a sandbox can run them): see :meth:`in_state`.

        An episode's state there is every earlier tool call not *declared* read-only (the matching
        config, or a ``readOnlyHint`` no recording contradicts), not only those learned to change
        state; learned verdicts can be wrong, and with the real server at hand nothing needs them.
        """
        self.strict = frozenset(servers)
        self.clear()

    def declared_read_only(self, server: str, tool: str) -> bool:
        """Whether ``tool`` is declared effect-free (config or annotation) and no recording says otherwise."""
        verdict = self.effect(server, tool)
        return verdict.effect is Effect.NONE and verdict.source in ("config", "annotation")

    def may_change(self, server: str, tool: str, arguments: Any) -> bool:
        """Whether a call counts as a state change: :meth:`changes_state`, or on a strict server,
        unless declared read-only."""
        if server in self.strict:
            return not self.declared_read_only(server, tool)
        return self.changes_state(server, tool, arguments)

    def blame(self, server: str, tool: str, arguments: Any) -> str:
        """How a miss names an earlier call that left the state unknown: tool, arguments and effect.

        ``of unknown effect`` when nothing settles the tool's effect, ``state-changing`` when it is
        declared or shown to change state, ``not declared read-only`` on a sandbox server otherwise.
        """
        shown = canonical_json(arguments)
        shown = shown if len(shown) <= 200 else shown[:197] + "..."
        verdict = self.effect(server, tool)
        if verdict.kinds:
            verdict = verdict.of_kind(kind_of(arguments))
        effect = {Effect.UNKNOWN: "of unknown effect", Effect.CHANGES: "that changes state"}.get(
            verdict.effect, "not declared read-only"
        )
        return f"{tool}({shown}), a call {effect}"

    def in_state(self, key: str) -> bool:
        """Whether the recorded call with this key is part of an episode's state.

        :meth:`is_mutating` on most servers; on a :attr:`strict` one, every recorded tool call
        whose tool is not declared read-only (failed ones too: the real server is re-played them).
        """
        cached = self._counted.get(key)
        if cached is None:
            found = self.by_key(key)
            if found and found[0].server in self.strict:
                cached = found[0].method == "tools/call" and not self.declared_read_only(
                    found[0].server, found[0].name
                )
            else:
                cached = self.is_mutating(key)
            self._counted[key] = cached
        return cached

    def clear(self) -> None:
        """Forget everything read from the store (it changed)."""
        self._keys.clear()
        self._mutating.clear()
        self._sessions.clear()
        self._prefixes.clear()
        self._prefix_mut.clear()
        self._in_session.clear()
        self._effects.clear()
        self._effective.clear()
        self._counted.clear()

    def forget(self, appended: Appended) -> bool:
        """Forget what calls appended to the store may have changed, and say whether that sufficed.

        A new call changes the recordings of its key, its session (every prefix in it) and what
        is learned of its server's tools' effects. When those effects, or whether a key changes
        state, come out different, states derived from them anywhere are stale.

        Returns:
            False when everything derived from the store must be forgotten (:meth:`clear`).
        """
        before = {server: self._effects.get(server) for server in appended.servers}
        mutating = {key: self._mutating[key] for key in appended.keys if key in self._mutating}
        for key in appended.keys:
            # Recordings are only appended here (else everything is forgotten): a key read before
            # gets the new ones, not all of them read again (a key every episode calls has as
            # many recordings as episodes).
            cached = self._keys.get(key)
            if cached is not None:
                added = self.store.recordings(key=key, after_id=appended.after, upto_id=appended.last)
                self._keys.put(key, [*cached, *added])
            self._mutating.pop(key, None)
            self._counted.pop(key, None)
        for session in appended.sessions:
            self._sessions.pop(session, None)
            for recording_id in list(self._in_session.pop(session, ())):  # a copy: threads add
                self._prefixes.pop(recording_id, None)
                self._prefix_mut.pop(recording_id, None)
        for server in appended.servers:
            self._effects.pop(server, None)
        for server, tool in list(self._effective):  # a copy: other threads resolve meanwhile
            if server in appended.servers:
                self._effective.pop((server, tool), None)
        for server, verdicts in before.items():
            if verdicts is not None and _as_replay_reads(verdicts) != _as_replay_reads(self.effects(server)):
                return False
        return all(self.is_mutating(key) == was for key, was in mutating.items())

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

    def changed_by(self, recording: Recording) -> bool:
        """Whether a recorded answer is a state change: a tool call that did not fail and
        :meth:`changes_state`."""
        return (
            recording.method == "tools/call"
            and not recording.failed
            and self.changes_state(recording.server, recording.name, recording.arguments)
        )

    def changes_state(self, server: str, tool: str, arguments: Any) -> bool:
        """Whether a call of ``tool`` with these arguments counts as a state change.

        A tool learned per kind of call (:attr:`~replay_sim.effects.Verdict.kinds`) answers by the
        call's kind: an unrecorded ``SELECT`` of a SQL tool seen writing changes nothing when its
        recorded ``SELECT`` calls were shown to change nothing.
        """
        verdict = self.effect(server, tool)
        if verdict.kinds:
            verdict = verdict.of_kind(kind_of(arguments))
        return verdict.changes_state and not dry_run(tool, arguments)

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

    def advance(self, trail: Trail, step: str, mutating: bool | None = None) -> None:
        """Add one call's step to a trail and update what the trail implies.

        Args:
            trail: The episode's trail.
            step: The call's step.
            mutating: Whether the call changed state, when the caller knows better than the store
                (a sandbox answer not written yet); None: :meth:`in_state`.
        """
        trail.steps.append(step)
        if step.startswith(DIVERGED):
            trail.diverged = trail.diverged or step[len(DIVERGED) :]
        elif self.in_state(step) if mutating is None else mutating:
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
                self._in_session.setdefault(recording.session, set()).add(recording.id)
            self._prefixes[recording.id] = cached
        return cached

    def state_of(self, recording: Recording) -> tuple[str, ...]:
        """The state-changing calls made before ``recording`` in its session."""
        cached = self._prefix_mut.get(recording.id)
        if cached is None:
            cached = tuple(k for k in self._prefix(recording) if self.in_state(k))
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

    def alternatives(self, recording: Recording, history: Sequence[str] | Trail = ()) -> list[Recording]:
        """``recording`` and the other recordings of that very call made from the episode's state.

        The same call may have been recorded for clients that answered the server's questions
        (sampling, elicitation) differently; :mod:`replay_sim.replay.core.conversation` picks among them.
        """
        same = self.by_key(recording.key)
        if len(same) == 1:
            return [recording]
        others = [r for r in self.from_state(same, self.trail(history)) if r.id != recording.id]
        return [recording, *others]
