"""The differences of an argument that a server may ignore: one registry, two users.

Each :class:`Transform` names one kind of difference. Its entry in the registry is two small
functions: ``apply`` takes the difference out of a value (a canonical spelling, used by the
resolver's canonical tier once the recordings show the server ignores it) and ``vary`` makes one
(used by the recorder to ask the real server). Neither side assumes a difference is ignored:
:mod:`replay_sim.resolve.invariance` learns it from recorded pairs. Adding a kind is one member of
:class:`Transform` and one :class:`Family` entry in ``_FAMILIES``.

Each kind is chosen by the value's shape (a path is a string with a ``/``, a time is ``H:MM``…) and
is as narrow as one spelling: a server that ignores a trailing ``/`` may still treat ``a//b`` or
``a/../b`` differently (a symlink), so each is learned on its own.

The order of the members is the order in which learned transforms apply to one argument: a
learned default first (it fills the value the others then spell canonically), whitespace before
anything that parses the string, and each transform after those whose output it reads.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import StrEnum
from typing import Any, NamedTuple

import jsonschema
from jsonschema.exceptions import SchemaError
from referencing.exceptions import Unresolvable

from replay_sim.variants import shapes, text
from replay_sim.variants.text import CASE_CLASSES, case_changes, fold_case

__all__ = ["CASE_CLASSES", "MIN_EVIDENCE", "Family", "Transform", "case_changes", "fold_case"]

MIN_EVIDENCE = 2
"""Distinct answers that must support a learned invariance."""


class Transform(StrEnum):
    """A difference of one argument that a server may ignore (applied in this order)."""

    DEFAULT = "default"
    """The argument left out vs given explicitly with the value the server assumes without it."""
    SPACE = "space"
    """Surrounding whitespace of a string (``" chess "`` vs ``"chess"``)."""
    CASE = "case"
    """Letter case of a string (``"Chess"`` vs ``"chess"``); in code, outside its quoted literals
    (``select * from t where name = 'Widget'`` vs ``SELECT * FROM T WHERE NAME = 'Widget'``)."""
    PATH_SEP = "path-sep"
    """Repeated separators in a path (``a//b`` vs ``a/b``)."""
    PATH_DOT = "path-dot"
    """A ``./`` prefix of a relative path (``./a/b`` vs ``a/b``)."""
    PATH_UP = "path-up"
    """``..`` segments that resolve inside the path (``a/../a/b`` vs ``a/b``)."""
    PATH_SLASH = "path-slash"
    """A trailing separator of a path (``a/b/`` vs ``a/b``)."""
    NUMBER = "number"
    """A number vs the same number written as a string (``1`` vs ``"1"``, ``"2.50"`` vs ``2.5``)."""
    MIDNIGHT = "midnight"
    """A date vs the same date at midnight (``2026-01-15`` vs ``2026-01-15T00:00:00``)."""
    SECONDS = "seconds"
    """A time with and without zero seconds (``09:00`` vs ``09:00:00``)."""
    HOUR_PAD = "hour-pad"
    """An hour with and without its leading zero (``9:00`` vs ``09:00``)."""
    DUPLICATES = "duplicates"
    """Repeated items of an array (``["a", "a", "b"]`` vs ``["a", "b"]``)."""
    ORDER = "order"
    """The order of an array's items (``["b", "a"]`` vs ``["a", "b"]``)."""

    def apply(self, value: Any, reach: frozenset[str] | None = None) -> Any:
        """The value with this difference taken out (values it does not apply to are unchanged).

        Args:
            value: The argument's value.
            reach: For a scoped kind (:attr:`scoped`), the kinds of difference evidence showed
                ignored (:meth:`changes`): a value whose spelling differs by others is unchanged.
                None: no limit.
        """
        family = _FAMILIES[self]
        if reach is not None and family.needs is not None and not family.needs(value) <= reach:
            return value
        return family.apply(value)

    @property
    def scoped(self) -> bool:
        """Whether a learned invariance of this kind reaches only the differences its evidence made."""
        return _FAMILIES[self].changes is not None

    def changes(self, a: Any, b: Any) -> frozenset[str]:
        """The kinds of difference (``leading space``, ``type``, ``string`` …) between two spellings."""
        family = _FAMILIES[self]
        return frozenset() if family.changes is None else family.changes(a, b)

    def vary(self, value: Any, schema: dict[str, Any] | None = None) -> Any | None:
        """A value that differs from ``value`` only by this difference (None when there is none).

        Args:
            value: The argument's value.
            schema: The argument's JSON Schema (its entry in the tool's ``properties``), if known.
                A variant the schema does not allow is never made; a variant of another JSON type
                (``1`` → ``"1"``) is made only when the schema is known and allows it.
        """
        family = _FAMILIES[self]
        if family.retypes and schema is None:
            return None
        varied = family.vary(value)
        if varied is None or (schema is not None and not _fits(varied, schema, strict=family.retypes)):
            return None
        return varied

    def vary_call(
        self, arguments: dict[str, Any], name: str, input_schema: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """A call's arguments with argument ``name`` varied by this difference (None when none is valid).

        Unlike :meth:`vary`, this can also leave an argument out (:attr:`DEFAULT`): only when the
        tool's ``input_schema`` is known, does not require it and declares no default for it (a
        declared default already makes absent and explicit calls equal).
        """
        tool = input_schema if isinstance(input_schema, dict) else {}
        props = tool.get("properties")
        props = props if isinstance(props, dict) else {}
        if self is Transform.DEFAULT:
            required = tool.get("required")
            prop = props.get(name)
            if (
                input_schema is None
                or arguments.get(name) is None
                or name in (required if isinstance(required, list) else ())
                or (isinstance(prop, dict) and "default" in prop)
            ):
                return None
            return {k: v for k, v in arguments.items() if k != name}
        prop = props.get(name)
        varied = self.vary(arguments[name], prop if isinstance(prop, dict) else None)
        return None if varied is None else {**arguments, name: varied}


class Family(NamedTuple):
    """One kind of difference: how to take it out and how to make it."""

    apply: Callable[[Any], Any]
    """The value in canonical spelling (values it does not apply to are returned unchanged)."""
    vary: Callable[[Any], Any | None]
    """Another spelling of the value, or None; never checked against a schema here."""
    retypes: bool = False
    """Its variants have another JSON type: made only when the schema is known to allow them."""
    changes: Callable[[Any, Any], frozenset[str]] | None = None
    """The kinds of difference (characters and where, item kinds) two spellings differ by: a learned
    invariance of this family reaches only the kinds its evidence pairs changed."""
    needs: Callable[[Any], frozenset[str]] | None = None
    """The kinds of difference taking the difference out of a value would take out."""


def _same(value: Any) -> Any:
    return value


def _none(value: Any) -> None:
    return None


_FAMILIES: dict[Transform, Family] = {
    # Presence, not spelling: learned and applied by the invariance module, made by vary_call.
    Transform.DEFAULT: Family(_same, _none),
    Transform.SPACE: Family(text.strip, text.pad, changes=text.space_changes, needs=text.space_needs),
    Transform.CASE: Family(text.fold, text.recase),
    Transform.PATH_SEP: Family(shapes.single_separators, shapes.double_separator),
    Transform.PATH_DOT: Family(shapes.undot, shapes.dot),
    Transform.PATH_UP: Family(shapes.resolve_parents, shapes.add_parent),
    Transform.PATH_SLASH: Family(shapes.untrail, shapes.trail),
    Transform.NUMBER: Family(
        shapes.to_number, shapes.respell_number, True, shapes.number_changes, shapes.number_needs
    ),
    Transform.MIDNIGHT: Family(shapes.date_only, shapes.at_midnight),
    Transform.SECONDS: Family(shapes.without_seconds, shapes.toggle_seconds),
    Transform.HOUR_PAD: Family(shapes.padded_hour, shapes.repad_hour),
    Transform.DUPLICATES: Family(text.dedupe, text.repeat),
    Transform.ORDER: Family(text.sort, text.reverse, changes=text.order_changes, needs=text.order_needs),
}


# --- what a schema allows


def _fits(value: Any, schema: dict[str, Any], strict: bool) -> bool:
    """Whether the schema allows the value.

    A schema that cannot be checked whole (a ``$ref`` into the tool's ``$defs``, a malformed
    schema) allows a variant of another type (``strict``) never, and one of the valid original's
    type unless its enum says otherwise.
    """
    try:
        validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        validator.check_schema(schema)
        return bool(validator(schema).is_valid(value))
    except (SchemaError, Unresolvable, re.error):
        allowed = schema.get("enum")
        return not strict and (not isinstance(allowed, list) or value in allowed)
