"""Schema-aware classification and canonical normalisation (table-driven)."""

from __future__ import annotations

from typing import Any

import pytest

from replay_sim.schema import ToolSchema, is_free_text, tool_schemas

STRING = {"type": "string"}


@pytest.mark.parametrize(
    ("name", "prop", "free"),
    [
        ("query", STRING, True),
        ("message", STRING, True),
        ("content", STRING, True),
        ("description", STRING, True),
        ("prompt", STRING, True),
        ("search_query", STRING, True),
        ("text", {"anyOf": [{"type": "string"}, {"type": "null"}]}, True),
        ("path", STRING, False),
        ("repo_path", STRING, False),
        ("uri", STRING, False),
        ("url", STRING, False),
        ("id", STRING, False),
        ("user_id", STRING, False),
        ("entityName", STRING, False),
        ("name", STRING, False),
        ("timezone", STRING, False),
        ("branch_name", STRING, False),
        ("message_id", STRING, False),
        ("query", {"type": "string", "enum": ["a", "b"]}, False),
        ("query", {"type": "string", "format": "uri"}, False),
        ("query", {"type": "string", "pattern": "^[a-z]+$"}, False),
        ("query", {"type": "integer"}, False),
        ("text", {"type": "string", "description": "Path to the file"}, False),
        ("time", {"type": "string", "description": "Time to convert in 24-hour format (HH:MM)"}, False),
        ("start_timestamp", STRING, False),
        ("topic", STRING, True),
        ("flag", {"type": "boolean"}, False),
    ],
)
def test_free_text_is_decided_conservatively_from_name_and_schema(
    name: str, prop: dict[str, Any], free: bool
) -> None:
    assert is_free_text(name, prop) is free


SCHEMA = {
    "type": "object",
    "properties": {
        "query": {"type": "string"},
        "path": {"type": "string"},
        "limit": {"type": "integer", "default": 10},
        "since": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"x": {"type": "number"}, "flag": {"type": "boolean", "default": False}},
            },
        },
    },
    "required": ["path"],
}


@pytest.mark.parametrize(
    ("arguments", "normalised"),
    [
        ({"path": "/a"}, {"path": "/a", "limit": 10}),
        ({"path": "/a", "limit": 10}, {"path": "/a", "limit": 10}),
        ({"path": "/a", "limit": 10.0}, {"path": "/a", "limit": 10}),
        ({"path": "/a", "since": None}, {"path": "/a", "limit": 10}),
        ({"path": "/a", "query": "  hi  "}, {"path": "/a", "limit": 10, "query": "  hi  "}),
        ({"path": " /a "}, {"path": " /a ", "limit": 10}),
        (
            {"path": "/a", "items": [{"x": 1}]},
            {"path": "/a", "limit": 10, "items": [{"x": 1, "flag": False}]},
        ),
    ],
)
def test_normalise_fills_defaults_drops_optional_nulls_and_keeps_text_as_is(
    arguments: dict[str, Any], normalised: dict[str, Any]
) -> None:
    schema = ToolSchema("t", SCHEMA)
    assert schema.validate(arguments) is None
    assert schema.normalise(arguments) == normalised


@pytest.mark.parametrize(
    "arguments",
    [
        {},
        {"path": 3},
        {"path": "/a", "limit": "10"},
        {"path": "/a", "limit": None},
        {"path": "/a", "items": "x"},
    ],
)
def test_arguments_that_violate_the_schema_are_reported(arguments: dict[str, Any]) -> None:
    assert ToolSchema("t", SCHEMA).validate(arguments)


def test_a_broken_schema_does_not_crash_validation() -> None:
    assert ToolSchema("t", {"type": "no-such-type"}).validate({"a": 1}) is None


@pytest.mark.parametrize(
    ("annotations", "arguments", "changes"),
    [
        ({"readOnlyHint": True}, {}, False),
        ({"readOnlyHint": False}, {}, True),
        ({}, {}, True),
        ({"readOnlyHint": False}, {"dryRun": True}, False),
        ({"readOnlyHint": False}, {"dryRun": False}, True),
    ],
)
def test_only_tools_not_marked_read_only_change_state(
    annotations: dict[str, Any], arguments: dict[str, Any], changes: bool
) -> None:
    assert ToolSchema("t", SCHEMA, annotations).changes_state(arguments) is changes


def test_tool_schemas_skips_malformed_listing_entries() -> None:
    listing = {"tools": [{"name": "ok", "inputSchema": SCHEMA}, {"nameless": True}, "junk"]}
    assert list(tool_schemas(listing)) == ["ok"]
    assert tool_schemas(None) == {}
