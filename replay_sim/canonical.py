"""Canonical JSON and call keys: the identity of a recorded call.

Two calls are *the same call* when their canonical forms are equal: keys sorted, no insignificant
whitespace, integral floats written as integers (``1.0`` ≡ ``1``), every string (keys included)
in Unicode NFC, array order kept. The call key is the sha256 of server, method, name and the
canonical arguments, so it is stable across processes, machines and Python versions.
"""

from __future__ import annotations

import hashlib
import json
import math
import unicodedata
from typing import Any

__all__ = ["answer_text", "call_identity", "call_key", "canonical_json", "normalize"]

# Floats beyond 2**53 are not exactly representable as integers in JSON peers (JavaScript).
_MAX_EXACT_FLOAT = 2.0**53


def normalize(value: Any) -> Any:
    """Return ``value`` in canonical form (NFC strings, integral floats as ints).

    Args:
        value: Any JSON-compatible value.

    Returns:
        An equal value in canonical form; containers are copied, never mutated.

    Raises:
        ValueError: For NaN or infinite floats, and for values JSON cannot hold.
    """
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"JSON has no {value!r}")
        if value.is_integer() and abs(value) <= _MAX_EXACT_FLOAT:
            return int(value)
        return value
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"JSON object keys must be strings, got {key!r}")
            out[unicodedata.normalize("NFC", key)] = normalize(item)
        return out
    if isinstance(value, list | tuple):
        return [normalize(item) for item in value]
    raise ValueError(f"not a JSON value: {type(value).__name__}")


def canonical_json(value: Any) -> str:
    """Serialise ``value`` canonically: sorted keys, compact separators, UTF-8 text.

    Args:
        value: Any JSON-compatible value.

    Returns:
        The canonical JSON text.
    """
    return json.dumps(normalize(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def call_identity(method: str, params: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """Split an MCP request's params into the ``(name, arguments)`` the call key is made of.

    Args:
        method: The MCP method (``tools/call``, ``resources/read``, ``prompts/get``,
            ``completion/complete``).
        params: The request params as wire JSON; ``_meta`` is ignored.

    Returns:
        The tool/prompt name, resource URI or completion reference, and the arguments object.
    """
    params = {k: v for k, v in (params or {}).items() if k != "_meta"}
    if method in ("tools/call", "prompts/get"):
        return str(params.get("name", "")), dict(params.get("arguments") or {})
    if method == "resources/read":
        return str(params.get("uri", "")), {}
    if method == "completion/complete":
        ref = params.get("ref") or {}
        name = str(ref.get("name") or ref.get("uri") or "")
        return name, {k: v for k, v in params.items() if k != "ref"} | {"ref": ref}
    return "", params


def call_key(server: str, method: str, name: str, arguments: dict[str, Any]) -> str:
    """Return the exact-tier key of a call: sha256 over server, method, name and arguments.

    Args:
        server: Recorded server name.
        method: MCP method.
        name: Tool/prompt name or resource URI (see :func:`call_identity`).
        arguments: Call arguments; canonicalised here.

    Returns:
        64 lowercase hex digits.
    """
    payload = canonical_json([server, method, name, arguments])
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


_NONE = object()
_DEFAULTS = {"isError": False, "resultType": "complete", "ttlMs": 0, "cacheScope": "private"}
"""Result fields whose value here says nothing an absent field does not: a raw answer leaves them
out, an SDK client's model dump spells them out, a 2026-era answer adds "do not cache" hints, and a
recording may be any of these."""


def answer_text(result: dict[str, Any] | None, error: dict[str, Any] | None) -> str:
    """The canonical form of what a server said: its result without ``_meta``, or its error.

    Two answers are the same answer when these are equal (``_meta`` carries provenance and
    server stamps, not the answer; ``isError: false``, ``resultType: "complete"``, the no-cache hints
    ``ttlMs: 0`` and ``cacheScope: "private"``, and an error's ``data: null`` are what their absence
    means).
    """
    bare = None
    if result is not None:
        bare = {k: v for k, v in result.items() if k != "_meta" and _DEFAULTS.get(k, _NONE) != v}
    if error is not None and "data" in error and error["data"] is None:
        error = {k: v for k, v in error.items() if k != "data"}
    return canonical_json({"result": bare, "error": error})
