"""Learning tool effects again as sessions grow judges only the calls added: the verdicts are a full
learn's over all the calls (hypothesis: random calls, in random batches, with declarations and kinds)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay_sim.effects import Call, Declaration, Learner, declare, learn
from replay_sim.effects.model import UNDECLARED

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

TOOLS = ("read", "write", "query", "calc")
DECLARATIONS = st.sampled_from(
    [
        UNDECLARED,
        declare({"readOnlyHint": True}),  # effect-free until evidence says otherwise
        declare({"readOnlyHint": False}),  # changes, for good
        declare(None, read_only=True),  # the matching config: effect-free, for good
    ]
)


@st.composite
def calls(draw: Any) -> dict[str, Any]:
    """One call's parts (its id is given when it is placed): small domains, so keys and answers repeat."""
    resource = draw(st.integers(0, 9)) == 0
    tool = draw(st.sampled_from(TOOLS))
    argument = draw(st.sampled_from(["a", "b", "c"]))
    failed = draw(st.integers(0, 7)) == 0
    name = f"file:///{argument}" if resource else tool
    return {
        "method": "resources/read" if resource else "tools/call",
        "name": name,
        "key": f"{name}({argument})",
        "answer": draw(st.sampled_from(["A", "B", "ok", "0 replacements", "a and b"])),
        "failed": failed,
        "inert": resource or failed or draw(st.integers(0, 9)) == 0,
        "names": frozenset({argument}) if draw(st.booleans()) else frozenset(),
        "kind": None if resource else draw(st.sampled_from([None, "select", "insert"])),
        "selectors": frozenset({argument.upper()}) if draw(st.integers(0, 4)) == 0 else frozenset(),
    }


# A batch: calls each appended to a session (an index past the last starts a new one).
batches = st.lists(st.lists(st.tuples(st.integers(0, 6), calls()), max_size=8), min_size=1, max_size=6)


@SETTINGS
@given(
    batches=batches,
    declared=st.lists(st.dictionaries(st.sampled_from(TOOLS), DECLARATIONS), min_size=6, max_size=6),
)
def test_judging_only_the_calls_added_gives_a_full_learns_verdicts(
    batches: list[list[tuple[int, dict[str, Any]]]], declared: list[dict[str, Declaration]]
) -> None:
    learner, sessions, ids = Learner(), [], iter(range(1, 10**6))
    for batch, declarations in zip(batches, declared, strict=False):
        for session, parts in batch:
            if session >= len(sessions):
                sessions.append([])
                session = len(sessions) - 1
            sessions[session].append(Call(next(ids), **parts))
        assert learner.learn(sessions, declarations) == learn(sessions, declarations)
    assert learner.started_over == 0


@SETTINGS
@given(
    before=st.lists(st.lists(calls(), min_size=1, max_size=6), max_size=4),
    after=st.lists(calls(), max_size=6),
)
def test_sessions_that_do_not_extend_the_last_ones_are_judged_again_whole(
    before: list[list[dict[str, Any]]], after: list[dict[str, Any]]
) -> None:
    ids = iter(range(1, 10**6))
    first = [[Call(next(ids), **parts) for parts in run] for run in before]
    learner = Learner()
    learner.learn(first, {})
    changed = [run[1:] for run in first] + [[Call(next(ids), **parts) for parts in after]]  # calls taken back
    assert learner.learn(changed, {}) == learn(changed, {})
    assert learner.started_over == (1 if any(first) else 0)


def test_calls_without_ids_of_their_own_are_judged_again_whole_each_time() -> None:
    # What a pass found is kept by the pair of ids that showed it: without ids, nothing is kept.
    read, write = (
        Call(None, "tools/call", "r", "r(a)", "A", False, False),
        Call(None, "tools/call", "w", "w(1)", "ok", False, False),
    )
    sessions = [[read, write, read]]
    learner = Learner()
    learner.learn(sessions, {})
    sessions[0].append(write)
    sessions.append([read, write, read])
    assert learner.learn(sessions, {}) == learn(sessions, {})
    assert learner.started_over == 1
