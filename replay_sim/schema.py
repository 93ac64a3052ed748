"""Tool schemas: which arguments are free text, argument validation and canonical normalisation.

The resolver's canonical and semantic tiers both read a tool's ``inputSchema`` (from the recorded
``tools/list`` listing). This module decides, per top-level property, whether it is *free text*
(compared by meaning) or an *identifier* (compared exactly: ids, paths, URLs, enums, numbers,
booleans, names of things). The heuristic is deliberately conservative — a property is free text
only when its name says so and nothing in its schema says otherwise — because a wrong "free text"
verdict can serve an answer the real server would not have given, while a wrong "identifier"
verdict only costs a miss.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError

from replay_sim.canonical import normalize

__all__ = ["ToolSchema", "is_free_text", "tool_schemas"]

# Name tokens that mean "prose written by a person or a model".
_FREE_TEXT_TOKENS = frozenset(
    {
        "query", "q", "message", "text", "content", "contents", "description", "prompt", "body",
        "comment", "comments", "note", "notes", "question", "topic", "summary", "instructions",
        "instruction", "search", "keywords", "observation", "observations", "feedback", "reason",
    }
)  # fmt: skip
# Name tokens that mean "this names or locates a thing" — never free text, whatever else the name says.
_IDENTIFIER_TOKENS = frozenset(
    {
        "id", "ids", "uuid", "key", "path", "paths", "file", "files", "dir", "directory", "uri", "url",
        "urls", "link", "name", "names", "timezone", "tz", "branch", "repo", "repository", "revision",
        "rev", "sha", "hash", "commit", "ref", "target", "source", "destination", "pattern", "regex",
        "glob", "type", "kind", "format", "mode", "lang", "language", "locale", "email", "date", "time",
        "timestamp", "version", "token", "code", "status", "level", "sort", "order", "field", "column",
        "table", "host", "port", "channel", "user", "owner", "label", "tag", "selector",
    }
)  # fmt: skip
# Description words that reveal a machine-readable value despite a prose-sounding name.
_IDENTIFIER_DESCRIPTION = re.compile(
    r"\b(path|uri|url|identifier|\bid\b|iana|iso[ -]?8601|format|regex|pattern|sha|hash|e\.g\.,? ')", re.I
)


_DRY_RUN_FLAGS = ("dryRun", "dry_run", "dryrun")


def _tokens(name: str) -> list[str]:
    """Split ``repo_path``, ``entityType``, ``max-count`` into lowercase words."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [t for t in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if t]


def _allows_only_strings(prop: dict[str, Any]) -> bool:
    """True when the property is a string (optionally nullable) and nothing else."""
    kind = prop.get("type")
    if kind == "string":
        return True
    if isinstance(kind, list):
        return set(kind) <= {"string", "null"} and "string" in kind
    variants = prop.get("anyOf") or prop.get("oneOf")
    if isinstance(variants, list) and variants and "type" not in prop:
        kinds = {v.get("type") for v in variants if isinstance(v, dict)}
        return "string" in kinds and kinds <= {"string", "null"} and all(_plain(v) for v in variants)
    return False


def _plain(prop: dict[str, Any]) -> bool:
    """No enum/const/format/pattern: nothing that makes a string an identifier."""
    return not any(k in prop for k in ("enum", "const", "format", "pattern", "$ref"))


def is_free_text(name: str, prop: Any) -> bool:
    """Decide whether a top-level property is free text (compared by meaning).

    Args:
        name: The property name.
        prop: Its JSON Schema.

    Returns:
        True only for a plain string property named like prose (``query``, ``message``, ``text``,
        ``content``, ``description``, ``prompt`` …) with no identifier word in its name, no
        enum/format/pattern, and no description that calls it a path, URL, id or format.
    """
    if not isinstance(prop, dict) or not _allows_only_strings(prop) or not _plain(prop):
        return False
    words = _tokens(name)
    if not words or any(w in _IDENTIFIER_TOKENS for w in words):
        return False
    if words[-1] not in _FREE_TEXT_TOKENS:
        return False
    return not _IDENTIFIER_DESCRIPTION.search(str(prop.get("description", "")))


@dataclass(slots=True)
class ToolSchema:
    """One tool as listed by its server, with the matching-relevant facts derived from it.

    Args:
        name: The tool name.
        input_schema: Its ``inputSchema``.
        annotations: Its ``annotations`` (``readOnlyHint`` …), if any.
        free_text: Override of the free-text fields (None: decide from the schema).
        identifiers: Fields forced to exact comparison even if the heuristic says free text.
        read_only: Override of ``annotations.readOnlyHint``.
    """

    name: str
    input_schema: dict[str, Any]
    annotations: dict[str, Any] = field(default_factory=dict)
    free_text: frozenset[str] | None = None
    identifiers: frozenset[str] = frozenset()
    read_only: bool | None = None
    _validator: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        props = self.properties
        if self.free_text is None:
            self.free_text = frozenset(n for n, p in props.items() if is_free_text(n, p))
        self.free_text = frozenset(self.free_text) - self.identifiers
        if self.read_only is None:
            hint = self.annotations.get("readOnlyHint")
            # Unknown means "may change state": the safe assumption for replay.
            self.read_only = hint is True

    def changes_state(self, arguments: Any) -> bool:
        """Whether a call with these arguments may change the server's state.

        Read-only tools never do; neither does a call that asks for a dry run (``dryRun``,
        ``dry_run`` set to true), the usual convention for previews.
        """
        if self.read_only:
            return False
        if isinstance(arguments, dict):
            return not any(arguments.get(flag) is True for flag in _DRY_RUN_FLAGS)
        return True

    @property
    def properties(self) -> dict[str, Any]:
        """The schema's top-level ``properties`` (empty when absent or malformed)."""
        props = self.input_schema.get("properties")
        return props if isinstance(props, dict) else {}

    def validate(self, arguments: Any) -> str | None:
        """Check arguments against the inputSchema.

        Args:
            arguments: The call's arguments.

        Returns:
            None when valid (or when the schema itself cannot be checked), else a one-line reason.
        """
        if self._validator is None:
            try:
                cls = jsonschema.validators.validator_for(
                    self.input_schema, default=jsonschema.Draft202012Validator
                )
                cls.check_schema(self.input_schema)
                self._validator = cls(self.input_schema)
            except SchemaError:
                self._validator = False
        if self._validator is False:
            return None
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(arguments))
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path) or "arguments"
        return f"{where}: {error.message[:200]}"

    def normalise(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Arguments in the form the schema makes canonical (a new object).

        Absent optional properties take their schema default, and nulls for optional properties
        are dropped (a null default means "absent"). Which other differences a server ignores
        (whitespace, case, order) is learned from recordings: :mod:`replay_sim.resolve.invariance`.

        Args:
            arguments: Arguments already valid against the schema.
        """
        return _with_defaults(normalize(arguments), self.input_schema)


def _with_defaults(value: Any, schema: Any) -> Any:
    """Fill defaults and drop optional nulls, recursively through properties and items."""
    if not isinstance(schema, dict):
        return value
    if isinstance(value, dict) and isinstance(schema.get("properties"), dict):
        props: dict[str, Any] = schema["properties"]
        required = set(schema.get("required") or ())
        out = {}
        for key, item in value.items():
            if item is None and key not in required:
                continue
            out[key] = _with_defaults(item, props.get(key))
        for key, prop in props.items():
            if key in out or key in required or not isinstance(prop, dict) or "default" not in prop:
                continue
            if prop["default"] is not None:
                out[key] = normalize(prop["default"])
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_with_defaults(item, schema["items"]) for item in value]
    return value


def tool_schemas(listing: dict[str, Any] | None) -> dict[str, ToolSchema]:
    """The tools of a recorded ``tools/list`` result, by name (malformed entries are skipped)."""
    tools = (listing or {}).get("tools")
    found: dict[str, ToolSchema] = {}
    for tool in tools if isinstance(tools, list) else []:
        if isinstance(tool, dict) and isinstance(tool.get("name"), str):
            schema = tool.get("inputSchema")
            annotations = tool.get("annotations")
            found[tool["name"]] = ToolSchema(
                tool["name"],
                schema if isinstance(schema, dict) else {},
                annotations if isinstance(annotations, dict) else {},
            )
    return found
