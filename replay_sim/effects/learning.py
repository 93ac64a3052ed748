"""Every tool's effect, learned from the recorded sessions (:func:`learn`; see :mod:`replay_sim.effects`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from replay_sim.effects.evidence import Evidence, Finding, Span
from replay_sim.effects.model import UNDECLARED, Call, Declaration, Effect, Pair, Verdict

__all__ = ["Learner", "learn"]

_EXAMPLES = 3  # recording pairs kept per verdict, for the reader


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
    return Learner(grows=False).learn(sessions, declared)


class Learner:
    """:func:`learn`, again and again over sessions that grow: each call judged once.

    A served store grows by a batch of answers every few tens of milliseconds, and each batch has
    the server's tool effects learned again. When the sessions given extend those given last (calls
    appended to sessions, sessions added after them), only the calls added are compared, and what
    the earlier ones showed is kept (:class:`~replay_sim.effects.evidence.Evidence`); the verdicts
    are exactly :func:`learn`'s over all the calls. Otherwise (calls removed, reordered or changed,
    or ids that do not tell calls apart) everything is judged again.

    Args:
        grows: Whether sessions will be given again, grown (False: each learning judges every call,
            noting nothing for later).
    """

    def __init__(self, *, grows: bool = True) -> None:
        self._grows = grows
        self._whole = _Judged(grows)
        self._units: _Judged | None = None  # the calls of tools learned per kind, each kind a tool
        self._split: dict[str, set[str | None]] = {}
        self._ids: set[int | None] = set()
        self._exact = True  # every call has an id of its own: pairs of ids tell comparisons apart
        self.started_over = 0
        """How many times the sessions given did not extend the last ones (all judged again)."""

    @property
    def passes(self) -> tuple[int, int]:
        """Evidence passes built over every call, and calls compared again since (for measures)."""
        judged = [self._whole, *([self._units] if self._units is not None else [])]
        return sum(j.built for j in judged), sum(j.compared_again for j in judged)

    def learn(
        self, sessions: Iterable[Sequence[Call]], declared: Mapping[str, Declaration]
    ) -> dict[str, Verdict]:
        """:func:`learn` over ``sessions`` (judging only the calls added since the last ones)."""
        runs = [s if isinstance(s, list) else list(s) for s in sessions]
        added = self._added(runs)
        if added is None:
            self.started_over += 1
            self._whole, self._units, self._split = _Judged(self._grows), None, {}
            self._ids, self._exact = set(), True
            added = list(enumerate(runs))
        for run, calls in added:
            self._whole.append(run, calls)
            if self._grows:  # what was found is kept by pairs of ids: they must tell calls apart
                ids = {c.id for c in calls}
                self._exact &= None not in ids and len(ids) == len(calls) and self._ids.isdisjoint(ids)
                self._ids |= ids
        verdicts = self._whole.verdicts(declared)
        split = self._whole.kinded(verdicts, declared)
        if not split:
            self._units, self._split = None, {}
            return verdicts
        if self._units is None or split != self._split:
            self._units, self._split, added = _Judged(self._grows), split, list(enumerate(self._whole.runs))
        for run, calls in added:
            self._units.append(
                run, [replace(c, name=_unit(c.name, c.kind)) if c.tool in split else c for c in calls]
            )
        as_units = dict(declared)
        for tool, kinds in split.items():
            as_units.update({_unit(tool, k): declared.get(tool, UNDECLARED) for k in kinds})
        learned = self._units.verdicts(as_units)
        for tool, kinds in split.items():
            own = tuple((k, learned[_unit(tool, k)]) for k in sorted(k for k in kinds if k is not None))
            verdicts[tool] = replace(verdicts[tool], kinds=own)
        return verdicts

    def _added(self, runs: list[list[Call]]) -> list[tuple[int, list[Call]]] | None:
        """The calls ``runs`` add to the sessions judged (by session), None when it does not extend them."""
        judged = self._whole.runs
        if not self._exact or len(runs) < len(judged) or (judged and not self._grows):
            return None
        added = []
        for run, (calls, old) in enumerate(zip(runs, judged, strict=False)):
            if len(calls) == len(old):
                if calls != old:  # the same calls, mostly the same objects: compared at C speed
                    return None
            elif len(calls) < len(old) or calls[: len(old)] != old:
                return None
            else:
                added.append((run, calls[len(old) :]))
        added.extend((run, runs[run]) for run in range(len(judged), len(runs)))
        return added


class _Judged:
    """Sessions judged so far, what :func:`learn` needs to know of their calls, and its passes."""

    def __init__(self, grows: bool) -> None:
        self.grows = grows
        self.runs: list[list[Call]] = []
        self._spans: list[Span] = []
        self._tools: set[str] = set()
        self._keys: dict[str, set[str]] = defaultdict(set)  # every call of each tool that could change state
        self._kinds: dict[str, set[str | None]] = defaultdict(set)
        self._answer: dict[str, str] = {}  # each tool's first successful answer
        self._varied: set[str] = set()  # tools whose successful answers differ
        self._passes: dict[tuple[frozenset[str], frozenset[str]], Evidence] = {}
        self.built = 0
        self.compared_again = 0

    def append(self, run: int, calls: list[Call]) -> None:
        """Calls appended to session ``run`` (the next one, when it is new)."""
        if run == len(self.runs):
            self.runs.append([])
        start = len(self.runs[run])
        self.runs[run].extend(calls)
        self._spans.append((run, start, len(self.runs[run])))
        for c in calls:
            if c.method != "tools/call":  # not a tool's call (Call.tool is None)
                continue
            tool = c.name
            self._tools.add(tool)
            if not c.failed and self._answer.setdefault(tool, c.answer) != c.answer:
                self._varied.add(tool)
            if not c.inert:
                self._keys[tool].add(c.key)
                self._kinds[tool].add(c.kind)

    def kinded(
        self, verdicts: Mapping[str, Verdict], declared: Mapping[str, Declaration]
    ) -> dict[str, set[str | None]]:
        """The tools to learn per kind, with their calls' kinds: not effect-free, not fixed, of 2+ kinds."""
        return {
            tool: set(found)
            for tool, found in self._kinds.items()
            if len(found) >= 2 and verdicts[tool].changes_state and not declared.get(tool, UNDECLARED).fixed
        }

    def _evidence(self, none: set[str], varied: frozenset[str], used: dict[Any, Evidence]) -> Evidence:
        """The pass with ``none`` taken as effect-free, over every call (folding in those added)."""
        key = (frozenset(none), varied)
        found = used.get(key) or self._passes.get(key)
        if found is None:
            found = Evidence(self.runs, *key, grows=self.grows)
            self.built += 1
        before = found.compared_again
        found.fold(self._spans[found.folded :])
        found.folded = len(self._spans)
        self.compared_again += found.compared_again - before
        used[key] = found
        return found

    def verdicts(self, declared: Mapping[str, Declaration]) -> dict[str, Verdict]:
        """:func:`learn`, every tool taken whole."""
        tools = self._tools | set(declared)
        decl = {t: declared.get(t, UNDECLARED) for t in tools}
        varied = frozenset(self._varied)
        keys = self._keys
        used: dict[Any, Evidence] = {}
        changes: dict[str, Finding] = {}
        while True:  # starts over when a tool relied on as effect-free turns out to change state
            none = {t for t in tools if decl[t].effect is Effect.NONE and t not in changes}
            witnesses: dict[str, dict[Pair, frozenset[str]]] = defaultdict(dict)
            restart = False
            while True:  # grows the effect-free tools while witnesses allow
                found = self._evidence(none, varied, used)
                fresh = {t: f for t, f in found.contrary().items() if t not in changes and not decl[t].fixed}
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
                for suspects in found.contested():  # one of them changed something: keep it changing
                    if suspects - none <= grown:
                        grown -= suspects
                if not grown:
                    break
                none |= grown
            if not restart:
                break
        self._passes = used  # the passes this learning took: the next one most likely takes them again
        return {t: _verdict(decl[t], t in none, changes.get(t), witnesses.get(t, {})) for t in sorted(tools)}


def _unit(tool: str, kind: str | None) -> str:
    """The name a kind of a tool's calls is learned under (``query [select]``; ``query [?]``: none).

    A space is in no tool's name (MCP tool names are letters, digits, ``_``, ``-`` and ``.``).
    """
    return f"{tool} [{kind or '?'}]"


def _shown(witnessed: set[str], called: set[str]) -> bool:
    """Enough of a tool's calls were seen to change nothing: two different ones (argument sets).

    One call that changed nothing (a write the server refused in its answer's text, an insert
    past what the read shows) says little about the tool's other calls — even its only one.
    """
    return len(witnessed & called) >= 2


def _verdict(
    declaration: Declaration, none: bool, contrary: Finding | None, witnesses: dict[Pair, frozenset[str]]
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
