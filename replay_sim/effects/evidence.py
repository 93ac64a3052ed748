"""One pass of the effect judge over the sessions (:class:`Evidence`), kept up to date as they grow.

With some tools taken as effect-free, each recorded call is compared with the earlier call of its
key in its session, and with the other sessions' recordings of its key from its own state or from a
state its own extends by calls of one tool (see :mod:`replay_sim.effects`): what agrees witnesses,
what differs is a change. Sessions only grow (calls appended, sessions added), so a pass folds in
the calls added since it last looked and keeps what the earlier ones found. A call's comparisons
within its session never change once made. Across sessions it reads *groups* — the first recording
of each answer of its key from a state — so it is compared again only when a group it read gained
an answer or an earlier recording of one (an earlier session grew).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from replay_sim.effects.model import Call, Pair
from replay_sim.effects.sensitivity import can_show
from replay_sim.effects.things import covers

__all__ = ["Evidence", "Finding", "Span"]

_MAX_SPAN = 256  # calls between two compared recordings (and extension steps) looked at, at most

Span = tuple[int, int, int]
"""Calls appended to a session: ``(session, start, stop)``, indexes into its run."""
_At = tuple[int, int]  # a call's place: (session, index), the order a full pass visits calls in
_Group = tuple[str, int]  # (key, state)


@dataclass(frozen=True, slots=True)
class Finding:
    """A change attributable to one tool, shown by a pair of recordings."""

    tool: str
    pair: Pair
    why: str


@dataclass(slots=True, eq=False)
class _Found:
    """What one call's comparisons found, in the order they found it."""

    contrary: list[Finding] = field(default_factory=list)
    witnesses: list[tuple[str, Pair, frozenset[str]]] = field(default_factory=list)
    contested: frozenset[str] | None = None  # changed after calls of several tools of unknown effect


_NOTHING = _Found()  # what most calls' comparisons find (never added to)


@dataclass(slots=True, eq=False)
class _Point:
    """Where one recorded call stands, and what its comparisons found."""

    call: Call
    at: _At
    chain: list[int]  # the session's state hashes, shared (valid up to ``depth``)
    steps: list[Call]  # the session's state-changing calls, shared (valid up to ``depth``)
    depth: int  # how many state-changing calls precede it
    within: _Found = _NOTHING  # in its session: final once found
    across: _Found = _NOTHING  # across sessions: found again when a group moves

    def found(self, *, across: bool) -> _Found:
        """Where its comparisons (within its session, or across) note what they find."""
        if across:
            if self.across is _NOTHING:
                self.across = _Found()
            return self.across
        if self.within is _NOTHING:
            self.within = _Found()
        return self.within


class Evidence:
    """What one pass over the sessions finds with ``none`` taken as effect-free, as they grow.

    Args:
        runs: Every session's calls in recorded order, grown in place by the owner (only appended).
        none: The tools taken as effect-free.
        varied: The tools whose successful answers differ (only they witness their own effect).
        grows: Whether calls will be folded in later (False: one fold, no note of what each call read).
    """

    def __init__(
        self, runs: list[list[Call]], none: frozenset[str], varied: frozenset[str], *, grows: bool = True
    ) -> None:
        self.runs, self.none, self.varied, self.grows = runs, none, varied, grows
        self.folded = 0
        """How many of the owner's spans are folded in."""
        self.compared_again = 0
        """Calls compared again because a group they read moved (a measure of the pass's work)."""
        self._chains: list[list[int]] = []
        self._steps: list[list[Call]] = []
        self._last: dict[tuple[int, str], _Point] = {}  # (session, key) -> its latest call
        self._groups: dict[_Group, dict[str, _Point]] = {}  # answer -> its first recording, in order
        self._readers: dict[_Group, list[_Point]] = {}  # the calls that read a group from their own state
        self._extenders: dict[_Group, list[_Point]] = {}  # ... from a state their own extends
        self.witnesses: dict[str, dict[Pair, frozenset[str]]] = defaultdict(dict)
        """Tool -> agreeing pair -> the keys of its calls that pair saw change nothing."""
        self._contrary: dict[str, dict[_At, Finding]] = defaultdict(dict)  # each call's last, by tool
        self._latest: dict[str, _At] = {}
        self._contested: dict[frozenset[str], _At] = {}  # suspects -> where first contested

    def contrary(self) -> dict[str, Finding]:
        """Each tool's change found last (in the calls' order): the one a full pass reports."""
        return {tool: self._contrary[tool][at] for tool, at in self._latest.items()}

    def contested(self) -> list[frozenset[str]]:
        """Changes after calls of several tools of unknown effect (not all are effect-free), in order.

        Each set once, where first found: a set found again can shrink nothing more.
        """
        return sorted(self._contested, key=self._contested.__getitem__)

    def fold(self, spans: Sequence[Span]) -> None:
        """Take in calls appended to the sessions (each span once, in the order they were appended)."""
        if self.folded and spans and not self.grows:
            raise ValueError("a pass that does not grow is folded once")
        added: list[_Point] = []
        moved: dict[_Group, _At] = {}  # groups whose answers moved -> the earliest place they moved at
        for run, start, stop in spans:
            if run == len(self._chains):
                self._chains.append([0])
                self._steps.append([])
            chain, steps = self._chains[run], self._steps[run]
            for index in range(start, stop):
                call = self.runs[run][index]
                point = _Point(call, (run, index), chain, steps, len(steps))
                added.append(point)
                group = (call.key, chain[-1])
                read = group in self._readers or group in self._extenders
                if self._join(group, point) and read:  # a group no call read yet moves nothing
                    moved[group] = min(moved.get(group, point.at), point.at)
                if _changing(call, self.none):
                    chain.append(hash((chain[-1], call.key)))
                    steps.append(call)
        again: dict[int, _Point] = {}
        for group, at in moved.items():
            for reader in self._readers.get(group, ()):
                if reader.at > at:  # from its own state only earlier recordings count
                    again[id(reader)] = reader
            for reader in self._extenders.get(group, ()):
                again[id(reader)] = reader
        for point in added:
            self._within(point)
            self._across(point, read=self.grows)
            self._add(point)
        for point in again.values():
            self.compared_again += 1
            self._remove(point)
            point.across = _NOTHING
            self._across(point, read=False)
            self._add(point)

    def _join(self, group: _Group, point: _Point) -> bool:
        """Put ``point`` in its group; whether the group moved (a new answer or an earlier first)."""
        answers = self._groups.get(group)
        if answers is None:
            self._groups[group] = {point.call.answer: point}
            return True
        first = answers.get(point.call.answer)
        if first is not None and first.at < point.at:
            return False
        in_order = first is None and next(reversed(answers.values())).at < point.at  # the latest, added last
        answers[point.call.answer] = point
        if not in_order:  # kept in the calls' order, as a pass over every call finds them
            self._groups[group] = dict(sorted(answers.items(), key=lambda item: item[1].at))
        return True

    def _within(self, point: _Point) -> None:
        """Compare ``point`` with the latest earlier call of its key in its session."""
        call, (run, index) = point.call, point.at
        previous = self._last.get((run, call.key))
        self._last[(run, call.key)] = point
        if previous is None or index - previous.at[1] > _MAX_SPAN:
            return
        between = [c for c in self.runs[run][previous.at[1] : index] if _acting(c)]
        changing = [c for c in between if c.name not in self.none]
        suspects = frozenset(c.name for c in changing)
        if not changing:
            self._same_state(point, False, previous, between)
        elif len(suspects) == 1:
            self._extended(point, False, previous, changing)
        elif call.answer != previous.call.answer:
            point.found(across=False).contested = suspects

    def _across(self, point: _Point, *, read: bool) -> None:
        """Compare ``point`` with other sessions' recordings from its state, or from one its state
        extends by calls of one tool only (``read``: note the groups it reads, for later moves)."""
        call, depth, steps, chain = point.call, point.depth, point.steps, point.chain
        for back in range(min(depth, _MAX_SPAN) + 1):
            j = depth - back
            if back and steps[j].name != steps[depth - 1].name:
                break
            group = (call.key, chain[j])
            if read:
                (self._extenders if back else self._readers).setdefault(group, []).append(point)
            for other in self._groups.get(group, {}).values():
                if other.at[0] == point.at[0]:
                    continue
                if back:
                    self._extended(point, True, other, steps[j:depth])
                elif other.call.answer != call.answer and other.at < point.at:
                    (r, i), (s, k) = other.at, point.at
                    prefixes = [*self.runs[r][:i], *self.runs[s][:k]]
                    between = [c for c in prefixes if _acting(c) and c.name in self.none]
                    self._same_state(point, True, other, between)

    @staticmethod
    def _witness(after: _Point, across: bool, a: Call, tool: str, calls: Sequence[Call]) -> None:
        """``a`` and ``after`` agree across ``calls``: a witness for those of them ``a`` covers."""
        seen = frozenset(c.key for c in calls if covers(a, c) and can_show(a, c))
        if seen:
            after.found(across=across).witnesses.append((tool, (a.id, after.call.id), seen))

    def _extended(self, after: _Point, across: bool, before: _Point, calls: Sequence[Call]) -> None:
        """``after``'s state is ``before``'s and ``calls`` (all of one tool of unknown effect)."""
        a, b, tool = before.call, after.call, calls[0].name
        if a.answer != b.answer:
            why = f"{a.name} before/after differed (recordings {a.id}, {b.id})"
            after.found(across=across).contrary.append(Finding(tool, (a.id, b.id), why))
        elif not a.failed and (a.tool != tool or tool in self.varied):
            self._witness(after, across, a, tool, calls)

    def _same_state(self, after: _Point, across: bool, before: _Point, between: Sequence[Call]) -> None:
        """Nothing of unknown effect between them: their answers must agree."""
        a, b = before.call, after.call
        tools = {c.name for c in between}
        if a.answer == b.answer:
            if len(tools) == 1 and not a.failed:
                tool = next(iter(tools))
                if a.tool != tool or tool in self.varied:
                    self._witness(after, across, a, tool, between)
            return
        why = f"{a.name} answered differently from one state (recordings {a.id}, {b.id})"
        # Something taken as effect-free is not: each one that could be (its own tool included).
        found = after.found(across=across)
        for tool in sorted(tools & self.none or ({a.tool} if a.tool is not None else set())):
            found.contrary.append(Finding(tool, (a.id, b.id), why))

    def _add(self, point: _Point) -> None:
        """Count what ``point``'s comparisons found (its last change per tool is the one kept)."""
        if point.within is _NOTHING and point.across is _NOTHING:
            return
        for tool, pair, seen in (*point.within.witnesses, *point.across.witnesses):
            self.witnesses[tool][pair] = seen
        for finding in (*point.within.contrary, *point.across.contrary):
            self._contrary[finding.tool][point.at] = finding
            if point.at >= self._latest.get(finding.tool, point.at):
                self._latest[finding.tool] = point.at
        if point.within.contested is not None:
            self._contested.setdefault(point.within.contested, point.at)

    def _remove(self, point: _Point) -> None:
        """Take back what ``point``'s comparisons across sessions found (its own session's stay)."""
        for tool, pair, _ in point.across.witnesses:
            del self.witnesses[tool][pair]
            if not self.witnesses[tool]:
                del self.witnesses[tool]
        for tool in {finding.tool for finding in point.across.contrary}:
            found = self._contrary[tool]
            del found[point.at]
            kept = [f for f in point.within.contrary if f.tool == tool]
            if kept:
                found[point.at] = kept[-1]
            elif not found:
                del self._contrary[tool], self._latest[tool]
            elif self._latest[tool] == point.at:
                self._latest[tool] = max(found)


def _acting(call: Call) -> bool:
    """A tool call that may have changed state (not refused, not a dry run)."""
    return call.tool is not None and not call.inert


def _changing(call: Call, none: frozenset[str]) -> bool:
    """A call that is part of the state: it acted, and its tool is not taken as effect-free."""
    return _acting(call) and call.name not in none
