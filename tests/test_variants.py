# ruff: noqa: E501 - the spelling tables read best one case per line
"""The registry of argument differences: each kind takes its difference out and makes one."""

from __future__ import annotations

from typing import Any

import pytest

from replay_sim.canonical import canonical_json
from replay_sim.variants import _FAMILIES, Transform

T = Transform


@pytest.mark.parametrize(
    ("transform", "value", "canonical"),
    [
        (T.SPACE, "  chess ", "chess"),
        (T.CASE, "Chess", "chess"),
        (T.ORDER, ["b", "a"], ["a", "b"]),
        (T.PATH_SEP, "a//b///c", "a/b/c"),
        (T.PATH_SEP, "//srv/x", "/srv/x"),
        (T.PATH_SEP, "http://host//x", "http://host//x"),  # a URL is not a path
        (T.PATH_DOT, "./src/main.py", "src/main.py"),
        (T.PATH_DOT, "././src/a", "src/a"),
        (T.PATH_DOT, "../src/a", "../src/a"),
        (T.PATH_DOT, "./", "./"),
        (T.PATH_UP, "src/../src/main.py", "src/main.py"),
        (T.PATH_UP, "/home/u/../v/x", "/home/v/x"),
        (T.PATH_UP, "a/b/../../c", "c"),
        (T.PATH_UP, "a/..", "."),
        (T.PATH_UP, "../x", "../x"),  # never above the path's start
        (T.PATH_UP, "a/../../x", "../x"),
        (T.PATH_UP, "a//../x", "a//../x"),  # an empty segment is not a name to cancel
        (T.PATH_SLASH, "src/lib/", "src/lib"),
        (T.PATH_SLASH, "src/lib//", "src/lib"),
        (T.PATH_SLASH, "/", "/"),
        (T.PATH_SLASH, "https://example.com/", "https://example.com/"),
        (T.PATH_SLASH, "lib/", "lib"),
        (T.NUMBER, "1", 1),
        (T.NUMBER, "1.0", 1),
        (T.NUMBER, "-2.50", -2.5),
        (T.NUMBER, "1e3", 1000),
        (T.NUMBER, 1.0, 1),
        (T.NUMBER, "007", "007"),  # a code, not seven
        (T.NUMBER, " 1", " 1"),
        (T.NUMBER, "1e999", "1e999"),
        (T.NUMBER, True, True),
        (T.MIDNIGHT, "2026-01-15T00:00:00", "2026-01-15"),
        (T.MIDNIGHT, "2026-01-15T00:00:00Z", "2026-01-15T00:00:00Z"),  # a zone says which midnight
        (T.MIDNIGHT, "2026-01-15T09:00:00", "2026-01-15T09:00:00"),
        (T.SECONDS, "09:00:00", "09:00"),
        (T.SECONDS, "09:00:00.000", "09:00"),
        (T.SECONDS, "09:00:30", "09:00:30"),
        (T.SECONDS, "2026-01-15T09:00:00+02:00", "2026-01-15T09:00+02:00"),
        (T.SECONDS, "2026-01-15 09:00:00Z", "2026-01-15 09:00Z"),
        (T.HOUR_PAD, "9:00", "09:00"),
        (T.HOUR_PAD, "9:05:30", "09:05:30"),
        (T.HOUR_PAD, "16:9", "16:9"),  # a ratio, not a time
        (T.DUPLICATES, ["a", "a", "b", "a"], ["a", "b"]),
        (T.DUPLICATES, [{"x": 1}, {"x": 1.0}], [{"x": 1}]),
        (T.DUPLICATES, "aab", "aab"),
        (T.DEFAULT, "anything", "anything"),  # presence, not spelling: see the invariance module
    ],
)  # fmt: skip
def test_apply_writes_each_kind_of_difference_one_way(
    transform: Transform, value: Any, canonical: Any
) -> None:
    assert canonical_json(transform.apply(value)) == canonical_json(canonical)


@pytest.mark.parametrize(
    ("transform", "value", "varied"),
    [
        (T.PATH_SEP, "a/b/c", "a//b/c"),
        (T.PATH_SEP, "a//b", "a/b"),
        (T.PATH_SEP, "/a", None),  # no separator between two names
        (T.PATH_SEP, "word", None),
        (T.PATH_DOT, "src/a.py", "./src/a.py"),
        (T.PATH_DOT, "./src/a.py", "src/a.py"),
        (T.PATH_DOT, "/etc/hosts", None),  # absolute: "./" would name another file
        (T.PATH_DOT, "../a/b", None),
        (T.PATH_DOT, "~/a", None),
        (T.PATH_UP, "src/main.py", "src/../src/main.py"),
        (T.PATH_UP, "/home/u/x", "/home/../home/u/x"),
        (T.PATH_UP, "src/../lib/a", "lib/a"),
        (T.PATH_UP, "/a", None),
        (T.PATH_SLASH, "src/lib", "src/lib/"),
        (T.PATH_SLASH, "src/lib/", "src/lib"),
        (T.PATH_SLASH, "/", None),  # the root has one spelling
        (T.PATH_SLASH, "http://x/a", None),
        (T.PATH_SLASH, "C:/x", None),
        (T.PATH_SLASH, " a/b ", None),
        (T.NUMBER, 1, None),  # another type: only when the schema is known to allow it
        (T.MIDNIGHT, "2026-01-15", "2026-01-15T00:00:00"),
        (T.MIDNIGHT, "2026-01-15T00:00:00", "2026-01-15"),
        (T.MIDNIGHT, "2026-01-15T09:00:00", None),
        (T.MIDNIGHT, 20260115, None),
        (T.SECONDS, "09:00", "09:00:00"),
        (T.SECONDS, "09:00:00", "09:00"),
        (T.SECONDS, "2026-01-15T09:00Z", "2026-01-15T09:00:00Z"),
        (T.SECONDS, "09:00:30", None),
        (T.HOUR_PAD, "9:00", "09:00"),
        (T.HOUR_PAD, "09:00", "9:00"),
        (T.HOUR_PAD, "10:00", None),
        (T.HOUR_PAD, "9", None),
        (T.DUPLICATES, ["a", "b"], ["a", "a", "b"]),
        (T.DUPLICATES, ["a", "b", "a"], ["a", "b"]),
        (T.DUPLICATES, [], None),
        (T.DUPLICATES, "ab", None),
        (T.DEFAULT, 10, None),  # leaving an argument out is vary_call's
        (T.CASE, "Acme", "ACME"),
        (T.ORDER, ["a", "b"], ["b", "a"]),
    ],
)  # fmt: skip
def test_vary_makes_one_other_spelling_that_apply_takes_back(
    transform: Transform, value: Any, varied: Any
) -> None:
    assert transform.vary(value) == varied
    if varied is not None:
        assert canonical_json(varied) != canonical_json(value)
        assert canonical_json(transform.apply(varied)) == canonical_json(transform.apply(value))


@pytest.mark.parametrize(
    ("transform", "value", "schema", "varied"),
    [
        # A number is spelled as a string only where the schema takes a string; 1.0 is already 1.
        (T.NUMBER, 1, {}, "1"),
        (T.NUMBER, 2.5, {"type": ["number", "string"]}, "2.5"),
        (T.NUMBER, 1, {"type": "integer"}, None),
        (T.NUMBER, 1, {"anyOf": [{"type": "integer"}, {"type": "string"}]}, "1"),
        (T.NUMBER, 1, {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": "^[a-z]+$"}]}, None),
        (T.NUMBER, "5", {"type": "string"}, None),
        (T.NUMBER, "5", {"description": "how many"}, 5),
        (T.NUMBER, "5", {"type": ["string", "integer"], "minimum": 1}, 5),
        (T.NUMBER, 1, {"$ref": "#/$defs/count"}, None),  # cannot be checked: not asked
        # Same-type variants must still fit the property.
        (T.CASE, "asc", {"type": "string", "enum": ["asc", "desc"]}, None),
        (T.CASE, "asc", {"$ref": "#/$defs/order", "enum": ["asc", "desc"]}, None),
        (T.CASE, "acme", {"$ref": "#/$defs/name"}, "ACME"),
        (T.DUPLICATES, ["a", "b"], {"type": "array", "uniqueItems": True}, None),
        (T.DUPLICATES, ["a", "b"], {"type": "array", "maxItems": 2}, None),
        (T.DUPLICATES, ["a", "b"], {"type": "array"}, ["a", "a", "b"]),
        (T.HOUR_PAD, "09:00", {"type": "string", "pattern": "^\\d{2}:\\d{2}$"}, None),
        (T.SECONDS, "09:00", {"type": "string", "pattern": "^\\d{2}:\\d{2}(:\\d{2})?$"}, "09:00:00"),
        (T.PATH_SLASH, "src/lib", {"type": "string"}, "src/lib/"),
        (T.PATH_SLASH, "src/lib", {"type": "string", "pattern": "["}, "src/lib/"),  # a broken pattern checks nothing
    ],
)  # fmt: skip
def test_vary_never_makes_a_value_the_property_schema_refuses(
    transform: Transform, value: Any, schema: dict[str, Any], varied: Any
) -> None:
    assert transform.vary(value, schema) == varied


_TOOL = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "limit": {"type": "integer"},
        "depth": {"type": "integer", "default": 1},
        "count": {"type": ["integer", "string"]},
    },
    "required": ["path"],
}


@pytest.mark.parametrize(
    ("transform", "name", "input_schema", "varied"),
    [
        # An optional argument is left out, to ask whether the server assumes its value without it.
        (T.DEFAULT, "limit", _TOOL, {"path": "src/a", "depth": 2, "count": 3}),
        (T.DEFAULT, "path", _TOOL, None),  # required
        (T.DEFAULT, "depth", _TOOL, None),  # the schema's default already makes both calls one
        (T.DEFAULT, "limit", None, None),  # without the schema, whether it is optional is unknown
        (T.NUMBER, "count", _TOOL, {"path": "src/a", "limit": 10, "depth": 2, "count": "3"}),
        (T.NUMBER, "limit", _TOOL, None),
        (T.NUMBER, "count", None, None),
        (T.PATH_SLASH, "path", _TOOL, {"path": "src/a/", "limit": 10, "depth": 2, "count": 3}),
        (T.PATH_SLASH, "path", None, {"path": "src/a/", "limit": 10, "depth": 2, "count": 3}),
        (T.CASE, "limit", _TOOL, None),
    ],
)  # fmt: skip
def test_vary_call_varies_one_argument_of_a_call_or_leaves_it_out(
    transform: Transform, name: str, input_schema: dict[str, Any] | None, varied: dict[str, Any] | None
) -> None:
    arguments = {"path": "src/a", "limit": 10, "depth": 2, "count": 3}
    assert transform.vary_call(arguments, name, input_schema) == varied
    assert arguments == {"path": "src/a", "limit": 10, "depth": 2, "count": 3}  # left alone


def test_the_registry_has_one_entry_per_difference_in_the_documented_order() -> None:
    assert list(_FAMILIES) == list(Transform)
    assert [t.value for t in Transform] == [
        "default", "space", "case", "path-sep", "path-dot", "path-up", "path-slash",
        "number", "midnight", "seconds", "hour-pad", "duplicates", "order",
    ]  # fmt: skip


def test_every_variant_is_plain_json_so_a_real_server_can_be_asked() -> None:
    samples: list[Any] = ["src/lib", "Acme", " x ", 3, 2.5, "7", "2026-01-15", "9:00", ["a", "b"], None, {}]
    for transform in Transform:
        for value in samples:
            varied = transform.vary(value, {})
            if varied is not None:
                canonical_json(varied)  # raises for anything JSON cannot hold
