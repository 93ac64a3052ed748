"""Argument invariances: which changes of an argument the real server ignores, as the recordings show.

The canonical tier may equate two calls that differ in an argument only when that difference
cannot change the answer. The differences considered are the registry in :mod:`replay_sim.variants`,
each a *transform* of one top-level argument: surrounding whitespace and letter case of a string,
spellings of a path (repeated separators, a ``./`` prefix, ``..`` segments, a trailing separator),
of a number (``1`` vs ``"1"``), of a date or time (a date vs the same date at midnight, with and
without zero seconds, ``9:00`` vs ``09:00``), repeated and reordered array items — and one of
presence: the argument left out vs given with the value the server assumes without it
(:class:`Default`; defaults the schema declares are filled before any of this).

A transform applies to an argument when the recordings *show* the server ignores it: recorded
calls of the tool, made from the same state and equal in every other argument, whose values of
the argument differ yet are equal once transformed, got the same successful answer — and no such
pair ever got different answers. The agreeing pairs must have given at least
:data:`MIN_EVIDENCE` *different* answers: ``"quantum"`` and ``"QUANTUM"`` both finding nothing
is what a case-sensitive search says too, but a case-sensitive search cannot also find the same
things for ``"Acme"`` and ``"ACME"``. Errors never count as agreement. A default is learned the
same way, from pairs of a call without the argument and one with it: exactly one value must be
shown that way (two would mean the argument is ignored somewhere, not that it has a default).

The design's default (surrounding whitespace of read-only free text that the tool does not echo
is insignificant) holds unless the recordings refute it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any, NamedTuple

from replay_sim.canonical import canonical_json, normalize
from replay_sim.variants import MIN_EVIDENCE, Transform, case_changes, fold_case

__all__ = ["Cased", "Default", "Invariances", "Observation", "Scoped", "Verdict", "apply", "judge", "learn"]


class Verdict(StrEnum):
    """What the recordings say about one transform of one argument."""

    SHOWN = "shown"
    """Pairs of calls differing only by it got the same answers (enough of them)."""
    REFUTED = "refuted"
    """A pair of calls differing only by it got different answers."""
    UNKNOWN = "unknown"
    """Too little evidence either way."""


class Default(NamedTuple):
    """A learned default: a call without the argument is answered as if it passed ``value``."""

    value: Any


class Cased(NamedTuple):
    """Letter case learned ignored for these token classes only (:data:`~replay_sim.variants.CASE_CLASSES`).

    An invariance covers only the difference its evidence exercised: pairs that upper-cased the
    names of ``SELECT name FROM t`` (its keywords were upper case already) say nothing of
    ``count(*)`` vs ``COUNT(*)``, whose function name SQLite echoes as the column label.
    """

    classes: frozenset[str]


class Scoped(NamedTuple):
    """A scoped difference (:attr:`~replay_sim.variants.Transform.scoped`) learned ignored for the
    kinds of difference its evidence pairs made only (:meth:`~replay_sim.variants.Transform.changes`).

    Pairs that padded a query with spaces say nothing of a trailing newline; ``2`` vs ``"2"`` nothing
    of ``"2.50"`` vs ``2.5``; reordered strings nothing of reordered objects.
    """

    transform: Transform
    reach: frozenset[str]


Rule = Default | Cased | Scoped | Transform
Invariances = dict[str, tuple[Rule, ...]]
"""Argument name -> what applies to it, in :class:`Transform` order (a :class:`Default` first)."""


class Observation(NamedTuple):
    """One recorded call, as the judge sees it."""

    state: Hashable
    """The state it was made from (equal states compare equal)."""
    arguments: dict[str, Any]
    """Its arguments, normalised against the schema."""
    answer: str
    """What the server said, canonical."""
    failed: bool
    """The answer is an error: it can refute an invariance, never support one."""


def judge(calls: Sequence[Observation], name: str, transform: Transform) -> Verdict:
    """What the recorded calls of one tool say about ignoring ``transform`` on argument ``name``."""
    if transform is Transform.DEFAULT:
        return _judge_default(calls, name)[0]
    return _judge(_rows(calls, name), transform)


_Row = tuple[tuple[Hashable, str], Any, str, bool]  # (state, the other arguments), value, answer, failed


def _rows(calls: Sequence[Observation], name: str) -> list[_Row]:
    """The calls that pass argument ``name``, grouped by everything else they have in common."""
    return [
        ((c.state, canonical_json(_without(c.arguments, name))), c.arguments[name], c.answer, c.failed)
        for c in calls
        if name in c.arguments
    ]


def _without(arguments: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in arguments.items() if k != name}


def _judge(rows: list[_Row], transform: Transform) -> Verdict:
    if not any(transform.apply(value) != value for _, value, _, _ in rows):
        return Verdict.UNKNOWN  # no two values can differ only by it
    # group -> transformed value -> raw value -> answers
    groups: dict[tuple[Hashable, str], dict[str, dict[str, set[str]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(set))
    )
    failures = set()
    for group, value, answer, failed in rows:
        groups[group][canonical_json(transform.apply(value))][canonical_json(value)].add(answer)
        if failed:
            failures.add(answer)
    support: set[str] = set()
    for classes in groups.values():
        for values in classes.values():
            if len(values) < 2:
                continue  # no pair differing only by the transform
            answers = set().union(*values.values())
            if len(answers) > 1:
                return Verdict.REFUTED
            support |= answers - failures
    return Verdict.SHOWN if len(support) >= MIN_EVIDENCE else Verdict.UNKNOWN


def _judge_default(calls: Sequence[Observation], name: str) -> tuple[Verdict, Any]:
    """Whether leaving ``name`` out is shown to mean one value (and which), refuted, or unknown."""
    # group -> the argument's value, canonical ("" when absent) -> answers
    groups: dict[tuple[Hashable, str], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    values: dict[str, Any] = {}
    failures = set()
    for c in calls:
        key = canonical_json(c.arguments[name]) if name in c.arguments else ""
        values.setdefault(key, c.arguments.get(name))
        groups[(c.state, canonical_json(_without(c.arguments, name)))][key].add(c.answer)
        if c.failed:
            failures.add(c.answer)
    support: dict[str, set[str]] = defaultdict(set)
    refuted: set[str] = set()
    for answers in groups.values():
        if "" not in answers:
            continue  # no call without the argument to pair with
        for key, given in answers.items():
            if key:
                both = answers[""] | given
                if len(both) > 1:
                    refuted.add(key)
                else:
                    support[key] |= both - failures
    shown = [key for key, agreed in support.items() if key not in refuted and len(agreed) >= MIN_EVIDENCE]
    if len(shown) == 1:
        return Verdict.SHOWN, values[shown[0]]
    if refuted and not set(support) - refuted:
        return Verdict.REFUTED, None  # every value paired with its absence got another answer
    return Verdict.UNKNOWN, None


def _reach(rows: list[_Row], transform: Transform) -> frozenset[str]:
    """The kinds of difference the agreeing pairs made (a shown invariance's reach): for letter
    case the token classes (:func:`~replay_sim.variants.case_changes`), else
    :meth:`~replay_sim.variants.Transform.changes`."""
    changes = case_changes if transform is Transform.CASE else transform.changes
    groups: dict[tuple[Hashable, str], dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for group, value, _, failed in rows:
        if not failed:
            groups[group][canonical_json(transform.apply(value))].append(value)
    classes: set[str] = set()
    for spellings in groups.values():
        for values in spellings.values():
            for i, a in enumerate(values):
                for b in values[i + 1 :]:
                    classes |= changes(a, b)
    return frozenset(classes)


def learn(calls: Sequence[Observation], assumed_space: Iterable[str] = ()) -> Invariances:
    """The invariances the recorded calls of one read-only tool show.

    Args:
        calls: Every valid recorded call of the tool.
        assumed_space: Arguments whose surrounding whitespace is insignificant unless refuted.

    Returns:
        Argument name -> what to apply, for every argument with at least one.
    """
    names = sorted({name for call in calls for name in call.arguments} | set(assumed_space))
    assumed = set(assumed_space)
    found: Invariances = {}
    for name in names:
        rows = _rows(calls, name)
        applies: list[Rule] = []
        for transform in Transform:
            if transform is Transform.DEFAULT:
                verdict, value = _judge_default(calls, name)
                if verdict is Verdict.SHOWN:
                    applies.append(Default(value))
                continue
            verdict = _judge(rows, transform)
            if transform is Transform.SPACE and name in assumed and verdict is not Verdict.REFUTED:
                applies.append(transform)  # the design's assumption, whole, until refuted
            elif verdict is Verdict.SHOWN and transform is Transform.CASE:
                applies.append(Cased(_reach(rows, transform)))
            elif verdict is Verdict.SHOWN and transform.scoped:
                applies.append(Scoped(transform, _reach(rows, transform)))
            elif verdict is Verdict.SHOWN:
                applies.append(transform)
        if applies:
            found[name] = tuple(applies)
    return found


def apply(arguments: dict[str, Any], invariances: Mapping[str, Sequence[Rule]]) -> dict[str, Any]:
    """The arguments with every ignored difference taken out (a new object)."""
    out = dict(arguments)
    for name, rules in invariances.items():
        for rule in rules:
            if isinstance(rule, Default):
                out.setdefault(name, normalize(rule.value))  # a copy: recordings share no values
            elif isinstance(rule, Cased):
                if name in out:
                    out[name] = fold_case(out[name], rule.classes)
            elif isinstance(rule, Scoped):
                if name in out:
                    out[name] = rule.transform.apply(out[name], rule.reach)
            elif name in out:
                out[name] = rule.apply(out[name])
    return out
