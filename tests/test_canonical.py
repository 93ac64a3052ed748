"""Canonical JSON and call keys (table-driven, like vcrpy's matcher table)."""

from __future__ import annotations

import pytest

from replay_sim.canonical import answer_text, call_identity, call_key, canonical_json, normalize

EQUAL = [
    ("key order does not matter", {"b": 1, "a": 2}, {"a": 2, "b": 1}),
    ("integral floats equal ints", {"n": 1.0}, {"n": 1}),
    ("negative zero is zero", {"n": -0.0}, {"n": 0}),
    ("nested key order", {"o": {"y": [1, 2], "x": None}}, {"o": {"x": None, "y": [1, 2]}}),
    ("strings compare in NFC", {"s": "cafe\u0301"}, {"s": "caf\u00e9"}),
    ("keys compare in NFC", {"cafe\u0301": 1}, {"caf\u00e9": 1}),
    ("tuples are arrays", {"a": (1, 2)}, {"a": [1, 2]}),
]

DIFFERENT = [
    ("array order is kept", {"a": [1, 2]}, {"a": [2, 1]}),
    ("true is not 1", {"a": True}, {"a": 1}),
    ("null is not absent", {"a": None}, {}),
    ("string is not number", {"a": "1"}, {"a": 1}),
    ("non-integral floats stay floats", {"a": 1.5}, {"a": 1}),
    ("whitespace in strings is significant", {"a": " x"}, {"a": "x"}),
]


@pytest.mark.parametrize(("label", "left", "right"), EQUAL, ids=[row[0] for row in EQUAL])
def test_equal_calls_have_equal_canonical_json_and_keys(label: str, left: dict, right: dict) -> None:
    assert canonical_json(left) == canonical_json(right)
    assert call_key("git", "tools/call", "git_log", left) == call_key("git", "tools/call", "git_log", right)


@pytest.mark.parametrize(("label", "left", "right"), DIFFERENT, ids=[row[0] for row in DIFFERENT])
def test_different_calls_have_different_keys(label: str, left: dict, right: dict) -> None:
    assert call_key("git", "tools/call", "git_log", left) != call_key("git", "tools/call", "git_log", right)


def test_canonical_json_is_compact_sorted_and_keeps_non_ascii() -> None:
    assert canonical_json({"b": [1, {"d": 2.0, "c": "é"}], "a": None}) == '{"a":null,"b":[1,{"c":"é","d":2}]}'


def test_key_separates_server_method_and_name() -> None:
    keys = {
        call_key("a", "tools/call", "t", {}),
        call_key("b", "tools/call", "t", {}),
        call_key("a", "prompts/get", "t", {}),
        call_key("a", "tools/call", "u", {}),
    }
    assert len(keys) == 4


def test_key_is_a_stable_golden_value() -> None:
    # A change here invalidates every store ever recorded: bump the schema version if it is intended.
    assert call_key("time", "tools/call", "get_current_time", {"timezone": "UTC"}) == (
        "1c655010be6db82212bf17d6574bdd873438a27ee249482bf0a322550bbe6b04"
    )


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), {1: "x"}, {"a": object()}])
def test_values_json_cannot_hold_are_rejected(bad: object) -> None:
    with pytest.raises(ValueError):
        normalize(bad)


IDENTITY = [
    ("tools/call", {"name": "t", "arguments": {"x": 1}, "_meta": {"progressToken": 1}}, ("t", {"x": 1})),
    ("tools/call", {"name": "t"}, ("t", {})),
    ("prompts/get", {"name": "p", "arguments": {"a": "b"}}, ("p", {"a": "b"})),
    ("resources/read", {"uri": "file:///x"}, ("file:///x", {})),
    (
        "completion/complete",
        {"ref": {"type": "ref/prompt", "name": "p"}, "argument": {"name": "a", "value": "v"}},
        ("p", {"argument": {"name": "a", "value": "v"}, "ref": {"type": "ref/prompt", "name": "p"}}),
    ),
]


@pytest.mark.parametrize(("method", "params", "expected"), IDENTITY)
def test_call_identity_splits_params_per_method_and_ignores_meta(
    method: str, params: dict, expected: tuple
) -> None:
    assert call_identity(method, params) == expected


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        (
            {"content": [], "isError": False, "resultType": "complete"},
            {"content": []},
            True,
        ),  # SDK dump vs raw
        ({"content": [], "_meta": {"x": 1}}, {"content": []}, True),
        ({"content": [], "isError": True}, {"content": []}, False),
        ({"content": [], "resultType": "input_required"}, {"content": []}, False),
        ({"contents": [], "ttlMs": 0, "cacheScope": "private"}, {"contents": []}, True),  # 2026-era hints
        ({"contents": [], "ttlMs": 60000}, {"contents": []}, False),
    ],
)
def test_answers_equal_when_they_differ_only_in_what_a_default_means(a: dict, b: dict, same: bool) -> None:
    assert (answer_text(a, None) == answer_text(b, None)) is same
    assert answer_text(None, {"code": 1, "message": "m", "data": None}) == answer_text(
        None, {"code": 1, "message": "m"}
    )
