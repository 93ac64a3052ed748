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
that, one recorded once whose answer shows no time of day or date (a clock is not state). A server
with neither gets no canary.
"""

from __future__ import annotations

import re

from replay_sim.canonical import answer_text, canonical_json
from replay_sim.effects import Effect
from replay_sim.replay.policies.binding import same_answer
from replay_sim.replay.policies.instances import SandboxInstance
from replay_sim.resolve.lineage import StateLookup
from replay_sim.store import Origin, Recording

__all__ = ["Canary"]

_PER_TOOL = 200  # recordings of one tool looked at for a canary, at most
_CLOCK = re.compile(r"\d{4}-\d{2}-\d{2}|\d{1,2}:\d{2}:\d{2}|\b1[5-9]\d{8}(?:\d{3})?\b")


class Canary:
    """Chooses each sandbox server's canary call, asks it of new instances, and keeps refusals.

    Args:
        lookup: The resolver's state lookup (the recordings, their states and the tools' effects).
    """

    def __init__(self, lookup: StateLookup) -> None:
        self.lookup = lookup
        self._chosen: dict[str, Recording | None] = {}
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
                if recording.origin in (Origin.SANDBOX, Origin.SYNTHETIC) or recording.failed:
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
        self.asked += 1
        answer = await instance.call(canary.method, canary.params)
        if same_answer(canary, answer):
            return None
        shown = canonical_json(canary.arguments)
        self.refused[server] = (
            f"the sandbox of {server!r} is refused: its instance {instance.id} answered the canary "
            f"{canary.name}({shown[:200]}) — recording #{canary.id}, made from the initial state by a tool "
            "that changes nothing — otherwise than recorded, so its instances do not start from the "
            "recordings' initial state (state kept at a fixed path, or a wrong `state` directory?); "
            "fix the server's config and restart: nothing its instances answered was recorded"
        )
        return self.refused[server]
