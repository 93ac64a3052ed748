"""What the resolver knows of a candidate answer, as the confidence model's features.

A *candidate* is a recording the resolver could answer a call with: the recording of the very
call (``exact``), of a call equal after normalisation (``canonical``), or the tool's nearest
recording by embedding (``nearest``), each made from the episode's state or from another one.
Its features are evidence the store holds, all binary so that each has one weight a reader can
judge (:mod:`replay_sim.resolve.confidence.model`):

- how it was matched (tier), and for a nearest recording whether its identifiers differ and how
  close its free text is (cumulative similarity bins: monotone by construction);
- whether it was made from another state than the episode's, and whether the episode's own state
  is one no recording followed;
- whether other recordings of the same call agree with it or disagree, and whether the tool's
  repeated calls ever disagreed. For a candidate made from the episode's state only recordings
  from that same state bear on it (:func:`bearing`: a disagreement there is a server answering
  one call two ways); recordings from other states show how the answer depends on state, which
  is evidence against a candidate from another state and says nothing of one from this state.
  A disagreement is told apart by where it came from: from a state that only calls known to be
  effect-free separate from the candidate's (``call_disagrees``: the server answers one call two
  ways), or only across calls that may have changed state (``call_varies``: the state's doing);
- the tool's effect, declared or learned (:mod:`replay_sim.effects`);
- whether the recorded answer is a failure.

The same function describes a candidate at serve time and in leave-one-out training
(:mod:`replay_sim.resolve.confidence.leaveoneout`), where the hidden recording is left out of every
count: what a feature means in training is what it means when serving.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from replay_sim.effects import Effect, Verdict, named
from replay_sim.resolve.toolstate import answer_of
from replay_sim.store import Recording

__all__ = ["FEATURES", "CallAnswers", "Feature", "Formed", "bearing", "describe", "repeated_calls"]


@dataclass(frozen=True, slots=True)
class Feature:
    """One binary feature: its name, the sign its weight is held to (0: free) and what it says."""

    name: str
    sign: int
    says: str


FEATURES: tuple[Feature, ...] = (
    Feature("canonical", 0, "matched after normalising the arguments, not by the exact key"),
    Feature("nearest", -1, "the tool's nearest recording by embedding, not the same call"),
    Feature("identifiers_differ", -1, "a nearest recording whose ids, paths, numbers or enums differ"),
    Feature("similarity>=0.8", 1, "free text at cosine 0.8 or more"),
    Feature("similarity>=0.9", 1, "free text at cosine 0.9 or more"),
    Feature("similarity>=0.95", 1, "free text at cosine 0.95 or more"),
    Feature("other_state", -1, "recorded after state changes this episode did not make (or lost track of)"),
    Feature("diverged", -1, "the episode changed state in a way no recording followed: its state is unknown"),
    Feature("gap_writes", -1, "those state changes include a call of a tool known to change state"),
    Feature("gap_same_tool", -1, "those state changes include calls of this very tool"),
    Feature("gap_names_shared", -1, "those state changes name a thing this call names (a path, a table)"),
    Feature("gap_names_nothing", 0, "those state changes name nothing (numbers and prose only)"),
    Feature("call_agrees", 1, "other recordings of this call that bear on it all gave this answer"),
    Feature(
        "call_disagrees",
        -1,
        "a recording of this call that bears on it, from a state nothing could have changed, said otherwise",
    ),
    Feature("call_varies", -1, "only recordings of this call across possible state changes said otherwise"),
    Feature("tool_consistent", 1, "from another state: each call of the tool recorded twice got one answer"),
    Feature("tool_inconsistent", -1, "from another state: a call of the tool recorded twice got two answers"),
    Feature("effect_free", 1, "the tool changes nothing (declared, or learned from the recordings)"),
    Feature("effect_learned", 1, "the tool was shown effect-free by recorded evidence"),
    Feature("changes_state", 0, "the tool is known to change state"),
    Feature("failure", 0, "the recorded answer is an error"),
)
"""Every feature, in the model's order."""

_INDEX = {f.name: i for i, f in enumerate(FEATURES)}


@dataclass(frozen=True, slots=True)
class Formed:
    """A candidate answer: the recording, how it matches the call, and from which state.

    Attributes:
        recording: The recording that would answer.
        kind: ``exact``, ``canonical`` or ``nearest``.
        score: Cosine of a nearest recording's text (1.0 otherwise).
        other_state: Made after state changes the episode did not make (or the episode diverged).
        same_identifiers: A nearest recording's non-free-text arguments equal the call's.
        gap: For another state: the recorded state-changing calls by which the candidate's state
            and the episode's differ, each with whether its tool is known to change state.
        diverged: For another state: the episode changed state in a way no recording followed.
    """

    recording: Recording
    kind: str
    score: float = 1.0
    other_state: bool = False
    same_identifiers: bool = True
    gap: tuple[tuple[Recording, bool], ...] = ()
    diverged: bool = False


class CallAnswers:
    """A tool's answers per call, and its repeated-call counts kept current as recordings are
    added: ``agreed``, the calls recorded more than once that got one answer, and ``disagreed``,
    those that got several."""

    def __init__(self) -> None:
        self.said: dict[str, Counter[str]] = {}
        self.agreed = 0
        self.disagreed = 0

    def add(self, key: str, answer: str) -> None:
        """Count one recording of call ``key`` that answered ``answer``."""
        said = self.said.setdefault(key, Counter())
        before = _kind(said)
        said[answer] += 1
        self._moved(before, _kind(said))

    def counts(self) -> tuple[int, int]:
        """``(agreed, disagreed)``."""
        return self.agreed, self.disagreed

    def without(self, key: str, answer: str) -> tuple[int, int]:
        """``(agreed, disagreed)`` with one counted recording of call ``key`` left out."""
        said = self.said[key]
        before, after = _kind(said), _kind(said - Counter({answer: 1}))
        return (
            self.agreed - (before == "agreed") + (after == "agreed"),
            self.disagreed - (before == "disagreed") + (after == "disagreed"),
        )

    def _moved(self, before: str | None, after: str | None) -> None:
        self.agreed += (after == "agreed") - (before == "agreed")
        self.disagreed += (after == "disagreed") - (before == "disagreed")


def _kind(said: Counter[str]) -> str | None:
    """A call's answers: ``agreed`` (recorded more than once, one answer), ``disagreed`` (several)."""
    if len(said) > 1:
        return "disagreed"
    return "agreed" if said.total() > 1 else None


def repeated_calls(recordings: Iterable[Recording], exclude: int | None = None) -> tuple[int, int]:
    """``(calls recorded more than once that got one answer, that got several)`` of one tool.

    Args:
        recordings: The tool's recordings.
        exclude: A recording to leave out (the hidden one, in leave-one-out).
    """
    tally = CallAnswers()
    for rec in recordings:
        if rec.id != exclude:
            tally.add(rec.key, answer_of(rec))
    return tally.counts()


def bearing(
    formed: Formed, same_call: Sequence[Recording], state_of: Callable[[Recording], Sequence[str]]
) -> list[Recording]:
    """The recordings of a candidate's own call that bear on it.

    From the episode's state, those made from the candidate's own state: the strict resolver has
    already matched the state, so another state's answer says nothing against it (a stateful
    tool's reads differ across states by design), while two answers from one state show a server
    answering one call two ways. From another state, all of them: how the call's answer varies
    with state is exactly the risk of serving it.

    Args:
        formed: The candidate.
        same_call: The recordings of the candidate's key.
        state_of: The state-changing calls made before a recording (``StateLookup.state_of``).
    """
    if formed.other_state:
        return list(same_call)
    mine = state_of(formed.recording)
    return [r for r in same_call if state_of(r) == mine]


def describe(
    formed: Formed,
    same_call: Sequence[Recording],
    repeated: tuple[int, int],
    effect: Verdict | None,
    exclude: int | None = None,
    separated: Callable[[Recording], bool] = lambda other: False,
    answer: Callable[[Recording], str] = answer_of,
) -> np.ndarray:
    """The feature vector of a candidate.

    Args:
        formed: The candidate.
        same_call: The recordings of the candidate's own key that bear on it (:func:`bearing`).
        repeated: Its tool's repeated calls that agreed and disagreed (:func:`repeated_calls`).
        effect: The tool's effect (None for resources, prompts, completions: effect-free reads).
        exclude: A recording to leave out of every count (the hidden one, in leave-one-out).
        separated: Whether a recording of the call was made across possible state changes from
            the candidate's state (:func:`~.forming.across_writes`): its other answer is
            ``call_varies``, not ``call_disagrees``.
        answer: A recording's canonical answer (leave-one-out passes one that remembers them).

    Returns:
        A 0/1 float vector in :data:`FEATURES` order.
    """
    x = np.zeros(len(FEATURES))

    def on(name: str, value: bool = True) -> None:
        if value:
            x[_INDEX[name]] = 1.0

    rec = formed.recording
    on("canonical", formed.kind == "canonical")
    if formed.kind == "nearest":
        on("nearest")
        on("identifiers_differ", not formed.same_identifiers)
        on("similarity>=0.8", formed.score >= 0.8)
        on("similarity>=0.9", formed.score >= 0.9)
        on("similarity>=0.95", formed.score >= 0.95)
    on("other_state", formed.other_state)
    on("diverged", formed.diverged)
    if formed.gap:
        mine_named = named(rec.arguments)
        on("gap_writes", any(known for _, known in formed.gap))
        on("gap_same_tool", any(g.name == rec.name for g, _ in formed.gap))
        on("gap_names_shared", any(named(g.arguments) & mine_named for g, _ in formed.gap))
        on("gap_names_nothing", all(not named(g.arguments) for g, _ in formed.gap))
    said = _agreement(rec, [r for r in same_call if r.id not in (rec.id, exclude)], separated, answer)
    on("call_agrees", said == "agrees")
    on("call_disagrees", said == "disagrees")
    on("call_varies", said == "varies")
    if formed.other_state:  # from this state, a tool's state dependence is what the state match settles
        agreed, disagreed = repeated
        on("tool_consistent", agreed > 0 and disagreed == 0)
        on("tool_inconsistent", disagreed > 0)
    if effect is None or effect.effect is Effect.NONE:
        on("effect_free")
        on("effect_learned", effect is not None and effect.source == "evidence")
    on("changes_state", effect is not None and effect.effect is Effect.CHANGES)
    on("failure", rec.failed)
    return x


def _agreement(
    rec: Recording,
    others: Sequence[Recording],
    separated: Callable[[Recording], bool],
    answer: Callable[[Recording], str],
) -> str | None:
    """Whether the other recordings gave ``rec``'s answer: ``agrees`` (all did), ``disagrees`` (one
    made from a state no possible change separates did not), ``varies`` (only ones made across
    possible changes did not), None (there are none).

    The first unexplained disagreement settles it; one recorded with the very same result is the
    same answer without its canonical form, and once the answer is known to vary across changes,
    another recording across changes is not compared at all: a call every episode makes has as
    many recordings as episodes, and this runs for each answer judged.
    """
    if not others:
        return None
    mine, varies = None, False
    for other in others:
        if other.result == rec.result and other.error == rec.error:
            continue
        apart = separated(other)
        if apart and varies:
            continue
        mine = answer(rec) if mine is None else mine
        if answer(other) != mine:
            if not apart:
                return "disagrees"
            varies = True
    return "varies" if varies else "agrees"
