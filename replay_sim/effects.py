"""Which tools change a server's state: declared, or learned from what the recordings show.

Replay chooses among the recordings of a call by the *state* they were made from — the
state-changing calls before them in their session (:mod:`replay_sim.resolve.lineage`) — so it
must know which calls change state. A tool's :class:`Effect` is, in this order of precedence:

1. declared by the matching config (``read_only``): final;
2. declared by the server: ``readOnlyHint: true`` says it changes nothing — until the recordings
   show otherwise (a read-only hint can hide state: a tool that numbers what it was told); an
   explicit ``readOnlyHint: false`` (or, without it, ``destructiveHint: true``) says it changes
   state, and no read that saw nothing change overrides that;
3. otherwise learned from the recordings, :attr:`Effect.UNKNOWN` (treated as changing) until then.

**Evidence.** A recorded call was made from a *state*: the calls before it in its session whose
tools are not known to be effect-free (failed calls, dry runs and non-tool requests change nothing).
Two recordings of one call (same key) are compared when nothing but calls of one tool ``T`` lies
between their states — a read recorded before and after ``T`` in one session, with only ``T`` and
effect-free calls between; or, across sessions (which all start from the server's initial state),
one's state extended by calls of ``T`` only:

- the same successful answer is a *witness* that ``T`` changes nothing that read can see — except
  that a tool witnesses its own effect only when its answers vary (a write that always says "ok"
  shows nothing by repeating it), and only for the calls of ``T`` the read *covers*
  (:func:`covers`): a call that names a thing (a path, a name, a key, an id, a table) is witnessed
  only by a read that names it too (or the folder of a path it names), or whose answer shows it —
  reading ``b.txt`` shows nothing about writing ``a.txt``;
- a different answer shows that ``T`` changes state, whatever it is annotated;
- two recordings from the *same* state that disagree show the model wrong: the call's own tool
  depends on history (it keeps hidden state), or else the effect-free calls between them are not.

A tool is :attr:`Effect.NONE` only with a witness and no contrary evidence. Learning one tool
effect-free shortens states, which can make other recordings comparable: :func:`learn` iterates
to a fixpoint, and starts over whenever a tool it relied on turns out to change state.

What no recorded read saw, no evidence shows: a write whose effect no recorded read observed can be
learned effect-free. The recorder's effect probes (:mod:`replay_sim.record.explore`) re-read what a
session read before, choosing reads that share an argument with the call first; the matching
config's ``read_only = false`` settles a tool for good.
"""

from __future__ import annotations

import posixpath
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from replay_sim.freetext import looks_like_code

__all__ = ["Call", "Declaration", "Effect", "Verdict", "covers", "declare", "learn", "named", "repeatable"]

_MAX_SPAN = 256  # calls between two compared recordings (and extension steps) looked at, at most
_EXAMPLES = 3  # recording pairs kept per verdict, for the reader


# Argument name words that mean "this names the thing a call acts on or reads".
_THING_WORDS = frozenset(
    {
        "id", "ids", "uuid", "key", "keys", "path", "paths", "file", "files", "filename", "filepath",
        "dir", "directory", "folder", "uri", "url", "name", "names", "table", "tables", "entity",
        "entities", "node", "nodes", "repo", "repository", "branch", "collection", "document", "slug",
    }
)  # fmt: skip
_SQL_TABLE = re.compile(
    r"\b(?:from|into|update|table|join)\s+(?:if\s+(?:not\s+)?exists\s+)?[`\"\[]?([A-Za-z_][\w.]*)", re.I
)
_MIN_SHOWN = 3  # a name shorter than this found in an answer is a coincidence, not a sighting


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [t for t in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if t]


def _leaves(value: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """``(the key holding it, string)`` for every string inside an argument value."""
    if isinstance(value, dict):
        for k, item in value.items():
            yield from _leaves(item, str(k))
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item, key)
    elif isinstance(value, str) and value:
        yield key, value
    elif isinstance(value, int) and not isinstance(value, bool) and key:
        yield key, str(value)


def named(arguments: Any) -> frozenset[str]:
    """What a call names (lower case): the things it acts on or reads.

    The values of arguments named like a thing (``path``, ``file_path``, ``name``, ``entityNames``,
    ``key``, ``id``, ``table``, ``uri`` …) and the tables a SQL text names (``FROM``, ``INTO``,
    ``UPDATE``, ``TABLE``, ``JOIN``). Prose, numbers and options name nothing.
    """
    found: set[str] = set()
    if not isinstance(arguments, dict):
        return frozenset()
    for key, text in _leaves(arguments):
        if any(word in _THING_WORDS for word in _words(key)) and len(text) <= 1024:
            found.add(text.strip().lower())
        elif looks_like_code(text):
            found.update(t.lower() for t in _SQL_TABLE.findall(text))
    return frozenset(found)


def covers(observer: Call, call: Call) -> bool:
    """Whether ``observer`` could see what ``call`` does: it names what the call names, or shows it.

    A call that names nothing (a pure function of numbers and prose) is covered by any observer;
    otherwise the observer must name one of the things the call names (or the folder holding a
    path it names: listing a folder sees a file created in it), or its answer must show one.
    """
    if not call.names:
        return True
    folders = {posixpath.dirname(n.rstrip("/")) for n in call.names if "/" in n.rstrip("/")}
    if observer.names & (call.names | folders):
        return True
    answer = observer.answer.lower()
    return any(len(n) >= _MIN_SHOWN and n in answer for n in call.names)


class Effect(StrEnum):
    """What calling a tool does to the state later answers depend on."""

    NONE = "none"
    """Changes nothing a later answer depends on: declared read-only, or shown so by witnesses."""
    CHANGES = "changes"
    """Changes state: declared so, or a recorded answer changed after it (or depends on history)."""
    UNKNOWN = "unknown"
    """No evidence either way; treated as changing state, the safe assumption for replay."""


@dataclass(frozen=True, slots=True)
class Declaration:
    """What the matching config or the server says about a tool, before any evidence."""

    effect: Effect
    fixed: bool
    """Evidence cannot change it."""
    source: str
    """``config``, ``annotation`` or ``default``."""
    reason: str


_DEFAULT = Declaration(Effect.UNKNOWN, False, "default", "no evidence")


def declare(annotations: Mapping[str, Any] | None, read_only: bool | None = None) -> Declaration:
    """A tool's effect as declared.

    Args:
        annotations: The tool's ``annotations`` as listed by its server.
        read_only: The matching config's ``read_only`` for the tool (None: not set).
    """
    if read_only is not None:
        effect = Effect.NONE if read_only else Effect.CHANGES
        return Declaration(effect, True, "config", f"matching config: read_only = {str(read_only).lower()}")
    hints = annotations or {}
    if hints.get("readOnlyHint") is True:  # destructiveHint means something only when it is not
        return Declaration(Effect.NONE, False, "annotation", "annotated readOnlyHint: true")
    if hints.get("readOnlyHint") is False:
        return Declaration(Effect.CHANGES, True, "annotation", "annotated readOnlyHint: false")
    if hints.get("destructiveHint") is True:
        return Declaration(Effect.CHANGES, True, "annotation", "annotated destructiveHint: true")
    return _DEFAULT


def repeatable(annotations: Mapping[str, Any] | None) -> bool:
    """Whether the server says calling the tool again is harmless (read-only or idempotent)."""
    hints = annotations or {}
    return hints.get("readOnlyHint") is True or hints.get("idempotentHint") is True


@dataclass(frozen=True, slots=True)
class Call:
    """One recorded call, as the effect judge sees it.

    Attributes:
        id: The recording's id (None when not stored yet).
        method: Its MCP method.
        name: The tool, prompt or resource it asked for.
        key: Its exact key (:func:`~replay_sim.canonical.call_key`).
        answer: What the server said, canonical (:func:`~replay_sim.canonical.answer_text`).
        failed: The answer is an error: it can contradict a witness, never be one.
        inert: It cannot have changed state whatever its tool does (failed, a dry run, not a tool call).
        names: The things it names (:func:`named`; a resource read: its URI).
    """

    id: int | None
    method: str
    name: str
    key: str
    answer: str
    failed: bool
    inert: bool
    names: frozenset[str] = frozenset()

    @property
    def tool(self) -> str | None:
        """The tool called, or None for other requests."""
        return self.name if self.method == "tools/call" else None


Pair = tuple[int | None, int | None]


@dataclass(frozen=True, slots=True)
class Verdict:
    """A tool's effect and why.

    Attributes:
        effect: What calling it does to state.
        source: ``config``, ``annotation``, ``evidence`` or ``default``.
        reason: One line for a reader (``3 reads unchanged``, ``read_file before/after differed``).
        witnesses: Recording pairs that saw no change (a few).
        contrary: The recording pair that showed a change, if any.
        shown: How many different calls of the tool were seen to change nothing.
    """

    effect: Effect
    source: str
    reason: str
    witnesses: tuple[Pair, ...] = ()
    contrary: Pair | None = None
    shown: int = 0

    @property
    def changes_state(self) -> bool:
        """Whether replay must treat its calls as state changes (anything but :attr:`Effect.NONE`)."""
        return self.effect is not Effect.NONE

    def describe(self) -> str:
        """``effect: reason``, e.g. ``none: 3 reads unchanged (recordings 4 and 7, …)``."""
        return f"{self.effect}: {self.reason}"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (the stats command and the admin API)."""
        return {
            "effect": str(self.effect),
            "source": self.source,
            "reason": self.reason,
            "witnesses": [list(p) for p in self.witnesses],
            "contrary": None if self.contrary is None else list(self.contrary),
            "shown": self.shown,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        """The verdict :meth:`as_dict` wrote (a store keeps learned verdicts so).

        Raises:
            KeyError, TypeError, ValueError: ``data`` is not such a form.
        """
        contrary = data["contrary"]
        return cls(
            Effect(data["effect"]),
            str(data["source"]),
            str(data["reason"]),
            tuple((a, b) for a, b in data["witnesses"]),
            None if contrary is None else (contrary[0], contrary[1]),
            int(data["shown"]),
        )


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

    Args:
        sessions: Each session's calls in recorded order (a call with no session is a session of one).
        declared: Declarations by tool name (tools without one are :attr:`Effect.UNKNOWN`).

    Returns:
        A verdict for every declared tool and every tool called in ``sessions``.
    """
    runs = [list(s) for s in sessions]
    tools = {c.tool for run in runs for c in run if c.tool is not None} | set(declared)
    decl = {t: declared.get(t, _DEFAULT) for t in tools}
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
    """Enough of a tool's calls were seen to change nothing: two different ones, or every one made.

    One call that changed nothing (a write the server refused in its answer's text) says little
    about the tool's other calls.
    """
    return len(witnessed) >= 2 or (bool(witnessed) and called <= witnessed)


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
        reason = f"{reads}, after {shown} of its calls: too few to tell (two different ones needed)"
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
        seen = frozenset(c.key for c in calls if covers(a, c))
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
