"""A re-play divergence names the first field that differed: its path, the recorded and re-played value."""

from __future__ import annotations

import json
from typing import Any

import pytest

from replay_sim.replay.policies.divergence import answer_difference, first_difference


def _text(text: str, **more: Any) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], **more}


CASES = [
    pytest.param(
        _text("Changes committed successfully with hash 3f2a9c1"),
        _text("Changes committed successfully with hash 77be012"),
        'content[0].text: recorded …"cessfully with hash 3f2a9c1", re-played …"cessfully with hash 77be012"',
        id="a plain text, shown around where it differs",
    ),
    pytest.param(
        _text(json.dumps({"commits": [{"hash": "aaa", "date": "2024"}, {"hash": "bbb"}]})),
        _text(json.dumps({"commits": [{"hash": "aaa", "date": "2025"}, {"hash": "bbb"}]})),
        'content[0].text → commits[0].date: recorded "2024", re-played "2025"',
        id="a JSON text: the path inside it",
    ),
    pytest.param(
        _text("same", structuredContent={"n": 1}),
        _text("same", structuredContent={"n": 1, "extra": True}),
        "structuredContent.extra: recorded (absent), re-played true",
        id="a field only one side has",
    ),
    pytest.param(
        {"content": [{"type": "text", "text": "a"}]},
        {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        'content[1]: recorded (absent), re-played {"text": "b", "type": "text"}',
        id="a longer list",
    ),
]


@pytest.mark.parametrize(("recorded", "replayed", "said"), CASES)
def test_the_first_differing_field_is_named_with_both_values(
    recorded: dict[str, Any], replayed: dict[str, Any], said: str
) -> None:
    found = answer_difference((recorded, None), (replayed, None))
    assert str(found) == f"first difference at {said}"


def test_answers_that_differ_only_in_meta_or_spelled_out_defaults_have_no_difference() -> None:
    recorded = _text("x", _meta={"stamp": 1})
    assert answer_difference((recorded, None), (_text("x", isError=False), None)) is None


def test_an_error_answered_for_a_result_is_named_at_the_error() -> None:
    found = answer_difference((_text("x"), None), (None, {"code": -32603, "message": "boom"}))
    assert found is not None and found.path == "error"
    assert found.recorded == "null" and "boom" in found.replayed


def test_a_long_value_is_cut_short() -> None:
    found = first_difference("a" * 500 + "X" + "b" * 500, "a" * 500 + "Y" + "b" * 500)
    assert found is not None and len(found.recorded) < 80 and "X" in found.recorded
    assert found.recorded.startswith("…") and found.recorded.endswith("…")
