"""The SDK's checks of a replayed request, done cheaply: what both doors' fast paths share.

A request a fast path answers from prepared bytes must be one the SDK would take as it is; the
checks here (JSON-RPC shape, a method the server serves, plain call params, a 2026-era envelope the
SDK validates, a handshake-era ``_meta`` it accepts) are the SDK's, each verdict kept where clients
repeat themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pydantic_core
from mcp.server import Server
from mcp_types import methods as sdk_methods
from pydantic import ValidationError

from replay_sim.protocol import plain_call_params
from replay_sim.replay.core.prepared import FAST_METHODS, Prepared

__all__ = ["RequestChecks", "handshake_meta"]

_RESERVED = "io.modelcontextprotocol/"
_KEYS = frozenset({"jsonrpc", "id", "method", "params"})
_MINIMAL = {"tools/call": {"name": ""}, "resources/read": {"uri": ""}, "prompts/get": {"name": ""}}
_ENVELOPES = 256  # distinct 2026-era envelopes whose verdict is kept


class RequestChecks:
    """The SDK's checks of a replayed request, done cheaply (shared by both doors)."""

    def __init__(self, prepared: Prepared, servers: Mapping[str, Server[Any]]) -> None:
        self.prepared = prepared
        self.served = {
            name: frozenset(m for m in FAST_METHODS if server.get_request_handler(m) is not None)
            for name, server in servers.items()
        }
        self._envelopes: dict[tuple[str, str, bytes], bool] = {}

    def request_params(self, name: str, request: Any) -> dict[str, Any] | None:
        """The params of a well-formed request this path may answer for ``name``, else None."""
        if not isinstance(request, dict) or request.keys() - _KEYS or request.get("jsonrpc") != "2.0":
            return None
        id_, method, params = request.get("id"), request.get("method"), request.get("params")
        if not (type(id_) is int or type(id_) is str) or not isinstance(method, str):
            return None
        if method not in self.served.get(name, ()):
            return None
        return params if plain_call_params(method, params) else None

    def envelope_valid(self, method: str, version: str, meta: dict[str, Any]) -> bool:
        """Whether the SDK accepts a 2026-era request's ``_meta`` (validated once per distinct envelope)."""
        if not _progress_token_valid(meta):
            return False
        envelope_keys = {k: v for k, v in meta.items() if k.startswith(_RESERVED)}
        key = (method, version, pydantic_core.to_json(envelope_keys))
        verdict = self._envelopes.get(key)
        if verdict is None:
            try:
                sdk_methods.validate_client_request(
                    method, version, {**_MINIMAL[method], "_meta": envelope_keys}
                )
                verdict = True
            except (ValidationError, KeyError):
                verdict = False
            if len(self._envelopes) >= _ENVELOPES:
                self._envelopes.clear()
            self._envelopes[key] = verdict
        return verdict


def _progress_token_valid(meta: dict[str, Any]) -> bool:
    token = meta.get("progressToken")
    return token is None or isinstance(token, int | str)


def handshake_meta(meta: Any) -> bool:
    """Whether a handshake-era request's ``_meta`` is one the SDK accepts as it is."""
    if meta is None:
        return True
    if not isinstance(meta, dict) or any(k.startswith(_RESERVED) for k in meta):
        return False
    return _progress_token_valid(meta)
