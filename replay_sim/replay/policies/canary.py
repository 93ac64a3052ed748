"""The canary: before a sandbox instance answers anything, it must answer a recorded read as recorded.

An instance is meant to start at the recordings' initial state. A config can break that silently —
a server keeping its state at a fixed path that an earlier instance (or the host) wrote, a wrong
``state`` directory — and every answer such an instance gives would be recorded and served as
``exact`` for good. So each instance is first asked one call recorded from the initial state (no
call not declared read-only before it in its session) of a tool declared or learned effect-free,
and must answer it as recorded. If it does not, the server's sandbox is refused for the rest of the
serving: its misses say why, and nothing its instances said is recorded.

The canary is the call whose answer is likeliest to be stable: one recorded from the initial state
at least twice with the same answer (never one recorded there with different answers); failing
that, one recorded once whose answer shows no time of day or date (a clock is not state).

A server with no tool declared or learned effect-free (one ``query`` tool that reads and writes, a
task manager whose every tool is of unknown effect) gets an **opening canary** instead: once per
server, before any of its instances answers an episode, a spare fresh instance is asked the first
call of a recorded session — every recorded session starts from the recordings' initial state —
and is then ended, whatever that call did to its state. The call chosen is one the real server
made (never a sandbox's answer), preferably a read, one not failed, one recorded first in several
sessions with the same answer and one whose answer shows no clock. :meth:`Canary.admit` is the one
door: an instance comes out of it only once its server passed its canaries.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import anyio

from replay_sim.canonical import answer_text, canonical_json
from replay_sim.effects import Effect
from replay_sim.replay.policies.binding import Divergence, same_answer
from replay_sim.replay.policies.divergence import answer_difference
from replay_sim.replay.policies.instances import SandboxInstance
from replay_sim.replay.policies.timing import began
from replay_sim.resolve.lineage import StateLookup
from replay_sim.store import Origin, Recording

__all__ = ["Canary"]

_PER_TOOL = 200  # recordings of one tool looked at for a canary, at most
_OPENINGS = 5000  # recorded tool calls of one server looked at for an opening canary, at most
_REPLAYED = (Origin.SANDBOX, Origin.SYNTHETIC)  # origins of answers the real server did not give
_CLOCK = re.compile(r"\d{4}-\d{2}-\d{2}|\d{1,2}:\d{2}:\d{2}|\b1[5-9]\d{8}(?:\d{3})?\b")


class Canary:
    """Chooses each sandbox server's canary call, asks it of new instances, and keeps refusals.

    Args:
        lookup: The resolver's state lookup (the recordings, their states and the tools' effects).
    """

    def __init__(self, lookup: StateLookup) -> None:
        self.lookup = lookup
        self._chosen: dict[str, Recording | None] = {}
        self._openings: dict[str, Recording | None] = {}
        self._opened: set[str] = set()
        self._locks: dict[str, anyio.Lock] = {}
        self.refused: dict[str, str] = {}
        """Servers whose sandbox is refused, and why."""
        self.asked = 0
        """Canary calls asked so far."""

    def choose(self, server: str) -> Recording | None:
        """The recorded call ``server``'s instances are first asked (None: the recordings show none)."""
        if server not in self._chosen:
            self._chosen[server] = self._choose(server)
        return self._chosen[server]

    def _choose(self, server: str) -> Recording | None:
        effects = self.lookup.effects(server)
        tools = sorted(
            (t for t, v in effects.items() if v.effect is Effect.NONE and not v.kinds),
            key=lambda t: (not self.lookup.declared_read_only(server, t), t),  # declared ones first
        )
        once: Recording | None = None
        for tool in tools:
            recordings = self.lookup.store.recordings(server, method="tools/call", name=tool, limit=_PER_TOOL)
            initial: dict[str, list[Recording]] = {}
            for recording in recordings:
                if recording.origin in _REPLAYED or recording.failed:
                    continue  # the real server's own answers, from a recording run
                if not self.lookup.state_of(recording):
                    initial.setdefault(recording.key, []).append(recording)
            for same in initial.values():
                answers = {answer_text(r.result, r.error) for r in same}
                if len(answers) > 1:
                    continue  # one call answered differently from one state: not stable
                if len(same) >= 2:
                    return same[0]
                if once is None and not _CLOCK.search(next(iter(answers))):
                    once = same[0]
        return once

    async def check(self, server: str, instance: SandboxInstance) -> str | None:
        """Ask a fresh instance the canary; why the server's sandbox is refused, or None when it passed.

        Raises:
            InstanceLost: The instance died.
            UpstreamError: The call timed out.
        """
        if server in self.refused:
            return self.refused[server]
        canary = self.choose(server)
        if canary is None:
            return None
        what = "made from the initial state by a tool that changes nothing"
        return await self._ask(server, instance, canary, what, at=None)  # its clock goes on as it was

    async def admit(self, server: str, acquire: Callable[[], Awaitable[SandboxInstance]]) -> SandboxInstance:
        """A fresh instance of ``server`` from ``acquire``, once its server passed its canaries.

        The first time, a server with no effect-free canary (:meth:`opening`) has a spare instance
        asked its opening canary, then ended; every instance is asked the effect-free canary, if any.

        Raises:
            Divergence: The server's sandbox is refused (:attr:`refused` says why).
            SandboxUnavailable: ``acquire`` could not have an instance.
            InstanceLost: An instance died while asked a canary (it is ended).
            UpstreamError: A canary call timed out (the instance is ended).
        """
        if server in self.refused:
            raise Divergence(self.refused[server])
        if server not in self._opened:
            async with self._locks.setdefault(server, anyio.Lock()):  # one spare per server
                if server not in self._opened:
                    await self._open(server, acquire)
        instance = await acquire()
        try:
            refused = await self.check(server, instance)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await instance.close()
            raise
        if refused is not None:  # not the recordings' initial state: nothing it says is recorded
            with anyio.CancelScope(shield=True):
                await instance.close()
            raise Divergence(refused)
        return instance

    async def _open(self, server: str, acquire: Callable[[], Awaitable[SandboxInstance]]) -> None:
        opening = None if self.choose(server) is not None else self.opening(server)
        if opening is not None:
            spare = await acquire()
            try:
                what = "the first call of a recorded session"
                refused = await self._ask(server, spare, opening, what, at=began(opening))
            finally:
                with anyio.CancelScope(shield=True):
                    await spare.close()  # whatever the call did to its state
            if refused is not None:
                raise Divergence(refused)
        self._opened.add(server)

    def opening(self, server: str) -> Recording | None:
        """The opening canary: a first call of a recorded session the real server answered (None: none)."""
        if server not in self._openings:
            self._openings[server] = self._opening(server)
        return self._openings[server]

    def _opening(self, server: str) -> Recording | None:
        first: dict[str, Recording] = {}
        for recording in self.lookup.store.recordings(server, method="tools/call", limit=_OPENINGS):
            if recording.session is None:
                continue
            seen = first.get(recording.session)
            if seen is None or (recording.seq or 0) < (seen.seq or 0):
                first[recording.session] = recording
        by_key: dict[str, list[Recording]] = {}
        for recording in first.values():
            if recording.origin not in _REPLAYED and not self.lookup.state_of(recording):
                by_key.setdefault(recording.key, []).append(recording)
        ranked: list[tuple[Any, ...]] = []
        for same in by_key.values():
            answers = {answer_text(r.result, r.error) for r in same}
            if len(answers) > 1:
                continue  # one call answered differently from the initial state: not stable
            head = min(same, key=lambda r: r.id)
            changes = self.lookup.may_change(server, head.name, head.arguments)
            clock = bool(_CLOCK.search(next(iter(answers))))
            ranked.append((head.failed, changes, clock, len(same) < 2, head.id, head))
        return min(ranked, key=lambda rank: rank[:-1])[-1] if ranked else None

    async def _ask(
        self, server: str, instance: SandboxInstance, canary: Recording, what: str, at: datetime | None
    ) -> str | None:
        """Ask ``instance`` the canary: why the sandbox is refused, or None when it answered as recorded."""
        self.asked += 1
        answer = await instance.call(canary.method, canary.params, at=at)
        if same_answer(canary, answer):
            return None
        where = answer_difference((canary.result, canary.error), (answer.get("result"), answer.get("error")))
        shown = canonical_json(canary.arguments)
        self.refused[server] = (
            f"the sandbox of {server!r} is refused: its instance {instance.id} answered the canary "
            f"{canary.name}({shown[:200]}) — recording #{canary.id}, {what} — otherwise than recorded "
            f"({where}), so its instances do not start from the recordings' initial state (state kept "
            "at a fixed path, or a wrong `state` directory?); fix the server's config and restart: "
            "nothing its instances answered was recorded"
        )
        return self.refused[server]
