"""Asking a real server which tools change its state (the recorder's ``explore`` option).

Replay treats every call of a tool not known to be effect-free as a state change
(:mod:`replay_sim.effects`), so an episode that calls a pure function loses every later recorded
answer. The evidence that a tool changes nothing is a read that gives the same answer before and
after its calls. Clients seldom re-read, so a recorder that explores does: after a successful call
of a tool whose effect is still unsettled, and before it answers the client (nothing else has
changed the state in between), it asks again

- up to :attr:`EffectProbes.reads` of the session's earlier reads — calls of tools known to change
  nothing, and resource reads — those sharing an argument value with the call first (they are the
  likeliest to see its effect), then the most recent;
- the call itself, but only when the server says that is harmless (``readOnlyHint`` or
  ``idempotentHint``): repeating a write of unknown effect could apply it twice and change what the
  client sees next. For a tool annotated read-only this is the check that the annotation tells the
  truth: a tool that numbers what it was told answers differently the second time, and is then
  never explored again (no variants, no more repeats).

and records the answers (origin ``explore``). The same rules that judge the recordings
(:func:`replay_sim.effects.learn`) judge the answers as they arrive. A tool is probed in at most
:attr:`EffectProbes.budget` rounds, and no more once the answers settle it.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from replay_sim.canonical import answer_text, call_identity, call_key
from replay_sim.effects import (
    Call,
    Declaration,
    Effect,
    Verdict,
    declare,
    kind_of,
    learn,
    named,
    repeatable,
    selected,
)
from replay_sim.schema import ToolSchema

__all__ = ["EffectProbes", "Probe", "leaves"]

_SETTLED_CALLS = 2  # calls of a tool seen to change nothing, after which it is not probed again
_KEPT_ANSWER = 65536  # answers longer than this are kept as their digest
_RELEARN_EVERY = 32  # calls recorded since the last verdicts, after which they are worked out again


@dataclass(frozen=True, slots=True)
class Probe:
    """One call to ask again: its method and params (as the client sent them)."""

    method: str
    params: dict[str, Any]


@dataclass
class _Asked:
    call: Call
    probe: Probe
    explored: bool


@dataclass
class EffectProbes:
    """Which calls to repeat to learn a tool's effect, and what the answers so far say.

    Args:
        budget: Most probe rounds per tool.
        reads: Most earlier reads asked again per round.
    """

    budget: int = 3
    reads: int = 3
    _annotations: dict[str, dict[str, Any]] = field(default_factory=dict)
    _sessions: dict[str, list[_Asked]] = field(default_factory=lambda: defaultdict(list))
    _rounds: Counter[str] = field(default_factory=Counter)
    _settled: set[str] = field(default_factory=set)
    _verdicts: dict[str, Verdict] = field(default_factory=dict)
    _since: int = 0  # calls observed since the verdicts were worked out
    _count: int = 0

    declared: bool = False
    """Whether the server's tools were taken in (:meth:`declare`)."""

    def declare(self, tools: Mapping[str, ToolSchema]) -> None:
        """Take the server's listed tools (their annotations say what is harmless to repeat)."""
        self._annotations = {name: dict(t.annotations) for name, t in tools.items()}
        self.declared = True
        self._since = _RELEARN_EVERY

    def observe(
        self,
        session: str,
        method: str,
        params: dict[str, Any],
        result: dict[str, Any] | None,
        error: Any,
        explored: bool = False,
    ) -> None:
        """Take in one answered call of a session, in order (``explored``: asked by the recorder)."""
        name, arguments = call_identity(method, params)
        failed = error is not None or bool((result or {}).get("isError"))
        dry_run = method == "tools/call" and not ToolSchema(name, {}).changes_state(arguments)
        answer = answer_text(result, error)
        if len(answer) > _KEPT_ANSWER:  # compared by digest: shows no pattern a call selects
            answer = "sha256:" + hashlib.sha256(answer.encode()).hexdigest()
        self._count += 1  # ids name the pairs a verdict rests on
        names = frozenset({name.lower()}) if method == "resources/read" else named(arguments)
        call = Call(self._count, method, name, call_key("", method, name, arguments), answer, failed,
                    method != "tools/call" or failed or dry_run, names, kind_of(arguments),
                    selected(arguments))  # fmt: skip
        clean = {k: v for k, v in params.items() if k != "_meta"}
        self._sessions[session].append(_Asked(call, Probe(method, clean), explored))
        self._since += 1

    def verdict(self, tool: str) -> Verdict:
        """What the calls observed so far say about ``tool``."""
        if self._since >= _RELEARN_EVERY or tool not in self._verdicts:
            self._relearn()
        return self._verdicts.get(tool) or learn([], {tool: self._declared(tool)})[tool]

    def read_only(self, tool: str) -> bool:
        """Whether ``tool`` is taken as effect-free (annotated and not refuted, or shown)."""
        return self.verdict(tool).effect is Effect.NONE

    def plan(self, session: str, tool: str, arguments: dict[str, Any]) -> list[Probe]:
        """The calls to ask again after a successful call of ``tool`` (the session's last call)."""
        if tool in self._settled or self._rounds[tool] >= self.budget:
            return []
        verdict = self.verdict(tool)
        if self._settles(tool, verdict):
            self._settled.add(tool)
            return []
        calls = self._sessions.get(session) or []
        planned = []
        if repeatable(self._annotations.get(tool)) and calls:
            planned.append(calls[-1].probe)  # the call itself, first: hidden state shows at once
        planned.extend(self._earlier_reads(calls[:-1], arguments, tool))
        return planned

    def probed(self, tool: str) -> None:
        """One probe round for ``tool`` was asked (its answers observed)."""
        self._rounds[tool] += 1
        self._relearn()
        if self._settles(tool, self._verdicts.get(tool)) or self._rounds[tool] >= self.budget:
            self._settled.add(tool)

    def _declared(self, tool: str) -> Declaration:
        return declare(self._annotations.get(tool))

    def _settles(self, tool: str, verdict: Verdict | None) -> bool:
        if verdict is None:
            return False
        if verdict.effect is Effect.CHANGES or self._declared(tool).fixed:
            return True
        return verdict.effect is Effect.NONE and verdict.shown >= _SETTLED_CALLS

    def _relearn(self) -> None:
        runs = [[asked.call for asked in calls] for calls in self._sessions.values()]
        tools = {c.tool for run in runs for c in run if c.tool is not None} | set(self._annotations)
        self._verdicts = learn(runs, {t: self._declared(t) for t in tools})
        self._since = 0

    def _earlier_reads(self, calls: list[_Asked], arguments: dict[str, Any], tool: str) -> list[Probe]:
        """The client's earlier successful reads, one per call, related ones first, then the latest."""
        mine = set(leaves(arguments))
        seen: set[str] = set()
        ranked = []
        for position in range(len(calls) - 1, -1, -1):
            asked = calls[position]
            call = asked.call
            if asked.explored or call.key in seen:
                continue
            seen.add(call.key)
            if call.failed or call.method not in ("tools/call", "resources/read"):
                continue
            if call.method == "tools/call" and (call.name == tool or not self.read_only(call.name)):
                continue
            shared = len(mine & set(leaves(call_identity(call.method, asked.probe.params)[1])))
            ranked.append((-shared, -position, asked.probe))
        ranked.sort(key=lambda r: (r[0], r[1]))
        return [probe for _, _, probe in ranked[: self.reads]]


def leaves(value: Any) -> Iterator[str]:
    """The scalar values inside an argument (strings and numbers)."""
    if isinstance(value, dict):
        for item in value.values():
            yield from leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from leaves(item)
    elif isinstance(value, str) and value:
        yield value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield repr(value)
