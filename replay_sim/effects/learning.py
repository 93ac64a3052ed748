"""Every tool's effect, learned from the recorded sessions (:func:`learn`; see :mod:`replay_sim.effects`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from replay_sim.effects.model import UNDECLARED, Call, Declaration, Effect, Pair, Verdict
from replay_sim.effects.sensitivity import can_show
from replay_sim.effects.things import covers

__all__ = ["learn"]

_MAX_SPAN = 256  # calls between two compared recordings (and extension steps) looked at, at most
_EXAMPLES = 3  # recording pairs kept per verdict, for the reader


@dataclass(frozen=True, slots=True)
class _Finding:
    tool: str
    pair: Pair
    why: str


@dataclass(slots=True)
class _Evidence:
    """What one pass over the sessions found, with some tools taken as effect-free."""

    witnesses: dict[str, dict[Pair, frozenset[str]]] = field(default_factory=lambda: defaultdict(dict))
    """Tool -> agreeing pair -> the keys of its calls that pair saw change nothing."""
    contrary: list[_Finding] = field(default_factory=list)
    """Changes attributable to one tool."""
    contested: list[frozenset[str]] = field(default_factory=list)
    """Changes after calls of several tools of unknown effect: not all of them are effect-free."""


def learn(sessions: Iterable[Sequence[Call]], declared: Mapping[str, Declaration]) -> dict[str, Verdict]:
    """Every tool's effect, from its declaration and the recorded sessions.

    A tool that is not effect-free as a whole and not declared so for good, whose calls differ in
    kind (:attr:`Call.kind`: ``select`` and ``insert`` calls of one SQL tool), also gets a verdict
    per kind (:attr:`Verdict.kinds`), learned again with each kind of its calls taken as a tool of
    its own: a kind is effect-free only where its own calls' evidence shows it. The tool's own
    verdict is the one learned whole, so per-kind verdicts only ever narrow what counts as a change.

    Args:
        sessions: Each session's calls in recorded order (a call with no session is a session of one).
        declared: Declarations by tool name (tools without one are :attr:`Effect.UNKNOWN`).

    Returns:
        A verdict for every declared tool and every tool called in ``sessions``.
    """
    runs = [list(s) for s in sessions]
    verdicts = _learn(runs, declared)
    split = _kinded(runs, verdicts, declared)
    if not split:
        return verdicts
    units = [[replace(c, name=_unit(c.name, c.kind)) if c.tool in split else c for c in run] for run in runs]
    as_units = dict(declared)
    for tool, kinds in split.items():
        as_units.update({_unit(tool, k): declared.get(tool, UNDECLARED) for k in kinds})
    learned = _learn(units, as_units)
    for tool, kinds in split.items():
        own = tuple((k, learned[_unit(tool, k)]) for k in sorted(k for k in kinds if k is not None))
        verdicts[tool] = replace(verdicts[tool], kinds=own)
    return verdicts


def _unit(tool: str, kind: str | None) -> str:
    """The name a kind of a tool's calls is learned under (``query [select]``; ``query [?]``: none).

    A space is in no tool's name (MCP tool names are letters, digits, ``_``, ``-`` and ``.``).
    """
    return f"{tool} [{kind or '?'}]"


def _kinded(
    runs: list[list[Call]], verdicts: Mapping[str, Verdict], declared: Mapping[str, Declaration]
) -> dict[str, set[str | None]]:
    """The tools to learn per kind, with their calls' kinds: not effect-free, not fixed, of 2+ kinds."""
    kinds: dict[str, set[str | None]] = defaultdict(set)
    for run in runs:
        for c in run:
            if c.tool is not None and not c.inert:
                kinds[c.tool].add(c.kind)
    return {
        tool: found
        for tool, found in kinds.items()
        if len(found) >= 2 and verdicts[tool].changes_state and not declared.get(tool, UNDECLARED).fixed
    }


def _learn(runs: list[list[Call]], declared: Mapping[str, Declaration]) -> dict[str, Verdict]:
    """:func:`learn`, every tool taken whole."""
    tools = {c.tool for run in runs for c in run if c.tool is not None} | set(declared)
    decl = {t: declared.get(t, UNDECLARED) for t in tools}
    varied = _varied(runs)
    keys: dict[str, set[str]] = defaultdict(set)  # every call of each tool that could change state
    for run in runs:
        for c in run:
            if c.tool is not None and not c.inert:
                keys[c.tool].add(c.key)
    changes: dict[str, _Finding] = {}
    while True:  # starts over when a tool relied on as effect-free turns out to change state
        none = {t for t in tools if decl[t].effect is Effect.NONE and t not in changes}
        witnesses: dict[str, dict[Pair, frozenset[str]]] = defaultdict(dict)
        restart = False
        while True:  # grows the effect-free tools while witnesses allow
            found = _evidence(runs, none, varied)
            fresh = {f.tool: f for f in found.contrary if f.tool not in changes and not decl[f.tool].fixed}
            changes.update(fresh)
            if none & set(fresh):
                restart = True
                break
            for tool, pairs in found.witnesses.items():
                witnesses[tool].update(pairs)
            grown = {
                t
                for t, pairs in witnesses.items()
                if t not in none and t not in changes and decl[t].effect is Effect.UNKNOWN
                and _shown(set().union(*pairs.values()), keys[t])
            }  # fmt: skip
            for suspects in found.contested:  # one of them changed something: keep it changing
                if suspects - none <= grown:
                    grown -= suspects
            if not grown:
                break
            none |= grown
        if not restart:
            break
    return {t: _verdict(decl[t], t in none, changes.get(t), witnesses.get(t, {})) for t in sorted(tools)}


def _shown(witnessed: set[str], called: set[str]) -> bool:
    """Enough of a tool's calls were seen to change nothing: two different ones (argument sets).

    One call that changed nothing (a write the server refused in its answer's text, an insert
    past what the read shows) says little about the tool's other calls — even its only one.
    """
    return len(witnessed & called) >= 2


def _verdict(
    declaration: Declaration, none: bool, contrary: _Finding | None, witnesses: dict[Pair, frozenset[str]]
) -> Verdict:
    examples = tuple(sorted(witnesses, key=lambda p: (p[0] or 0, p[1] or 0))[:_EXAMPLES])
    shown = len(set().union(*witnesses.values()))
    if declaration.fixed:
        return Verdict(declaration.effect, declaration.source, declaration.reason, examples, shown=shown)
    if contrary is not None:
        return Verdict(Effect.CHANGES, "evidence", contrary.why, examples, contrary.pair, shown)
    reads = f"{len(witnesses)} read{'s' if len(witnesses) != 1 else ''} unchanged"
    if none and witnesses:
        reason = f"{reads} ({_pairs(examples)}{', …' if len(witnesses) > len(examples) else ''})"
        if declaration.effect is Effect.NONE:
            reason = f"{declaration.reason}; {reason}"
            return Verdict(Effect.NONE, declaration.source, reason, examples, shown=shown)
        return Verdict(Effect.NONE, "evidence", reason, examples, shown=shown)
    if declaration.effect is Effect.UNKNOWN and witnesses:
        reason = (
            f"{reads}, after {shown} of its calls: too few to tell (two different calls that a read "
            "could have shown changing something are needed)"
        )
        return Verdict(Effect.UNKNOWN, declaration.source, reason, examples, shown=shown)
    return Verdict(declaration.effect, declaration.source, declaration.reason)


def _pairs(pairs: Sequence[Pair]) -> str:
    shown = ", ".join(f"{a} and {b}" for a, b in pairs)
    return f"recordings {shown}" if len(pairs) == 1 else f"recording pairs {shown}"


def _varied(runs: list[list[Call]]) -> set[str]:
    """Tools whose successful answers differ: only they can witness their own effect."""
    answers: dict[str, set[str]] = defaultdict(set)
    for run in runs:
        for c in run:
            if c.tool is not None and not c.failed:
                answers[c.tool].add(c.answer)
    return {t for t, a in answers.items() if len(a) > 1}


@dataclass(slots=True)
class _Point:
    """Where one recorded call stands: its session, position and state."""

    call: Call
    run: int
    index: int
    chain: list[int]  # the session's state hashes, shared (valid up to ``depth``)
    steps: list[Call]  # the session's state-changing calls, shared (valid up to ``depth``)
    depth: int  # how many state-changing calls precede it


def _evidence(runs: list[list[Call]], none: set[str], varied: set[str]) -> _Evidence:
    """Witnesses, attributable changes and contested changes, with ``none`` taken as effect-free."""
    found = _Evidence()
    points: list[_Point] = []
    groups: dict[tuple[str, int], dict[str, _Point]] = defaultdict(dict)  # (key, state) -> answer -> first
    for r, run in enumerate(runs):
        chain: list[int] = [0]
        steps: list[Call] = []
        for i, call in enumerate(run):
            point = _Point(call, r, i, chain, steps, len(steps))
            points.append(point)
            groups[(call.key, chain[-1])].setdefault(call.answer, point)
            if _changing(call, none):
                chain.append(hash((chain[-1], call.key)))
                steps.append(call)

    def witness(a: Call, b: Call, tool: str, calls: Sequence[Call]) -> None:
        """``a`` and ``b`` agree across ``calls``: a witness for those of them ``a`` covers."""
        seen = frozenset(c.key for c in calls if covers(a, c) and can_show(a, c))
        if seen:
            found.witnesses[tool][(a.id, b.id)] = seen

    def extended(before: _Point, after: _Point, calls: Sequence[Call]) -> None:
        """``after``'s state is ``before``'s and ``calls`` (all of one tool of unknown effect)."""
        a, b, tool = before.call, after.call, calls[0].name
        if a.answer != b.answer:
            why = f"{a.name} before/after differed (recordings {a.id}, {b.id})"
            found.contrary.append(_Finding(tool, (a.id, b.id), why))
        elif not a.failed and (a.tool != tool or tool in varied):
            witness(a, b, tool, calls)

    def same_state(before: _Point, after: _Point, between: Sequence[Call]) -> None:
        """Nothing of unknown effect between them: their answers must agree."""
        a, b = before.call, after.call
        tools = {c.name for c in between}
        if a.answer == b.answer:
            if len(tools) == 1 and not a.failed:
                tool = next(iter(tools))
                if a.tool != tool or tool in varied:
                    witness(a, b, tool, between)
            return
        why = f"{a.name} answered differently from one state (recordings {a.id}, {b.id})"
        # Something taken as effect-free is not: each one that could be (its own tool included).
        for tool in sorted(tools & none or ({a.tool} if a.tool is not None else set())):
            found.contrary.append(_Finding(tool, (a.id, b.id), why))

    last: dict[tuple[int, str], _Point] = {}
    for point in points:
        call = point.call
        previous = last.get((point.run, call.key))
        last[(point.run, call.key)] = point
        if previous is not None and point.index - previous.index <= _MAX_SPAN:
            between = [c for c in runs[point.run][previous.index : point.index] if _acting(c)]
            changing = [c for c in between if c.name not in none]
            suspects = frozenset(c.name for c in changing)
            if not changing:
                same_state(previous, point, between)
            elif len(suspects) == 1:
                extended(previous, point, changing)
            elif call.answer != previous.call.answer:
                found.contested.append(suspects)
        # Across sessions: another session's recording from this state, or from one this state
        # extends by calls of one tool only.
        depth, steps, chain = point.depth, point.steps, point.chain
        for back in range(min(depth, _MAX_SPAN) + 1):
            j = depth - back
            if back and steps[j].name != steps[depth - 1].name:
                break
            for other in groups.get((call.key, chain[j]), {}).values():
                if other.run == point.run:
                    continue
                if back:
                    extended(other, point, steps[j:depth])
                elif other.call.answer != call.answer and (other.run, other.index) < (point.run, point.index):
                    prefixes = [*runs[other.run][: other.index], *runs[point.run][: point.index]]
                    same_state(other, point, [c for c in prefixes if _acting(c) and c.name in none])
    return found


def _acting(call: Call) -> bool:
    """A tool call that may have changed state (not refused, not a dry run)."""
    return call.tool is not None and not call.inert


def _changing(call: Call, none: set[str]) -> bool:
    """A call that is part of the state: it acted, and its tool is not taken as effect-free."""
    return _acting(call) and call.name not in none
