"""Asking a sandboxed server which tools change its state (``replay-sim explore``, ``sandbox = true``).

Replay treats a tool whose effect is unknown as a state change (:mod:`replay_sim.effects`): an
episode that calls it loses every answer recorded after another history. Most servers annotate
nothing, and clients seldom re-read, so the evidence that a tool changes nothing is often missing.
The recorder's own effect probes (:mod:`replay_sim.record.effect_probes`) repeat only what is
harmless to repeat, because the client's session goes on after them.

A server the recorder config declares a **sandbox** is one whose state can be thrown away: every
session ``replay-sim explore`` opens starts from the initial state (a fresh connection — a fresh
process for a command — after the server's ``reset`` command, when it has one). There repeating any
call is harmless, so for each tool ``T`` of unknown effect with successful recorded calls, up to
:data:`OBSERVERS` *observers* — other recorded calls and resource reads, those sharing the most
words with ``T``'s calls first (the likeliest to see its effect); among equals recorded failures
first (a read of the file ``T`` creates fails before it: the most telling observer, never dropped),
then reads before calls of tools known to change state, resource reads first, the latest first;
with no other call to observe with, ``T``'s own calls (``A``, ``B``, then ``A`` again) — are each
asked in two fresh sessions:

- the observer alone, unless the store already holds its answer from the initial state;
- up to :data:`OWN_CALLS` different recorded calls of ``T``, then the observer.

Both are recorded (origin ``explore``) and judged like any recorded session: the observer's two
answers differ only by ``T``'s calls, so the same answer is a witness that ``T`` changes nothing it
sees, and a different one shows that ``T`` changes state. Every observer is asked unless one shows
a change — a tool is learned effect-free only when none of them saw anything change — and the
calls of ``T`` asked from the initial state are themselves answers a replay can give. What was
asked belongs to the store: a later run probes only tools still of unknown effect, and never asks
a session the store already holds.

A tool learned per kind of call (:attr:`~replay_sim.effects.Verdict.kinds`: a SQL tool whose
``INSERT`` calls change state) has each kind of unknown effect probed the same way, as a tool of
its own (``query [select]``): its calls of that kind, observed by other recorded calls — never by
the tool's calls of kinds known to change state — or by themselves.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from replay_sim.canonical import canonical_json
from replay_sim.effects import Effect, Verdict, kind_of
from replay_sim.errors import UpstreamError
from replay_sim.record.config import RecorderConfig, UpstreamSpec
from replay_sim.record.effect_probes import leaves
from replay_sim.record.rerun import Rerun, recording_redactor, reset
from replay_sim.redaction import Redactor
from replay_sim.store import Origin, Recording, Store

__all__ = ["OBSERVERS", "OWN_CALLS", "EffectReport", "Verdicts", "probe_effects"]

Verdicts = Callable[[str], Mapping[str, Verdict]]
"""``server -> {tool: verdict}``: every tool's effect as the store shows it now (declared or learned)."""

OBSERVERS = 3
"""Observers asked per tool of unknown effect, at most."""
OWN_CALLS = 3
"""Different recorded calls of the tool asked before an observer, at most."""

_NOT_ORIGINALS = (Origin.EXPLORE, Origin.SYNTHETIC)
_WORD = re.compile(r"[^\W_]{3,}")


@dataclass
class EffectReport:
    """What the effect probes asked, and what they settled, per server."""

    sessions: int = 0
    """Fresh sessions opened."""
    asked: int = 0
    """Calls sent to the real servers."""
    effects: dict[str, dict[str, str]] = field(default_factory=lambda: defaultdict(dict))
    """Server -> probed tool -> its effect afterwards (``none: …``, ``changes: …``, ``unknown: …``)."""
    skipped: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    """Tools or observers not probed, by why."""
    problems: list[str] = field(default_factory=list)
    """Servers whose probing stopped, and why (one line each)."""

    def lines(self) -> list[str]:
        """The report, for the CLI."""
        probed = sum(len(tools) for tools in self.effects.values())
        out = [f"probed {probed} tools of unknown effect: {self.asked} calls in {self.sessions} sessions"]
        for server, tools in sorted(self.effects.items()):
            out += [f"  {server}/{tool}: {effect}" for tool, effect in sorted(tools.items())]
        out += [f"  skipped {n}: {why}" for why, n in sorted(self.skipped.items())]
        out += [f"  {problem}" for problem in self.problems]
        return out


async def probe_effects(
    store: Store,
    config: RecorderConfig,
    verdicts: Verdicts,
    *,
    servers: Sequence[str] | None = None,
    max_calls: int | None = None,
    report: EffectReport | None = None,
) -> EffectReport:
    """Learn the effect of the sandboxed servers' tools of unknown effect; record what was asked.

    Args:
        store: The recording store (written to).
        config: The recorder config; only its servers with ``sandbox = true`` are probed.
        verdicts: Every tool's effect from the store as it stands (asked again after each probe).
        servers: Only these recorded servers (default: every recorded server the config names).
        max_calls: Most calls sent to the real servers (None: no limit).
        report: Added to (a new one by default).

    Returns:
        What was asked and learned. A server that cannot be started or reset is reported there,
        and the others are probed.
    """
    report = report or EffectReport()
    recorded = {s.name for s in store.servers()}
    names = [n for n in (servers or sorted(config.servers)) if n in recorded and n in config.servers]
    redactor = recording_redactor(store, config.redactor)
    for name in names:
        spec = config.servers[name]
        if not spec.sandbox:
            continue
        try:
            await _probe_server(_Prober(name, spec, store, redactor, report, max_calls), verdicts)
        except UpstreamError as exc:
            report.problems.append(f"{name}: effect probes stopped: {exc}")
    return report


@dataclass
class _Prober:
    """Fresh sessions of one sandboxed server, recorded as they are asked."""

    name: str
    spec: UpstreamSpec
    store: Store
    redactor: Redactor
    report: EffectReport
    max_calls: int | None

    def affords(self, calls: int) -> bool:
        return self.max_calls is None or self.report.asked + calls <= self.max_calls

    async def session(self, calls: Sequence[Recording]) -> list[bool]:
        """Ask ``calls`` in order in a fresh session from the initial state; whether each succeeded."""
        if self.spec.reset is not None:
            await reset(self.name, self.spec)
        succeeded = []
        async with Rerun(self.name, self.spec, self.store, self.redactor) as rerun:
            self.report.sessions += 1
            try:
                for rec in calls:
                    answer = await rerun.ask(rec.method, rec.params)
                    rerun.keep(rec.method, rec.params, answer, Origin.EXPLORE)
                    succeeded.append(not answer.failed)
            finally:
                self.report.asked += rerun.calls
        return succeeded


async def _probe_server(prober: _Prober, verdicts: Verdicts) -> None:
    name, report = prober.name, prober.report
    effects = verdicts(name)
    recordings = prober.store.recordings(name)
    sessions = _sessions(recordings)
    initial = _initial_keys(sessions, effects)
    asked = {
        tuple(r.key for r in calls) for calls in sessions if {r.origin for r in calls} == {Origin.EXPLORE}
    }
    marker = prober.redactor.replacement
    originals = [
        rec
        for rec in recordings
        if rec.origin not in _NOT_ORIGINALS
        and rec.method in ("tools/call", "resources/read")
        and marker not in canonical_json(rec.params)
    ]
    # The first recording of each key; observers may have failed (reading what a tool creates).
    watchers = list({rec.key: rec for rec in reversed(originals)}.values())[::-1]
    distinct = [rec for rec in watchers if not rec.failed]
    unknown = sorted(
        {r.name for r in distinct if r.method == "tools/call" and _effect(effects, r.name) is Effect.UNKNOWN}
    )
    targets = [(tool, None) for tool in unknown] + _unknown_kinds(distinct, effects)
    probed: list[tuple[str, str | None]] = []
    for tool, kind in targets:
        own = [r for r in distinct if _of(r, tool, kind)][:OWN_CALLS]
        # With nothing else to observe with, the tool's own calls observe it: A, B, then A again.
        observers = _observers(watchers, tool, own, effects, kind) or own
        for observer in observers[:OBSERVERS]:
            if (*[r.key for r in own], observer.key) in asked:
                report.skipped["asked by an earlier run"] += 1
                continue
            if observer.key not in initial:
                if not prober.affords(1 + len(own) + 1):
                    report.skipped["over --max-calls"] += 1
                    break
                # An observer failing here (what the tool creates is not there yet) is the most
                # telling one: asked after the tool's calls, it succeeds if they created it.
                await prober.session([observer])
                initial.add(observer.key)
            if not prober.affords(len(own) + 1):
                report.skipped["over --max-calls"] += 1
                break
            await prober.session([*own, observer])
            effects = verdicts(name)
            if _effect(effects, tool, kind) is Effect.CHANGES:
                break
        probed.append((tool, kind))
    effects = verdicts(name)  # one tool's probes can settle another's (a change it was suspected of)
    for tool, kind in probed:
        verdict = effects.get(tool)
        label = tool if kind is None else f"{tool} [{kind}]"
        report.effects[name][label] = "unknown" if verdict is None else verdict.of_kind(kind).describe()


def _effect(effects: Mapping[str, Verdict], tool: str, kind: str | None = None) -> Effect:
    verdict = effects.get(tool)
    return Effect.UNKNOWN if verdict is None else verdict.of_kind(kind).effect


def _of(rec: Recording, tool: str, kind: str | None) -> bool:
    """Whether ``rec`` is a call of ``tool`` (of that kind of call, when one is given)."""
    return (
        rec.method == "tools/call" and rec.name == tool and (kind is None or kind_of(rec.arguments) == kind)
    )


def _unknown_kinds(distinct: list[Recording], effects: Mapping[str, Verdict]) -> list[tuple[str, str | None]]:
    """The kinds of call of unknown effect of tools learned per kind (a SQL tool's ``select`` calls
    when its ``insert`` calls change state): each is probed like a tool of its own."""
    found = set()
    for rec in distinct:
        verdict = effects.get(rec.name) if rec.method == "tools/call" else None
        if verdict is not None and verdict.kinds:
            kind = kind_of(rec.arguments)
            if kind is not None and dict(verdict.kinds).get(kind, verdict).effect is Effect.UNKNOWN:
                found.add((rec.name, kind))
    return sorted(found)


def _sessions(recordings: list[Recording]) -> list[list[Recording]]:
    """The recordings by session, each in recorded order (a call with no session is one of its own)."""
    by_session: dict[Any, list[Recording]] = defaultdict(list)
    for rec in recordings:
        by_session[rec.session if rec.session is not None else ("", rec.id)].append(rec)
    return [sorted(calls, key=lambda r: (r.seq or 0, r.id)) for calls in by_session.values()]


def _initial_keys(sessions: list[list[Recording]], effects: Mapping[str, Verdict]) -> set[str]:
    """Keys the store holds a successful answer of from the initial state (nothing changed before)."""
    found: set[str] = set()
    for calls in sessions:
        for rec in calls:
            if not rec.failed:
                found.add(rec.key)
                if (
                    rec.method == "tools/call"
                    and _effect(effects, rec.name, kind_of(rec.arguments)) is not Effect.NONE
                ):
                    break  # what follows may have been answered from another state
    return found


def _observers(
    distinct: list[Recording],
    tool: str,
    own: list[Recording],
    effects: Mapping[str, Verdict],
    kind: str | None = None,
) -> list[Recording]:
    """The observers of ``tool`` (of its ``kind`` of call): those sharing the most words with its
    calls first; among equals, recorded failures sharing a word first (a read of what the tool
    creates fails before it: the most telling), other failures last; then reads before calls of
    tools known to change state (whose answers are mostly acknowledgements), resource reads first,
    the latest first. For a kind, the tool's calls of other kinds known to change state are none."""
    mine = {w for rec in own for w in _words(rec.arguments)}
    ranked = []
    for position, rec in enumerate(distinct):
        if _of(rec, tool, kind):
            continue
        if (
            kind is not None
            and _of(rec, tool, None)
            and _effect(effects, tool, kind_of(rec.arguments)) is Effect.CHANGES
        ):
            continue
        resource = rec.method == "resources/read"
        words = set(_words(rec.name if resource else rec.arguments))
        writes = not resource and _effect(effects, rec.name) is Effect.CHANGES
        shared = len(mine & words)
        # A failure is telling only about what it names: one sharing nothing sees nothing at all.
        ranked.append(
            (-shared, not rec.failed if shared else rec.failed, writes, not resource, -position, rec)
        )
    ranked.sort(key=lambda r: r[:5])
    return [rec for *_, rec in ranked]


def _words(value: Any) -> Iterator[str]:
    """The words (3 characters or more, lower case) of an argument's strings and numbers."""
    for leaf in leaves(value):
        yield from (w.lower() for w in _WORD.findall(leaf))
