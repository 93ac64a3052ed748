"""Redaction: secrets are replaced before anything is written to the store or hashed into a key.

Three rules, applied to JSON values:

* **secret values** — the values of env vars and HTTP headers handed to an upstream: every
  occurrence inside any string is replaced (everywhere: params, results, listings, server info), in
  every form text commonly carries it (:func:`encodings`): raw, JSON-escaped once and twice (a JSON
  document inside a result), URL-encoded, base64 and HTML-escaped;
* **key globs** — object keys matching a glob (case-insensitive, ``*access*token``, ``authorization``)
  get their string values replaced whole (in call params, results, errors and notifications; not in
  listings, where keys are schema property names rather than values);
* **patterns** — regular expressions; every match inside any string is replaced.

What it cannot catch: a secret transformed otherwise (hashed, encrypted, split, re-cased, base64
of a larger text that contains it) or a secret it was never told about — pass such values as
``patterns``.

The recorder hands the redacted params to :meth:`Store.record_call`, so the call key is computed
on redacted arguments. A replay server that applies the same :class:`Redactor` to incoming
arguments finds the recording again.
"""

from __future__ import annotations

import base64
import fnmatch
import html
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, quote_plus

__all__ = ["DEFAULT_KEY_GLOBS", "REDACTED", "RULES_META_KEY", "Redactor", "encodings"]

REDACTED = "[REDACTED]"
RULES_META_KEY = "redaction"
"""Where a store keeps the rules its recordings were redacted with (secret values excluded)."""

# Specific on purpose: a broad "*token*" would also blank `max_tokens` or a pagination `pageToken`,
# and two different calls would then share one key (a wrong answer on replay).
DEFAULT_KEY_GLOBS: tuple[str, ...] = (
    "token",
    "*access*token",
    "*refresh*token",
    "*auth*token",
    "*id_token",
    "*api*token",
    "*bearer*",
    "*secret*",
    "*password*",
    "*passwd*",
    "*credential*",
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "*api*key",
    "*private*key",
)

# Shorter secret values would redact ordinary text ("1", "true", "info") everywhere.
MIN_SECRET_LENGTH = 6


def _json_escaped(value: str) -> set[str]:
    return {json.dumps(value, ensure_ascii=ascii_only)[1:-1] for ascii_only in (False, True)}


def _lower_hex(value: str) -> str:
    return re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), value)


def encodings(secret: str) -> set[str]:
    """The forms a secret value takes in text, each of which is redacted.

    Raw; JSON-escaped (``"`` → ``\\"``, ``\\`` → ``\\\\``, non-ASCII kept or ``\\uXXXX``), once and
    twice (a JSON document quoted inside a result, or inside a JSON string again); URL-encoded
    (``%XX`` upper or lower case, ``+`` or ``%20`` for a space); base64 (standard and URL-safe,
    with or without padding: an ``Authorization: Basic`` header, a token blob); HTML-escaped.
    """
    once = _json_escaped(secret)
    twice = {form for escaped in once for form in _json_escaped(escaped)}
    urls = {quote(secret, safe=""), quote(secret), quote_plus(secret)}
    raw = secret.encode("utf-8")
    b64 = {base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()}
    return {
        secret,
        *once,
        *twice,
        *urls,
        *(_lower_hex(u) for u in urls),
        *b64,
        *(b.rstrip("=") for b in b64),
        html.escape(secret),
    }


@dataclass
class Redactor:
    """Replaces secrets in JSON values; cheap when there is nothing to redact.

    Args:
        secrets: Literal values to remove wherever they occur (env and header values).
        key_globs: Object keys whose values are replaced whole (fnmatch, case-insensitive).
        patterns: Regular expressions whose matches are replaced.
        replacement: What a secret becomes.
    """

    secrets: Iterable[str] = ()
    key_globs: Iterable[str] = DEFAULT_KEY_GLOBS
    patterns: Iterable[str | re.Pattern[str]] = ()
    replacement: str = REDACTED
    _secret_re: re.Pattern[str] | None = field(init=False, default=None, repr=False)
    _key_re: re.Pattern[str] | None = field(init=False, default=None, repr=False)
    _patterns: list[re.Pattern[str]] = field(init=False, default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.secrets = sorted({s for s in self.secrets if len(s) >= MIN_SECRET_LENGTH}, key=len, reverse=True)
        self.key_globs = tuple(self.key_globs)
        self._patterns = [p if isinstance(p, re.Pattern) else re.compile(p) for p in self.patterns]
        self.patterns = tuple(p.pattern for p in self._patterns)
        if self.secrets:
            forms = {form for secret in self.secrets for form in encodings(secret)}
            # Longest first, so a secret (or form) containing another is removed whole.
            ordered = sorted(forms, key=lambda form: (-len(form), form))
            self._secret_re = re.compile("|".join(re.escape(form) for form in ordered))
        if self.key_globs:
            self._key_re = re.compile(
                "|".join(f"(?:{fnmatch.translate(g.lower())})" for g in self.key_globs), re.IGNORECASE
            )

    def rules(self) -> dict[str, Any]:
        """The rules without the secret values, as JSON data (stored with the recordings)."""
        return {
            "key_globs": list(self.key_globs),
            "patterns": list(self.patterns),
            "replacement": self.replacement,
        }

    @classmethod
    def from_rules(cls, rules: dict[str, Any] | None) -> Redactor:
        """A redactor from :meth:`rules` data, as a store keeps them.

        None (a store with no rules: imported from JSONL, which carries none) redacts nothing:
        its recordings were not redacted by any key, so an incoming call redacted by the default
        keys would never match its own recording.
        """
        if rules is None:
            return cls(key_globs=())
        return cls(
            key_globs=rules.get("key_globs", DEFAULT_KEY_GLOBS),
            patterns=rules.get("patterns", ()),
            replacement=rules.get("replacement", REDACTED),
        )

    def merged(self, other: Redactor) -> Redactor:
        """A redactor applying both rule sets (and both sets of secrets); this one's replacement."""
        return Redactor(
            [*self.secrets, *other.secrets],
            dict.fromkeys([*self.key_globs, *other.key_globs]),
            dict.fromkeys([*self.patterns, *other.patterns]),
            self.replacement,
        )

    def with_secrets(self, secrets: Iterable[str]) -> Redactor:
        """A redactor with the same rules and these extra secret values."""
        return Redactor([*self.secrets, *secrets], self.key_globs, self._patterns, self.replacement)

    def is_secret_key(self, key: str) -> bool:
        """Whether values under this object key are replaced whole."""
        return self._key_re is not None and self._key_re.fullmatch(key) is not None

    def text(self, value: str) -> str:
        """``value`` with secret values and pattern matches replaced."""
        if self._secret_re is not None:
            value = self._secret_re.sub(self.replacement, value)
        for pattern in self._patterns:
            value = pattern.sub(self.replacement, value)
        return value

    def redact(self, value: Any, *, keys: bool = True) -> Any:
        """Return a redacted copy of a JSON value (the input is never mutated).

        Args:
            value: Any JSON value.
            keys: Also apply the key globs (off for listings and server info, whose object keys
                are schema names, not data).

        Returns:
            An equal-shaped value with secrets replaced.
        """
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            for key, item in value.items():
                # Only strings are secrets; numbers, booleans and nested objects are walked on.
                if keys and isinstance(key, str) and isinstance(item, str) and self.is_secret_key(key):
                    out[key] = self.replacement
                else:
                    out[self.text(key) if isinstance(key, str) else key] = self.redact(item, keys=keys)
            return out
        if isinstance(value, list):
            return [self.redact(item, keys=keys) for item in value]
        return value
