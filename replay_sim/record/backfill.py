"""Misses become recordings: ``replay-sim backfill``.

A replay keeps each call it could not answer, with the state-changing calls its episode made
before it (:mod:`replay_sim.store.misses`). :func:`backfill` asks the real server each of them
*from the state it was missed in*, and records the session (origin ``backfill``), so the next
replay answers it — and, through what the new recordings show, maybe calls like it:

1. the upstream is put back to the state its recordings start from: its ``reset`` command (recorder
   config) is run, and a fresh connection is opened (a fresh process for a command);
2. a *canary* — a recorded read-only call of that server from the initial state — is asked, and
   must be answered as recorded: else the upstream is not in that state, and nothing is recorded;
3. the miss's prefix is asked, in order; a prefix call that has recordings must be answered as one
   of them was (else the state differs from the one the replay assumed, and nothing more is asked);
4. the missed call is asked; the prefix and the call are recorded as one new session.

Without a ``reset`` command nothing is guessed. A miss after state-changing calls needs one: their
effects would otherwise land on whatever state the upstream is in, and stay there for the next
session. A miss at the initial state is asked without one only when it is safe: the upstream is a
command (each session a fresh process), the missed call changes nothing (its tool's effect is
``none``), and a canary shows the fresh process answering as recorded — which is what a server
whose state lives in its process does, and what a server whose state lives in files or a database
does only while nothing has changed them. Everything else is reported with what is missing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from replay_sim.canonical import answer_text
from replay_sim.errors import UpstreamError
from replay_sim.record.config import RecorderConfig, UpstreamSpec
from replay_sim.record.rerun import Rerun, recording_redactor, reset
from replay_sim.record.revisit import ReadOnly, initial_calls
from replay_sim.redaction import Redactor
from replay_sim.store import Origin, Recording, Store
from replay_sim.store.misses import MissEntry

__all__ = ["Answers", "BackfillReport", "backfill"]

Answers = Callable[[MissEntry], bool]
"""Whether the store answers a miss now (from the state it was missed in): the resolver, injected."""
Progress = Callable[[int, int], None]
"""``(done, total)`` misses considered."""


@dataclass
class BackfillReport:
    """What a backfill did."""

    misses: int = 0
    """Distinct misses considered."""
    answered_before: int = 0
    """Of those, answered by the store already (a live policy, an earlier backfill): not asked."""
    recorded: int = 0
    """Misses asked of the real server and recorded."""
    asked: int = 0
    """Calls sent to the real servers (canaries, prefixes and missed calls)."""
    resets: int = 0
    """Reset commands run."""
    skipped: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    """Misses not asked, by why."""
    problems: list[str] = field(default_factory=list)
    """Upstreams that failed (gone, reset failed), one line each."""
    answered_after: int | None = None
    """How many of the misses the store answers now (None: not re-resolved)."""

    def lines(self) -> list[str]:
        """The report, for the CLI."""
        out = [
            f"backfilled {self.recorded} of {self.misses} misses ({self.answered_before} answered already): "
            f"{self.asked} calls to the real servers, {self.resets} resets"
        ]
        out += [f"  not asked {n}: {why}" for why, n in sorted(self.skipped.items())]
        out += [f"  {problem}" for problem in self.problems]
        if self.answered_after is not None:
            out.append(f"the store now answers {self.answered_after} of the {self.misses} misses")
        return out


def _obstacle(
    entry: MissEntry, spec: UpstreamSpec | None, read_only: ReadOnly, canary: Recording | None
) -> str | None:
    """Why this backfill cannot ask the miss (None: it can)."""
    if spec is None:
        return f"server {entry.server!r} is not in the recorder config"
    assert entry.prefix is not None  # MissEntry.obstacle said so
    if spec.reset is not None:
        return None
    if entry.prefix:
        return f"missed after state-changing calls; upstream {entry.server!r} needs a reset command"
    if spec.command is None:
        return f"upstream {entry.server!r} is a URL (one long-lived server) and has no reset command"
    if entry.method == "tools/call" and not read_only(entry.server, entry.name):
        return f"the call may change state; upstream {entry.server!r} needs a reset command"
    if canary is None:
        return (
            f"no recorded read of {entry.server!r} to check its initial state by; "
            "give the upstream a reset command"
        )
    return None


async def backfill(
    store: Store,
    misses: Iterable[MissEntry],
    config: RecorderConfig,
    read_only: ReadOnly,
    *,
    answers: Answers | None = None,
    limit: int | None = None,
    progress: Progress | None = None,
) -> BackfillReport:
    """Ask the real servers the misses, each from the state it was missed in, and record them.

    Args:
        store: The recording store (written to).
        misses: The misses, most wanted first (:func:`~replay_sim.store.misses.read_misses`).
        config: The recorder config: how to reach each server, its ``reset`` command, redaction.
        read_only: Whether a tool changes nothing (its effect is ``none``), per server.
        answers: Whether the store answers a miss (the resolver, injected by the caller): misses it
            answers already are not asked, and the report counts what it answers afterwards.
        limit: Most misses asked of the real servers (None: all).
        progress: Called as misses are considered.

    Returns:
        What was recorded, skipped and why, and what the store answers now.
    """
    entries = _distinct(misses)
    report = BackfillReport(misses=len(entries))
    redactor = recording_redactor(store, config.redactor)
    canaries: dict[str, Recording | None] = {}
    broken: dict[str, str] = {}
    attempted = 0
    for done, entry in enumerate(entries, 1):
        if progress is not None:
            progress(done - 1, len(entries))
        spec = config.servers.get(entry.server)
        if entry.server not in canaries:
            found = initial_calls(store, entry.server, read_only) if spec is not None else []
            canaries[entry.server] = found[0] if found else None
        why = entry.obstacle(redactor.replacement) or _obstacle(
            entry, spec, read_only, canaries[entry.server]
        )
        if why is None and entry.server in broken:
            why = broken[entry.server]
        if why is None and answers is not None and answers(entry):
            report.answered_before += 1
            continue
        if why is None and limit is not None and attempted >= limit:
            why = "over --limit"
        if why is not None:
            report.skipped[why] += 1
            continue
        assert spec is not None
        attempted += 1
        try:
            why = await _ask(store, entry, spec, redactor, canaries[entry.server], report)
        except UpstreamError as exc:
            report.problems.append(f"{entry.server}: {exc}")
            broken[entry.server] = f"upstream {entry.server!r} failed earlier in this run"
            why = broken[entry.server]
        if why is not None:
            report.skipped[why] += 1
    if progress is not None:
        progress(len(entries), len(entries))
    if answers is not None:
        report.answered_after = sum(1 for entry in entries if answers(entry))
    return report


async def _ask(
    store: Store,
    entry: MissEntry,
    spec: UpstreamSpec,
    redactor: Redactor,
    canary: Recording | None,
    report: BackfillReport,
) -> str | None:
    """Reset, check, ask the prefix and the missed call, record them; why not, when it stopped short."""
    assert entry.prefix is not None
    if spec.reset is not None:
        report.resets += 1
        await reset(entry.server, spec)
    async with Rerun(entry.server, spec, store, redactor) as rerun:
        try:
            if canary is not None:
                again = await rerun.ask(canary.method, canary.params)
                if again.text != answer_text(canary.result, canary.error):
                    return (
                        f"upstream {entry.server!r} is not in its recorded initial state "
                        f"(recording {canary.id} was answered otherwise)"
                        + ("" if spec.reset else "; give it a reset command")
                    )
            steps = []
            for position, step in enumerate(entry.prefix, 1):
                answer = await rerun.ask(step["method"], step["params"])
                recorded = {answer_text(r.result, r.error) for r in store.recordings(key=step["key"])}
                if recorded and answer.text not in recorded:
                    return f"call {position} before it was answered otherwise than recorded"
                steps.append((step, answer))
            answer = await rerun.ask(entry.method, entry.params)
            for step, step_answer in steps:
                rerun.keep(step["method"], step["params"], step_answer, Origin.BACKFILL)
            rerun.keep(entry.method, entry.params, answer, Origin.BACKFILL)
            report.recorded += 1
            return None
        finally:
            report.asked += rerun.calls


def _distinct(misses: Iterable[MissEntry]) -> list[MissEntry]:
    """One entry per call and state (several logs may hold the same miss), in the order given."""
    seen: set[tuple[str, str]] = set()
    out = []
    for entry in misses:
        state = "?" if entry.prefix is None else "\n".join(str(s.get("key")) for s in entry.prefix)
        if (entry.key, state) not in seen:
            seen.add((entry.key, state))
            out.append(entry)
    return out
