"""The recorded face of a server: its listings, tool schemas, and how it refuses bad calls.

A replayed server must refuse an unknown tool or arguments that violate the tool's inputSchema the
way the real server does. When the recordings hold such a refusal, its form is reused (a JSON-RPC
error with the same code, or an ``isError`` result, with the message adapted to the new call);
otherwise the MCP Python SDK's form is used (an ``isError`` result).
"""

from __future__ import annotations

from typing import Any

from mcp.shared.exceptions import MCPError

from replay_sim.replay.provenance import Reply
from replay_sim.schema import tool_schemas
from replay_sim.store import Recording, ServerRecord, Store

__all__ = ["Surface"]

_CAPABILITY_LISTINGS = {
    "tools": ("tools/list",),
    "resources": ("resources/list",),
    "prompts": ("prompts/list",),
}


class Surface:
    """What a recorded server showed its clients, and checks of calls against it.

    Args:
        store: The recording store.
        record: The recorded server.
    """

    def __init__(self, store: Store, record: ServerRecord) -> None:
        self.store = store
        self.record = record
        self.listings = store.listings(record.name)
        tools = (self.listings.get("tools/list") or {}).get("tools") or []
        prompts = (self.listings.get("prompts/list") or {}).get("prompts") or []
        self.tools: dict[str, dict[str, Any]] = {
            t["name"]: t for t in tools if isinstance(t, dict) and "name" in t
        }
        self.prompts: dict[str, dict[str, Any]] = {
            p["name"]: p for p in prompts if isinstance(p, dict) and "name" in p
        }
        self.schemas = tool_schemas(self.listings.get("tools/list"))
        self._refusals: dict[str, Recording] | None = None

    def problems(self) -> list[str]:
        """Listings the server's capabilities promise but the store lacks."""
        return [
            f"server {self.record.name!r} advertises {capability} but no {method} was recorded"
            for capability, methods in _CAPABILITY_LISTINGS.items()
            if capability in self.record.capabilities
            for method in methods
            if method not in self.listings
        ]

    def violation(self, tool: str, arguments: dict[str, Any]) -> str | None:
        """Why ``arguments`` violate the tool's recorded inputSchema, or None when they do not."""
        schema = self.schemas.get(tool)
        return None if schema is None else schema.validate(arguments)

    def problem(self, tool: str, arguments: dict[str, Any]) -> str | None:
        """Why a real server would refuse this tool call (unknown tool, invalid arguments), or None."""
        if not self.tools:
            return None  # no tools/list recorded: nothing to check against
        if tool not in self.tools:
            known = ", ".join(sorted(self.tools))
            return f"unknown tool {tool!r} on {self.record.name!r} (recorded tools: {known})"
        violation = self.violation(tool, arguments)
        return None if violation is None else f"arguments of {tool!r} violate its inputSchema: {violation}"

    def _recorded_refusals(self) -> dict[str, Recording]:
        """The first recorded refusal of an unknown tool and of invalid arguments, if any."""
        if self._refusals is None:
            found: dict[str, Recording] = {}
            for rec in self.store.recordings(self.record.name, method="tools/call"):
                if not rec.failed:
                    continue
                if rec.name not in self.tools:
                    found.setdefault("unknown", rec)
                elif self.violation(rec.name, rec.arguments) is not None:
                    found.setdefault("invalid", rec)
                if len(found) == 2:
                    break
            self._refusals = found
        return self._refusals

    def refuse_tool_call(self, name: str, arguments: dict[str, Any], meta: dict[str, Any]) -> Reply | None:
        """The real server's refusal of an unknown tool or invalid arguments; None when the call is fine.

        Args:
            name: Tool name.
            arguments: Call arguments.
            meta: ``_meta`` to put on a refusal result (provenance).
        """
        if not self.tools:
            return None  # no tools/list recorded: nothing to check against
        if name not in self.tools:
            kind, detail = "unknown", None
        else:
            detail = self.violation(name, arguments)
            if detail is None:
                return None
            kind = "invalid"
        recorded = self._recorded_refusals().get(kind)
        if recorded is None:
            text = f"Unknown tool: {name}" if kind == "unknown" else f"Input validation error: {detail}"
            return {"content": [{"type": "text", "text": text}], "isError": True, "_meta": meta}
        if recorded.error is not None:
            message = _adapt(str(recorded.error.get("message", "")), recorded.name, name, detail)
            return MCPError(int(recorded.error.get("code", -32602)), message, recorded.error.get("data"))
        texts = [
            c.get("text", "") for c in (recorded.result or {}).get("content") or [] if c.get("type") == "text"
        ]
        text = _adapt("\n".join(texts), recorded.name, name, detail)
        return {"content": [{"type": "text", "text": text}], "isError": True, "_meta": meta}


def _adapt(message: str, recorded_name: str, name: str, detail: str | None) -> str:
    """Reword a recorded refusal for another call: the new tool name, the new validation detail."""
    if detail is None:
        return message.replace(recorded_name, name) if recorded_name else message
    cut = message.find(recorded_name) if recorded_name else -1
    if cut >= 0:
        return f"{message[:cut]}{name}: {detail}"
    head = message.split(":", 1)[0] if ":" in message else "Input validation error"
    return f"{head}: {detail}"
