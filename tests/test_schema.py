"""Schema-aware classification and canonical normalisation (table-driven)."""

from __future__ import annotations

from typing import Any

import pytest

from replay_sim.schema import ToolSchema, is_free_text, tool_schemas, value_shape

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


# -- schema dialects: what a violation is, and which are certain ---------------------------------

DIALECT = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "limit": {"type": "integer"},
        "count": {"type": "integer", "default": 10},
        "flag": {"type": "boolean"},
        "since": {"type": "string", "nullable": True},
        "algorithm": {"type": "string", "enum": ["md5", "sha256"]},
        "to": {"type": "integer", "maximum": 36},
        "files": {
            "type": "array",
            "items": {"type": "object", "properties": {"start": {"type": "integer"}}, "required": ["start"]},
        },
        "mode": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["path", "limit"],
    "additionalProperties": False,
}
BASE = {"path": "/a", "limit": 1}


@pytest.mark.parametrize(
    ("value", "shape"),
    [
        (None, "null"),
        (True, "boolean"),
        (2, "integer"),
        (2.0, "integer"),
        (2.5, "fraction"),
        ("2", "integer string"),
        (" 2 ", "padded integer string"),
        ("2.5", "number string"),
        ("1e3", "number string"),
        ("true", "boolean string"),
        ("yes", "boolean word"),
        ("two", "string"),
        ("", "empty string"),
        ([1], "array"),
        ({"a": 1}, "object"),
    ],
)
def test_a_value_s_shape_is_what_lenient_servers_tell_apart(value: Any, shape: str) -> None:
    assert value_shape(value) == shape


@pytest.mark.parametrize(
    ("arguments", "kinds"),
    [
        ({**BASE, "count": "2"}, [("type", "count", "integer string")]),
        ({**BASE, "count": "ten"}, [("type", "count", "string")]),
        ({**BASE, "count": 2.5}, [("type", "count", "fraction")]),
        ({**BASE, "count": None}, [("type", "count", "null")]),  # not nullable: a violation
        ({**BASE, "since": None}, []),  # OpenAPI's nullable: null is allowed
        ({**BASE, "flag": "yes"}, [("type", "flag", "boolean word")]),
        ({**BASE, "count": "yes"}, [("type", "count", "string")]),  # a word like any other for a number
        ({**BASE, "algorithm": "SHA256"}, [("enum", "algorithm", "case variant of a member")]),
        ({**BASE, "algorithm": "crc"}, [("enum", "algorithm", "string")]),
        ({**BASE, "to": 99}, [("maximum", "to", "")]),
        ({**BASE, "mode": 3}, [("anyOf", "mode", "integer")]),
        (
            {**BASE, "extra": 1, "more": 2},
            [("additionalProperties", "extra", ""), ("additionalProperties", "more", "")],
        ),
        ({"path": "/a"}, [("required", "limit", "")]),
        (
            {**BASE, "files": [{"start": "1"}, {}]},
            [("required", "files/*/start", ""), ("type", "files/*/start", "integer string")],
        ),
    ],
)
def test_violations_name_keyword_argument_and_value_shape(
    arguments: dict[str, Any], kinds: list[tuple[str, str, str]]
) -> None:
    assert [v.kind for v in ToolSchema("t", DIALECT).violations(arguments)] == kinds


@pytest.mark.parametrize(
    ("schema", "arguments", "certain"),
    [
        # A required argument is missing: every server refuses, whatever its dialect.
        ({"properties": {"a": {"type": "string"}}, "required": ["a"]}, {}, True),
        ({"properties": {"a": {"type": "array", "items": {"required": ["b"]}}}}, {"a": [{}]}, True),
        # A "required" property with a default (pydantic's serialisation schemas) may be filled in.
        ({"properties": {"a": {"type": "string", "default": "x"}}, "required": ["a"]}, {}, False),
        # Inside a branch, which branch a server takes decides.
        ({"anyOf": [{"required": ["a"]}, {"required": ["b"]}]}, {}, False),
        # Servers coerce types, ignore extra properties, clamp or refuse ranges: never certain.
        ({"properties": {"a": {"type": "integer"}}}, {"a": "2"}, False),
        ({"properties": {}, "additionalProperties": False}, {"a": 1}, False),
        ({"properties": {"a": {"type": "integer", "maximum": 3}}}, {"a": 9}, False),
    ],
)
def test_only_a_missing_required_argument_is_a_certain_refusal(
    schema: dict[str, Any], arguments: dict[str, Any], certain: bool
) -> None:
    violations = ToolSchema("t", {"type": "object", **schema}).violations(arguments)
    assert violations and all(v.certain is certain for v in violations)


@pytest.mark.parametrize(
    ("prop", "value", "valid"),
    [
        ({"type": "integer", "nullable": True}, None, True),
        ({"type": "integer", "x-nullable": True}, None, True),
        ({"type": ["integer", "string"], "nullable": True}, None, True),
        ({"type": "string", "enum": ["a", "b"], "nullable": True}, None, True),
        ({"$ref": "#/$defs/n", "nullable": True}, None, True),
        ({"type": "integer", "nullable": False}, None, False),
        ({"type": "integer", "nullable": True}, "x", False),
        ({"type": "object", "properties": {"nullable": {"type": "integer"}}}, {"nullable": 1}, True),
        ({"type": "object", "properties": {"nullable": {"type": "integer"}}}, {"nullable": "x"}, False),
        ({"enum": [{"nullable": True}]}, {"nullable": True}, True),  # data, not a keyword
    ],
)
def test_openapi_nullable_reads_as_null_allowed(prop: dict[str, Any], value: Any, valid: bool) -> None:
    schema = {"type": "object", "properties": {"v": prop}, "$defs": {"n": {"type": "integer"}}}
    assert (ToolSchema("t", schema).validate({"v": value}) is None) is valid


def test_a_schema_in_an_older_draft_is_read_in_that_draft() -> None:
    # Draft 4's boolean exclusiveMinimum is invalid in 2020-12: read as draft 4, not ignored.
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 1, "exclusiveMinimum": True}},
    }
    assert [v.keyword for v in ToolSchema("t", schema).violations({"n": 1})] == ["minimum"]
    assert ToolSchema("t", schema).violations({"n": 2}) == []


def test_a_schema_no_draft_can_check_reports_nothing() -> None:
    assert ToolSchema("t", {"properties": {"a": {"$ref": "#/$defs/missing"}}}).violations({"a": 1}) == []
