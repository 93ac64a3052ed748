"""Exploring a store after the fact: ``replay-sim explore``.

``record --explore`` asks a real server the variants of each read-only call while recording it
(:mod:`replay_sim.record.explore`). A store recorded without it — or imported from JSONL — holds
no such pairs, so the resolver learns nothing of what its tools ignore. :func:`explore_store` asks
them afterwards, from the store's own calls:

- only successful calls of tools known to change nothing (annotated read-only and not refuted, or
  shown so by the recordings: the caller says which, :mod:`replay_sim.effects` decides), never the
  recorder's own variants or an LLM's made-up answers, never a call holding a redacted value (the
  server would be asked ``[REDACTED]``);
- only calls recorded at the *initial state* of their session — no call that may change state
  before them — because a fresh connection starts there (a server's ``reset`` command, when the
  recorder config gives one, is run before it, for servers whose state outlives their process);
- each asked again first, in the fresh session, and explored only if the server answers it as
  recorded: an answer that changed says the server is not in the state the recording was made in
  (or answers vary), and nothing is learned from it;
- only the variants still undecided: what the store's recordings already settle is not asked again
  (:meth:`Explorer.resume <replay_sim.record.explore.Explorer.resume>`), and the budget per tool,
  argument and difference counts the calls earlier runs made.

Every call asked is recorded (origin ``explore``) in one new session per server, the re-asked call
before its variants: the pairs the resolver learns from are made from one state.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from replay_sim.canonical import answer_text, canonical_json
from replay_sim.errors import UpstreamError
from replay_sim.record.config import RecorderConfig
from replay_sim.record.explore import Explorer
from replay_sim.record.rerun import Rerun, recording_redactor, reset
from replay_sim.store import Origin, Recording, Store

__all__ = ["ExploreReport", "explore_store", "initial_calls"]

ReadOnly = Callable[[str, str], bool]
"""``(server, tool) -> bool``: whether calling the tool changes nothing (its effect is ``none``)."""
Progress = Callable[[int, int], None]
"""``(done, total)`` calls considered."""

_NOT_ORIGINALS = (Origin.EXPLORE, Origin.SYNTHETIC)


@dataclass
class ExploreReport:
    """What an after-the-fact exploration did, per server and in all."""

    considered: int = 0
    """Recorded read-only calls at an initial state (distinct calls)."""
    explored: int = 0
    """Of those, asked again and explored."""
    asked: int = 0
    """Calls sent to the real servers (re-asked originals and variants)."""
    settled: int = 0
    """Calls left alone: every variant of them was settled already, or over budget."""
    skipped: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    """Calls not explored, by why."""
    problems: list[str] = field(default_factory=list)
    """Servers that could not be explored, and why (one line each)."""

    def lines(self) -> list[str]:
        """The report, for the CLI."""
        out = [
            f"explored {self.explored} of {self.considered} recorded read-only calls at an initial state "
            f"({self.settled} already settled), {self.asked} calls to the real servers"
        ]
        out += [f"  skipped {n}: {why}" for why, n in sorted(self.skipped.items())]
        out += [f"  {problem}" for problem in self.problems]
        return out


def initial_calls(store: Store, server: str, read_only: ReadOnly) -> list[Recording]:
    """``server``'s successful read-only tool calls recorded at the initial state of their session.

    One per distinct call (the first recorded), in recorded order. A call is at the initial state
    when no call before it in its session may have changed state: every earlier tool call failed
    or is of a tool ``read_only`` says changes nothing (other requests change nothing).
    """
    sessions: dict[Any, list[Recording]] = defaultdict(list)
    for rec in store.recordings(server):
        sessions[rec.session if rec.session is not None else ("", rec.id)].append(rec)
    found: dict[str, Recording] = {}
    for calls in sessions.values():
        calls.sort(key=lambda r: (r.seq or 0, r.id))
        for rec in calls:
            if rec.method != "tools/call":
                continue
            if not read_only(server, rec.name):
                if not rec.failed:
                    break  # what follows was recorded from another state
                continue
            if not rec.failed and rec.origin not in _NOT_ORIGINALS:
                found.setdefault(rec.key, rec)
    return sorted(found.values(), key=lambda r: r.id)


async def explore_store(
    store: Store,
    config: RecorderConfig,
    read_only: ReadOnly,
    *,
    budget: int = 4,
    max_calls: int | None = None,
    servers: list[str] | None = None,
    progress: Progress | None = None,
) -> ExploreReport:
    """Ask the real servers the undecided variants of a store's read-only calls; record the answers.

    Args:
        store: The recording store (written to).
        config: The recorder config: how to reach each server, its ``reset`` command, redaction.
        read_only: Whether a tool changes nothing (``none`` effect), per server.
        budget: Most variant calls per tool, argument and difference, counting earlier runs'.
        max_calls: Most calls sent to the real servers in this run (None: no limit).
        servers: Only these recorded servers (default: every recorded server the config names).
        progress: Called as calls are considered.

    Returns:
        What was done and skipped. A server that cannot be started or reset is reported there,
        and the others are explored.
    """
    report = ExploreReport()
    recorded = {s.name for s in store.servers()}
    names = [n for n in (servers or sorted(config.servers)) if n in recorded and n in config.servers]
    work = {name: initial_calls(store, name, read_only) for name in names}
    total = sum(len(calls) for calls in work.values())
    done = 0
    redactor = recording_redactor(store, config.redactor)
    marker = redactor.replacement
    for name, calls in work.items():
        start = done
        explorer = Explorer(budget=budget)
        explorer.resume(store, name)
        todo = []
        for rec in calls:
            report.considered += 1
            if marker in canonical_json(rec.params):
                report.skipped["holds a redacted value"] += 1
            else:
                tool = explorer.tools.get(rec.name)
                wanted = explorer.variants(
                    rec.name, rec.arguments, None if tool is None else tool.input_schema
                )
                if wanted:
                    todo.append(rec)
                else:
                    report.settled += 1
        done += len(calls) - len(todo)
        if progress is not None:
            progress(done, total)
        if not todo:
            continue
        spec = config.servers[name]
        rerun: Rerun | None = None
        try:
            if spec.reset is not None:
                await reset(name, spec)
            async with Rerun(name, spec, store, redactor) as rerun:
                for rec in todo:
                    if max_calls is not None and report.asked + rerun.calls >= max_calls:
                        report.skipped["over --max-calls"] += 1
                    else:
                        await _explore_one(rerun, explorer, rec, report, max_calls)
                    done += 1
                    if progress is not None:
                        progress(done, total)
        except UpstreamError as exc:
            report.problems.append(f"{name}: not explored: {exc}")
            done = start + len(calls)
        finally:
            report.asked += 0 if rerun is None else rerun.calls
    return report


async def _explore_one(
    rerun: Rerun, explorer: Explorer, rec: Recording, report: ExploreReport, max_calls: int | None
) -> None:
    """Ask ``rec`` again and, if answered as recorded, its undecided variants; record them all."""
    tool = explorer.tools.get(rec.name)
    wanted = explorer.variants(rec.name, rec.arguments, None if tool is None else tool.input_schema)
    if not wanted:  # settled by an earlier call of this run
        report.settled += 1
        return
    again = await rerun.ask(rec.method, rec.params)
    if again.text != answer_text(rec.result, rec.error):
        report.skipped["answered otherwise than recorded (not the recorded state, or varying answers)"] += 1
        return
    rerun.keep(rec.method, rec.params, again, Origin.EXPLORE)
    if max_calls is not None:
        wanted = wanted[: max(0, max_calls - report.asked - rerun.calls)]

    async def ask(arguments: dict[str, Any]) -> str:
        params = {**rec.params, "arguments": arguments}
        answer = await rerun.ask(rec.method, params)
        rerun.keep(rec.method, params, answer, Origin.EXPLORE)
        return answer.text

    await explorer.explore(wanted, again.text, ask)
    report.explored += 1
