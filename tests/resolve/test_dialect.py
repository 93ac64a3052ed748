"""What recordings show a server doing with arguments its schema calls invalid (table-driven)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from replay_sim.resolve.dialect import SchemaEvidence, adapt_refusal
from replay_sim.schema import ToolSchema, Violation
from replay_sim.store import Recording, Store

SCHEMA = ToolSchema(
    "log",
    {
        "type": "object",
        "properties": {"repo": {"type": "string"}, "count": {"type": "integer", "default": 10}},
        "required": ["repo"],
    },
)
PYDANTIC_TEN = (
    "Error executing tool log: 1 validation error for logArguments\ncount\n  Input should be a valid "
    "integer, unable to parse string as an integer [type=int_parsing, input_value='ten', input_type=str]"
)
ZOD_TEN = "MCP error -32602: Input validation error: Invalid input: expected number, received string at count"

# (arguments, answer, failed)
Recorded = list[tuple[dict[str, Any], str, bool]]


def _recordings(tmp_path: Path, recorded: Recorded) -> list[Recording]:
    store = Store(tmp_path / "r.db")
    store.start_session("s", "s-1")
    for arguments, answer, failed in recorded:
        result = {"content": [{"type": "text", "text": answer}], "isError": failed}
        store.record_call(
            "s", "tools/call", {"name": "log", "arguments": arguments}, result=result, session="s-1"
        )
    return store.recordings("s", method="tools/call", name="log")


def _evidence(tmp_path: Path, recorded: Recorded) -> SchemaEvidence:
    return SchemaEvidence(SCHEMA, _recordings(tmp_path, recorded))


@pytest.mark.parametrize(
    ("recorded", "arguments", "refused", "unproven"),
    [
        # Nothing recorded: a loose type is unproven (servers coerce), never refused on the schema's word.
        ([], {"repo": "/r", "count": "2"}, None, ["count"]),
        # The server accepted "2": "3" is the same kind of value.
        ([({"repo": "/r", "count": "2"}, "2 commits", False)], {"repo": "/r", "count": "3"}, None, []),
        # The server refused "ten", naming the argument: "eleven" is refused too ...
        (
            [({"repo": "/r", "count": "ten"}, PYDANTIC_TEN, True)],
            {"repo": "/r", "count": "eleven"},
            "count",
            ["count"],
        ),
        (
            [({"repo": "/r", "count": "ten"}, ZOD_TEN, True)],
            {"repo": "/r", "count": "eleven"},
            "count",
            ["count"],
        ),
        # ... but not "3": a number in a string is another kind of value (pydantic coerces it).
        (
            [({"repo": "/r", "count": "ten"}, PYDANTIC_TEN, True)],
            {"repo": "/r", "count": "3"},
            None,
            ["count"],
        ),
        # A failure that names neither the argument nor its value is no evidence of a refusal.
        (
            [({"repo": "/r", "count": "ten"}, "not a git repository", True)],
            {"repo": "/r", "count": "x"},
            None,
            ["count"],
        ),
        # Nor is a failed call with two violations: which one was refused is unknown.
        ([({"count": "ten"}, PYDANTIC_TEN, True)], {"repo": "/r", "count": "x"}, None, ["count"]),
        # Accepted beats refused: the server took the kind once, so it is not refused.
        (
            [
                ({"repo": "/r", "count": "ten"}, PYDANTIC_TEN, True),
                ({"repo": "/r", "count": "one"}, "1 commit", False),
            ],
            {"repo": "/r", "count": "x"},
            None,
            [],
        ),
        # A failure with an accepted violation beside the open one still speaks for the open one.
        (
            [
                ({"repo": "/r", "count": "2"}, "2 commits", False),
                (
                    {"repo": 5, "count": "2"},
                    "1 validation error\nrepo\n  Input should be a valid string",
                    True,
                ),
            ],
            {"repo": 7},
            "repo",
            ["repo"],
        ),
        # A missing required argument is refused by every server ...
        ([], {"count": 2}, "repo", ["repo"]),
        # ... unless the recordings show this one answering without it.
        ([({"count": 1}, "1 commit", False)], {"count": 2}, None, []),
    ],
)
def test_violations_are_judged_by_what_the_recordings_show(
    tmp_path: Path, recorded: Recorded, arguments: dict[str, Any], refused: str | None, unproven: list[str]
) -> None:
    judgement = _evidence(tmp_path, recorded).judge(arguments)
    assert (judgement.refusal.path if judgement.refusal else None) == refused
    assert [v.path for v in judgement.unproven] == unproven


def test_only_a_recording_that_made_the_same_violation_speaks_for_an_unproven_call(tmp_path: Path) -> None:
    (failed,) = _recordings(tmp_path, [({"repo": "/r", "count": "2"}, "boom", True)])
    evidence = SchemaEvidence(SCHEMA, [failed])
    assert not evidence.proven(failed)  # it failed, and not visibly for its "2": nothing is shown
    same, other = evidence.judge({"repo": "/r", "count": "2"}), evidence.judge({"repo": "/r", "count": "3"})
    assert same.unproven and evidence.same_violations(same, failed)
    assert other.unproven and not evidence.same_violations(other, failed)


@pytest.mark.parametrize(
    ("text", "old", "new", "expected"),
    [
        (PYDANTIC_TEN, "ten", "eleven", PYDANTIC_TEN.replace("'ten'", "'eleven'")),
        (
            "Input validation error: 'ten' is not of type 'integer'",
            "ten",
            "x",
            "Input validation error: 'x' is not of type 'integer'",
        ),
        (
            'Expected boolean or "true"/"false" string, received "maybe"',
            "maybe",
            "perhaps",
            'Expected boolean or "true"/"false" string, received "perhaps"',
        ),
        (
            ZOD_TEN,
            "ten",
            "eleven",
            ZOD_TEN,
        ),  # the message quotes no value: the same for every value of the kind
        (
            "count: not a whole number: often",
            "ten",
            "x",
            "count: not a whole number: often",
        ),  # no partial words
    ],
)
def test_a_recorded_refusal_is_reworded_for_the_new_value(
    text: str, old: str, new: str, expected: str
) -> None:
    made = Violation("type", "count", "string", "", old)
    asked = Violation("type", "count", "string", "", new)
    assert adapt_refusal(text, made, asked, {"count": old}, {"count": new}) == expected


def test_a_refusal_quoting_the_whole_arguments_quotes_the_new_ones() -> None:
    text = (
        "1 validation error\nrepo\n  Field required [type=missing, input_value={'count': 2}, input_type=dict]"
    )
    made = Violation("required", "repo", "", "", None, True)
    assert adapt_refusal(text, made, made, {"count": 2}, {"count": 5}) == text.replace(
        "{'count': 2}", "{'count': 5}"
    )
