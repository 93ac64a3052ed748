"""Tool schemas: argument validation in the dialects real servers speak, and canonical normalisation.

The resolver's canonical and semantic tiers both read a tool's ``inputSchema`` (from the recorded
``tools/list`` listing). Which of its properties are free text, compared by meaning, is
:mod:`replay_sim.freetext`'s job.

Real inputSchemas are not always plain JSON Schema, and real servers do not always do what their
schema says: OpenAPI-style ``"nullable": true``, draft-4 or draft-3 keywords without a
``$schema``, and servers that coerce loose types (pydantic turns ``"2"`` into ``2``, zod's
``coerce`` too) or ignore extra properties. So a schema check here does not say "the server
refuses this"; it lists the :class:`Violation` s, each with the *kind* of value that broke the
rule, and says which are certain for every dialect (a missing required property). What a server
does with the others is learned from its recordings (:mod:`replay_sim.resolve.dialect`).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from jsonschema.exceptions import SchemaError, UnknownType, ValidationError
from referencing.exceptions import Unresolvable

from replay_sim.canonical import normalize
from replay_sim.freetext import is_free_text

__all__ = ["ToolSchema", "Violation", "is_free_text", "tool_schemas", "value_shape"]

_DRY_RUN_FLAGS = ("dryRun", "dry_run", "dryrun")
# Keywords whose subschemas make a failure depend on which branch a server would take.
_COMBINATORS = frozenset(
    {"anyOf", "oneOf", "allOf", "not", "if", "then", "else", "dependentSchemas", "dependencies"}
)
# Keywords holding data rather than subschemas: a "nullable" inside them is a value, not a keyword.
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "example"})
# Keywords mapping names to subschemas: a property may be called "nullable".
_NAME_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
# Keywords where the kind of the offending value decides what a lenient server does with it.
_SHAPED_KEYWORDS = frozenset({"type", "enum", "const", "anyOf", "oneOf", "allOf", "not"})
# Drafts tried, in order, for a schema without ``$schema`` that the newest draft rejects.
_FALLBACK_DRAFTS = (jsonschema.Draft7Validator, jsonschema.Draft4Validator, jsonschema.Draft3Validator)
_UNCHECKABLE = (UnknownType, Unresolvable)
_INTEGER = re.compile(r"[-+]?\d+")
_BOOLEAN_WORDS = frozenset({"yes", "no", "on", "off", "y", "n", "t", "f"})


@dataclass(frozen=True, slots=True)
class Violation:
    """One way a call's arguments break the tool's inputSchema.

    Attributes:
        keyword: The JSON Schema keyword that failed (``type``, ``required``, ``enum``, ``maximum``,
            ``additionalProperties`` …).
        path: Where: ``max_count``, ``files/*/ranges/*/start`` (array items are ``*``); for a missing
            or an unexpected property, the property's own path.
        shape: The kind of the offending value where lenient servers treat kinds differently
            (``integer string`` vs ``string`` for an integer; see :func:`value_shape`), else ``""``.
        message: The validator's message.
        value: The offending value (None for a missing property).
        certain: Every server refuses it, whatever its dialect: a required property is missing
            (one that has no default, outside any anyOf/oneOf/if branch).
    """

    keyword: str
    path: str
    shape: str
    message: str
    value: Any = None
    certain: bool = False

    @property
    def kind(self) -> tuple[str, str, str]:
        """What makes two violations the same for a server: keyword, path and value shape."""
        return (self.keyword, self.path, self.shape)

    def describe(self) -> str:
        """``path: message``, one line."""
        return f"{self.path or 'arguments'}: {self.message[:200]}"


def value_shape(value: Any) -> str:
    """The kind of a value, as lenient servers tell kinds apart when they coerce.

    ``"2"`` is an ``integer string`` (pydantic and zod's coerce accept it for an integer), ``"two"`` a
    ``string`` (refused), ``2.5`` a ``fraction`` (refused for an integer), ``"yes"`` a
    ``boolean word`` (pydantic accepts it for a boolean, zod's ``true``/``false`` strings do not).
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "fraction"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    text = str(value)
    core = text.strip()
    padded = "padded " if core != text else ""
    if not core:
        return f"{padded}empty string"
    if _INTEGER.fullmatch(core):
        return f"{padded}integer string"
    if core.lower() in ("true", "false"):
        return f"{padded}boolean string"
    if core.lower() in _BOOLEAN_WORDS:
        return f"{padded}boolean word"
    try:
        float(core)
    except ValueError:
        return f"{padded}string"
    return f"{padded}number string"  # also "nan", "inf": a float parser takes them


def _with_nullable(schema: Any) -> Any:
    """The schema with OpenAPI's ``nullable: true`` (and ``x-nullable``) read as "null is allowed"."""
    if isinstance(schema, list):
        return [_with_nullable(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _keyword_with_nullable(key, value) for key, value in schema.items()}
    flags = [out.pop(flag) for flag in ("nullable", "x-nullable") if flag in out]
    if not any(flag is True for flag in flags):
        return out
    kind = out.get("type")
    if isinstance(kind, str):
        out["type"] = [kind, "null"]
    elif isinstance(kind, list):
        out["type"] = [*kind, "null"] if "null" not in kind else kind
    if isinstance(out.get("enum"), list) and None not in out["enum"]:
        out["enum"] = [*out["enum"], None]
    if "type" in out or "enum" in out:
        return out
    return {"anyOf": [out, {"type": "null"}]}


def _keyword_with_nullable(key: str, value: Any) -> Any:
    """One keyword's value with ``nullable`` read in its subschemas (data and names left alone)."""
    if key in _DATA_KEYWORDS:
        return value
    if key in _NAME_MAPS and isinstance(value, dict):
        return {name: _with_nullable(sub) for name, sub in value.items()}
    return _with_nullable(value)


def _build_validator(schema: dict[str, Any]) -> Any:
    """A validator for the schema in its own dialect, or False when no draft accepts it."""
    readable = _with_nullable(copy.deepcopy(schema))
    cls = jsonschema.validators.validator_for(readable, default=jsonschema.Draft202012Validator)
    candidates = [cls] if "$schema" in readable else [cls, *_FALLBACK_DRAFTS]
    for candidate in candidates:
        try:
            candidate.check_schema(readable)
        except SchemaError:
            continue
        return candidate(readable)
    return False


def _violations(error: ValidationError) -> list[Violation]:
    """The violations one validation error stands for (one per missing or unexpected property)."""
    steps = ["*" if isinstance(p, int) else str(p) for p in error.absolute_path]
    branched = any(str(step) in _COMBINATORS for step in error.absolute_schema_path)
    instance = error.instance
    if error.validator == "required" and isinstance(instance, dict):
        names = [n for n in error.validator_value if n not in instance and repr(n) in error.message]
        props = error.schema.get("properties") if isinstance(error.schema, dict) else None
        found = []
        for name in names[:1]:
            prop = props.get(name) if isinstance(props, dict) else None
            defaulted = isinstance(prop, dict) and "default" in prop
            path = "/".join([*steps, str(name)])
            found.append(Violation("required", path, "", error.message, None, not branched and not defaulted))
        return found
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        props = error.schema.get("properties") if isinstance(error.schema, dict) else None
        extras = sorted(set(instance) - set(props if isinstance(props, dict) else ()))
        return [
            Violation("additionalProperties", "/".join([*steps, n]), "", error.message, instance[n])
            for n in extras
        ] or [Violation("additionalProperties", "/".join(steps), "", error.message, instance)]
    shape = ""
    if error.validator in _SHAPED_KEYWORDS:
        shape = value_shape(instance)
        expected = error.validator_value if error.validator == "type" else None
        if shape.endswith("boolean word") and expected is not None and "boolean" not in expected:
            shape = shape.replace("boolean word", "string")  # "y" is a word like any other here
        members = error.validator_value if error.validator == "enum" else None
        if isinstance(members, list) and isinstance(instance, str):
            folded = instance.strip().casefold()
            if any(isinstance(m, str) and m.casefold() == folded for m in members):
                shape = "case variant of a member"
    return [Violation(str(error.validator), "/".join(steps), shape, error.message, instance)]


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

    def _checker(self) -> Any:
        if self._validator is None:
            self._validator = _build_validator(self.input_schema)
        return self._validator

    def violations(self, arguments: Any) -> list[Violation]:
        """Every way the arguments break the inputSchema, read in its dialect (``nullable`` …).

        Args:
            arguments: The call's arguments.

        Returns:
            The violations in a stable order; empty when valid or when no JSON Schema draft
            accepts the schema itself (then nothing can be said).
        """
        checker = self._checker()
        if checker is False:
            return []
        try:
            errors = list(checker.iter_errors(arguments))
        except _UNCHECKABLE:  # a $ref to nowhere, a type no draft knows: nothing can be said
            return []
        found = [v for error in errors for v in _violations(error)]
        return sorted(found, key=lambda v: (v.path, v.keyword, v.shape, v.message))

    def validate(self, arguments: Any) -> str | None:
        """Check arguments against the inputSchema (in its dialect).

        A violation does not mean the real server refuses the call: see :class:`Violation` and
        :mod:`replay_sim.resolve.dialect`.

        Args:
            arguments: The call's arguments.

        Returns:
            None when valid (or when the schema itself cannot be checked), else a one-line reason.
        """
        checker = self._checker()
        if checker is False:
            return None
        try:
            error = jsonschema.exceptions.best_match(checker.iter_errors(arguments))
        except _UNCHECKABLE:  # a $ref to nowhere, a type no draft knows: nothing can be said
            return None
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
