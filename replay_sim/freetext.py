"""Which arguments are free text (compared by meaning) and which text is code (compared exactly).

The semantic tier compares *free text* by embedding cosine: prose written by a person or a model
(``query``, ``message``, ``text`` …). Everything else is an *identifier*, compared exactly after the
differences the recordings show a tool ignores: ids, paths, URLs, enums, numbers, booleans, names
of things — and **code**. SQL, expressions, formulas, globs, regexes, selectors, commands and paths
are text whose smallest changes flip the answer (``ASC``/``DESC``, a literal's case, an alias, the
order of two columns) while sentence embeddings score the two versions 0.9 to 1.0 similar.

Two signals tell code from prose, and either one suffices to compare exactly:

- the **schema** (:func:`is_code_like`): a property named like code (``sql``, ``expression``,
  ``formula``, ``script``, ``command``, ``jq`` …) or described as code (SQL, a regular expression,
  a glob, an expression, a query language …);
- the **text's shape** (:func:`looks_like_code`): SQL statements, operators and brackets, glob and
  regex metacharacters, paths with separators, code punctuation.

Both heuristics err towards "code": a wrong "code" verdict costs a miss, a wrong "prose" verdict can
serve an answer the real server would not have given.

A difference a tool is shown to ignore in code applies outside its quoted literals only
(:func:`outside_literals`): SQL ignores the case of ``SELECT`` and of a table's name, not of
``'Widget'``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = ["is_code_like", "is_free_text", "looks_like_code"]

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
# Name tokens that mean "this is code in some language": compared exactly, never by meaning.
_CODE_TOKENS = frozenset(
    {
        "sql", "expression", "expressions", "expr", "formula", "equation", "code", "script", "command",
        "cmd", "shell", "bash", "pattern", "regex", "regexp", "glob", "selector", "jq", "xpath",
        "jsonpath", "cypher", "graphql", "gql", "filter", "statement", "stmt", "snippet", "program",
        "cron", "template", "jmespath", "lucene", "kql", "promql", "dsl",
    }
)  # fmt: skip
# Description words that reveal a machine-readable value despite a prose-sounding name.
_IDENTIFIER_DESCRIPTION = re.compile(
    r"\b(path|uri|url|identifier|\bid\b|iana|iso[ -]?8601|format|regex|pattern|sha|hash|e\.g\.,? ')", re.I
)
# Description words that say the value is code: a query language, an expression, a pattern.
_CODE_DESCRIPTION = re.compile(
    r"\b(sql|sqlite|postgres(ql)?|mysql|select|insert|statement|expressions?|formula|equation"
    r"|reg(ular )?ex(p|es|ps)?|regular expression|glob|wildcards?|jq|xpath|jsonpath|css selector"
    r"|selector|cypher|graphql|lucene|query (language|syntax|string syntax)|syntax|operators?"
    r"|code|script|shell|command( line)?|cron|template)\b",
    re.I,
)

# -- the text's shape ---------------------------------------------------------------------------------

_SQL_START = re.compile(
    r"^\s*\(?\s*(select|insert|update|delete|create|drop|alter|with|pragma|explain|replace|upsert"
    r"|merge|truncate|grant|begin|values)\b",
    re.I,
)
_SQL_BODY = re.compile(
    r"\b(from|into|set|table|where|values|join|order\s+by|group\s+by|limit|having|union|returning"
    r"|index|view|as)\b",
    re.I,
)
_SQL_CLAUSE = re.compile(r"\b(order\s+by|group\s+by|left\s+join|inner\s+join|is\s+not\s+null)\b", re.I)
_CODE_SHAPES = [
    re.compile(r"[{}\[\];=<>|&$\\^~`]"),  # brackets, assignment, comparison, pipes, escapes
    re.compile(r"\*"),  # globs, wildcards, multiplication, SELECT *
    re.compile(r"\w\?[\w.]|^\?|\?\*|\*\?"),  # glob ?, regex lazy quantifiers
    re.compile(r"\w\("),  # a call: pow(2, 10), COUNT(*), rgb(…)
    re.compile(r"\d\s*[-+*/%]\s*\.?\d"),  # arithmetic, dates, ranges
    re.compile(r"[+\-*/%^]\s*\d|\d\s*[+*/^]"),  # an operator next to a number
    re.compile(r"\.[*+?]"),  # regex .* .+ .?
    re.compile(r"\w/\w|^/|^~/|^\.{1,2}/|^[A-Za-z]:[\\/]"),  # paths and URLs
    re.compile(r"\w\.\w"),  # dotted names, file extensions, decimals
    re.compile(r"^\."),  # jq filters, relative paths
    re.compile(r"\w_\w"),  # snake_case identifiers
    re.compile(r"\w::?\w"),  # times, scopes, namespaces
    re.compile(r"#\w|\w@\w|@\w"),  # colours, anchors, addresses, decorators
    re.compile(r"[A-Za-z_]%|%[A-Za-z_'\"]"),  # LIKE patterns, format strings
    re.compile(r"'[^'\s]*'\s*(,|\)|=)|\"[^\"]*\"\s*(:|,|\)|=)"),  # quoted literals in a list or call
    re.compile(r"\b(def|lambda|function|return|const|let|var|import|elif|fn|func)\b.*[(:={]"),
]


def looks_like_code(text: str) -> bool:
    """Whether a text is shaped like code rather than prose.

    True for SQL (a statement keyword with its clauses), expressions (operators between operands,
    calls, brackets), globs and regexes (``*``, ``?`` inside a word, ``.*``, ``[a-z]``, ``^``, ``$``),
    paths and URLs (separators), dotted or snake_case names, and text with little else than
    symbols and digits. Ordinary sentences and keyword queries are not code.

    Args:
        text: The text.

    Returns:
        True when the text should be compared exactly rather than by meaning.
    """
    if (_SQL_START.search(text) and _SQL_BODY.search(text)) or _SQL_CLAUSE.search(text):
        return True
    if any(shape.search(text) for shape in _CODE_SHAPES):
        return True
    visible = [c for c in text if not c.isspace()]
    letters = sum(c.isalpha() for c in visible)
    return bool(visible) and letters < 0.6 * len(visible)  # mostly digits and symbols


_LITERAL = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`[^`]*`")
"""A quoted literal: single, double or back quotes, with backslash escapes (SQL's ``''`` is two)."""


def outside_literals(text: str, change: Callable[[str], str]) -> str:
    """``text`` with ``change`` applied to all of it, or, for code (:func:`looks_like_code`), to
    what lies between its quoted literals, which are kept as they are.

    A query language ignores the letter case of its keywords and names but not of its string
    literals (``WHERE name = 'Widget'``), so a difference learned from one query's answers
    generalises to another only outside them.
    """
    if not looks_like_code(text):
        return change(text)
    parts, end = [], 0
    for literal in _LITERAL.finditer(text):
        parts += [change(text[end : literal.start()]), literal.group()]
        end = literal.end()
    return "".join([*parts, change(text[end:])])


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


def _description(prop: dict[str, Any]) -> str:
    """The property's own description and title, and those of its anyOf/oneOf variants."""
    parts = [prop.get("description"), prop.get("title")]
    for variant in prop.get("anyOf") or prop.get("oneOf") or []:
        if isinstance(variant, dict):
            parts += [variant.get("description"), variant.get("title")]
    return " ".join(p for p in parts if isinstance(p, str))


def is_code_like(name: str, prop: Any) -> bool:
    """Whether the schema says a property holds code (compared exactly, never by meaning).

    Args:
        name: The property name.
        prop: Its JSON Schema.

    Returns:
        True when the name has a code word (``sql``, ``expression``, ``formula``, ``script``,
        ``command``, ``pattern``, ``regex``, ``glob``, ``selector``, ``jq``, ``xpath``, ``filter`` …),
        the schema gives a ``format``, or the description calls it SQL, an expression, a regular
        expression, a glob, a selector, a query language or code.
    """
    if any(word in _CODE_TOKENS for word in _tokens(name)):
        return True
    if not isinstance(prop, dict):
        return False
    return "format" in prop or bool(_CODE_DESCRIPTION.search(_description(prop)))


def is_free_text(name: str, prop: Any) -> bool:
    """Decide whether a top-level property is free text (compared by meaning).

    Args:
        name: The property name.
        prop: Its JSON Schema.

    Returns:
        True only for a plain string property named like prose (``query``, ``message``, ``text``,
        ``content``, ``description``, ``prompt`` …) with no identifier or code word in its name, no
        enum/format/pattern, and no description that calls it a path, URL, id, format or code
        (:func:`is_code_like`).
    """
    if not isinstance(prop, dict) or not _allows_only_strings(prop) or not _plain(prop):
        return False
    words = _tokens(name)
    if not words or any(w in _IDENTIFIER_TOKENS for w in words) or is_code_like(name, prop):
        return False
    if words[-1] not in _FREE_TEXT_TOKENS:
        return False
    return not _IDENTIFIER_DESCRIPTION.search(str(prop.get("description", "")))
