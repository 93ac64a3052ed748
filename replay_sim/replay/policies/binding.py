"""An episode bound to its sandbox instance: re-playing its state, asking calls, recording answers.

A :class:`Binding` belongs to one episode's history on one server (its
:class:`~replay_sim.resolve.lineage.Trail`). The first call the cache cannot answer from the
episode's state takes an instance at the initial state and :meth:`Binding.replay` brings it to the
episode's state: every earlier call of the episode but those declared read-only
(:meth:`~replay_sim.resolve.lineage.StateLookup.in_state`: a tool only *learned* effect-free is
re-played too), in order, each answer checked against what the episode was given. From then on
:meth:`Binding.ask` sends calls to it. Every answer is recorded (origin ``sandbox``) in one
recording session per instance that starts with the re-played calls, so a recording made there is
made "from the episode's state" as the resolver sees it (:mod:`replay_sim.resolve.lineage`).
Answers are recorded off the answer path (:class:`~replay_sim.replay.policies.recording.AnswerLog`).

The instance is a cache of the episode's state, not the state itself: :meth:`Binding.release`
gives it up (idle, at the session's end, to make room) and keeps the binding's :attr:`~Binding.journal`
— the state-changing calls its state holds — from which a later instance is rebuilt.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import anyio

from replay_sim.canonical import answer_text, call_identity, canonical_json
from replay_sim.replay.policies.divergence import answer_difference
from replay_sim.replay.policies.instances import SandboxInstance
from replay_sim.replay.policies.recording import AnswerLog, Source, pending_recording
from replay_sim.replay.policies.timing import began, following, stamp
from replay_sim.resolve.lineage import DIVERGED, StateLookup, Trail
from replay_sim.store import Origin, Recording, Store
from replay_sim.store.records import utc_now

__all__ = ["Binding", "Divergence", "given_calls", "same_answer"]


class Divergence(Exception):
    """A re-played call was answered otherwise than the episode was: the server is not deterministic."""


def same_answer(recording: Recording, answer: dict[str, Any]) -> bool:
    """Whether an instance's answer (:meth:`SandboxInstance.call`'s dict) is the recorded one."""
    # As live truth is compared: `_meta` aside, and the defaults a recording made through an SDK
    # client spells out (`isError: false`, `resultType: "complete"`) the same as their absence.
    return answer_text(recording.result, recording.error) == answer_text(
        answer.get("result"), answer.get("error")
    )


def given_calls(lookup: StateLookup, trail: Trail) -> list[Recording] | str:
    """The recordings that answered the episode's calls that make its state, in order.

    The trail keeps each call's key; the recording it was answered from is the one the resolver
    chooses for that key from the history before it (the choice is deterministic), so it is found
    again by walking the steps.

    Returns:
        The recordings, or why they cannot be found (a step no recording has any more).
    """
    walked = Trail()
    given: list[Recording] = []
    for step in trail.steps:
        if step.startswith(DIVERGED):
            return f"call {step[len(DIVERGED) : len(DIVERGED) + 12]} changed state without a recording"
        if lookup.in_state(step):
            chosen = lookup.choose(lookup.by_key(step), walked)
            if chosen is None:
                return f"the recording the episode was given for call {step[:12]} is gone from the store"
            given.append(chosen)
        lookup.advance(walked, step)
    return given


def _given(recording: Recording) -> dict[str, Any]:
    """A recording's answer in the shape of :meth:`SandboxInstance.call`'s (a call a snapshot holds)."""
    return {
        "params": recording.params, "result": recording.result, "error": recording.error,
        "latency_ms": recording.latency_ms, "notifications": recording.notifications,
        "clock": began(recording).isoformat(),  # stamped back to its recorded_at
    }  # fmt: skip


def _what(method: str, params: dict[str, Any]) -> str:
    name, arguments = call_identity(method, params)
    shown = canonical_json(arguments)
    return f"{name}({shown[:117] + '...' if len(shown) > 120 else shown})"


@dataclass(eq=False)
class Binding:
    """One episode's (or MCP session's) instance of one server, and the session its answers go to.

    Attributes:
        server: The recorded server name.
        lock: Held while the episode's calls on this server are answered (one at a time).
        instance: The bound instance, or None before the first call it answers.
        session: The recording session holding the instance's answers.
        lost: Why the episode cannot go on on this server (its instance died), or None.
        refused: Why this episode cannot be answered by an instance (re-play diverged), or None.
        used: When it last answered (monotonic seconds).
        journal: The state-changing calls (recordings, in order) the episode's state holds on this
            server as far as its instances made or re-played them: what a released instance is
            rebuilt from (:func:`~replay_sim.replay.policies.lifecycle.rebuild_calls`).
        released: Why its last instance was given up (idle, session end, room), or None.
        instances: Instances bound so far.
        replayed: Calls re-played so far.
        answered: Calls the instances answered so far (re-play aside).
        made: The calls its instance was sent, in order, since it was bound (the re-played ones,
            those a snapshot it started from holds, then each asked one): what its state is made of
            (:mod:`~replay_sim.replay.policies.snapshotting`).
        source: The fingerprint of the sandbox config and code (and what it covers), or None.
        clock: When its next new call is sent on the instance's pinned clock
            (:mod:`~replay_sim.replay.policies.timing`); None: the instance's own start.
    """

    server: str
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    instance: SandboxInstance | None = None
    session: str | None = None
    lost: str | None = None
    refused: str | None = None
    used: float = field(default_factory=time.monotonic)
    journal: list[Recording] = field(default_factory=list)
    made: list[Recording] = field(default_factory=list)
    released: str | None = None
    instances: int = 0
    replayed: int = 0
    answered: int = 0
    source: Source | None = None
    clock: datetime | None = None

    async def replay(
        self, instance: SandboxInstance, given: list[Recording], log: AnswerLog, restored: int = 0
    ) -> None:
        """Bring a fresh instance to the episode's state, then bind it; its answers are recorded.

        Args:
            instance: An instance at the initial state, or at the state after ``given[:restored]``.
            given: :func:`given_calls`: the episode's state-changing calls and their answers.
            log: Where the re-played calls are queued for recording, as the head of this binding's session.
            restored: How many of ``given`` the instance holds already (it started from a state
                snapshot of an instance that made them): not sent; their answers head the session as
                that instance gave them, so what is recorded there is made from the episode's state.

        Raises:
            Divergence: A call was answered otherwise (nothing is bound or recorded then).
            InstanceLost: The instance died meanwhile.
            UpstreamError: A call timed out.
        """
        answers = [self._row(r.method, _given(r), r.params) for r in given[:restored]]
        for recording in given[restored:]:
            answer = await instance.call(recording.method, recording.params, at=began(recording))
            if not same_answer(recording, answer):
                where = answer_difference(
                    (recording.result, recording.error), (answer.get("result"), answer.get("error"))
                )
                raise Divergence(
                    f"{self.server} is not deterministic for {_what(recording.method, recording.params)}: "
                    f"re-play answered differently than recording #{recording.id} the episode was given, so "
                    f"instance {instance.id} cannot be brought to the episode's state ({where})"
                )
            answers.append(self._row(recording.method, answer, recording.params))
        session = self.session = f"sandbox-{instance.id}-{time.time_ns():x}"
        log.start_session(self.server, session, self.source)
        await log.add([{**row, "session": session} for row in answers])
        self.instance = instance
        self.journal = list(given)
        self.made = list(given)
        self.released = None
        self.instances += 1
        self.replayed += len(given) - restored
        self.clock = following(given[-1]) if given else None

    async def ask(self, method: str, params: dict[str, Any], store: Store, log: AnswerLog) -> Recording:
        """Send a call to the bound instance; its answer is queued for recording at the end of its session.

        Returns:
            The recording as it will be written (id 0 until then).

        Raises:
            InstanceLost: The instance died before or during the call.
            UpstreamError: The call timed out.
        """
        assert self.instance is not None and self.session is not None
        answer = await self.instance.call(method, params, at=self.clock)
        row = {**self._row(method, answer, params), "session": self.session}
        await log.add([row])
        recording = pending_recording(store, row)
        self.made.append(recording)
        self.clock = following(recording)
        if self.instance is not None:  # its next call's time, set while this answer goes out
            self.instance.clock_ahead(self.clock)
        self.answered += 1
        return recording

    def _row(self, method: str, answer: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
        """:meth:`Store.record_call`'s keyword arguments for an instance's answer (origin ``sandbox``)."""
        return {
            "server": self.server,
            "method": method,
            "params": answer.get("params") or params,
            "result": answer.get("result"),
            "error": answer.get("error"),
            "latency_ms": answer.get("latency_ms"),
            "origin": Origin.SANDBOX,
            "notifications": answer.get("notifications") or None,
            "recorded_at": stamp(answer) or utc_now(),  # on the instance's clock: re-played at that time
        }

    def release(self, why: str) -> SandboxInstance | None:
        """Give up the bound instance (the caller ends it), keeping the journal to rebuild from.

        Returns:
            The instance, or None when none was bound.
        """
        instance, self.instance, self.session = self.instance, None, None
        if instance is not None:
            self.released = why
        return instance

    async def unbind(self) -> None:
        """Close the bound instance (its state is deleted) and forget it; idempotent."""
        instance, self.instance, self.session = self.instance, None, None
        if instance is not None:
            with anyio.CancelScope(shield=True):
                await instance.close()
