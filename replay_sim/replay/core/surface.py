"""The recorded face of a server: its listings, tool schemas, and how it refuses bad calls.

A replayed server refuses a call only where the real one certainly would: an unknown tool (unless
the recordings show the server answering tools its listing lacks), or arguments whose violation of
the inputSchema the recordings show refused — or that every server refuses, whatever its schema
dialect (a missing required argument). A violation the server may coerce or ignore (``"2"`` for an
integer, an extra property, a ``nullable`` property's null) is never refused on the schema's word:
the call goes on to the resolver. See :mod:`replay_sim.resolve.dialect`.

A call whose own answer was recorded is never refused: the recording is the real server's verdict.
A refusal reuses the recorded refusal of the same kind of violation, reworded for the new value;
for a certain refusal nothing recorded says the words of, the form of another recorded refusal of
the server (a JSON-RPC error with its code, or an ``isError`` result); otherwise the MCP Python
SDK's form (an ``isError`` result).
"""

from __future__ import annotations

from typing import Any

from mcp.shared.exceptions import MCPError

from replay_sim.canonical import call_key
from replay_sim.errors import StoreError
from replay_sim.protocol import MATCH_META_KEY
from replay_sim.replay.core.provenance import Reply, provenance
from replay_sim.resolve.dialect import Judgement, SchemaEvidence, adapt_refusal, failure_text
from replay_sim.resolve.resolution import Problem, Resolution, Tier
from replay_sim.schema import tool_schemas
from replay_sim.store import Recording, ServerRecord, Store
from replay_sim.store.changes import Mark, changes_since

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
        self._evidence: dict[str, SchemaEvidence] = {}
        self._version: Mark | None = None

    def problems(self) -> list[str]:
        """Listings the server's capabilities promise but the store lacks."""
        return [
            f"server {self.record.name!r} advertises {capability} but no {method} was recorded"
            for capability, methods in _CAPABILITY_LISTINGS.items()
            if capability in self.record.capabilities
            for method in methods
            if method not in self.listings
        ]

    def _fresh(self) -> None:
        """Forget what was learned from this server's recordings when calls of it were added since."""
        try:
            self._version, appended = changes_since(self.store, self._version)
        except StoreError:  # a closed store: keep what was learned
            return
        if appended is None:
            self._evidence.clear()
        elif self.record.name in appended.servers:
            for server, tool in appended.tools:
                if server == self.record.name:
                    self._evidence.pop(tool, None)
        else:
            return
        self._refusals = None

    def judge(self, tool: str, arguments: dict[str, Any]) -> Judgement:
        """What the recordings say a real server does with these arguments (a listed tool)."""
        self._fresh()
        return self._judge(tool, arguments)

    def _judge(self, tool: str, arguments: dict[str, Any]) -> Judgement:
        evidence = self._evidence.get(tool)
        if evidence is None:
            schema = self.schemas.get(tool)
            if schema is None:  # a malformed listing entry: nothing to check against
                return Judgement()
            recordings = self.store.recordings(self.record.name, method="tools/call", name=tool)
            evidence = self._evidence[tool] = SchemaEvidence(schema, recordings)
        return evidence.judge(arguments)

    def _unknown_tools_answered(self) -> bool:
        """Whether a recorded call of a tool the listing lacks succeeded (the listing is not all)."""
        return "answered" in self._recorded_refusals()

    def problem(self, tool: str, arguments: dict[str, Any]) -> str | None:
        """Why a real server would certainly refuse this tool call (unknown tool, arguments), or None."""
        if not self.tools:
            return None  # no tools/list recorded: nothing to check against
        self._fresh()
        if tool not in self.tools:
            if self._unknown_tools_answered():
                return None
            known = ", ".join(sorted(self.tools))
            return f"unknown tool {tool!r} on {self.record.name!r} (recorded tools: {known})"
        refusal = self._judge(tool, arguments).refusal
        if refusal is None:
            return None
        return f"arguments of {tool!r} violate its inputSchema: {refusal.describe()}"

    def _recorded_refusals(self) -> dict[str, Recording]:
        """The first recorded refusal of an unknown tool and of invalid arguments, if any.

        ``answered`` holds a successful call of a tool the listing lacks, when one was recorded.
        """
        if self._refusals is None:
            found: dict[str, Recording] = {}
            for rec in self.store.recordings(self.record.name, method="tools/call"):
                if rec.name not in self.tools:
                    found.setdefault("unknown" if rec.failed else "answered", rec)
                elif (
                    rec.failed and "invalid" not in found and self._judge(rec.name, rec.arguments).violations
                ):
                    found["invalid"] = rec  # its form (error or isError result) is the server's
                if len(found) == 3:
                    break
            self._refusals = found
        return self._refusals

    def refusal(
        self, method: str, name: str, arguments: dict[str, Any], snapshot: str | None
    ) -> tuple[Resolution, Reply] | None:
        """The real server's refusal of an unknown tool or invalid arguments, unless recorded exactly.

        Args:
            method: ``tools/call``.
            name: Tool name.
            arguments: Call arguments (redacted, as recorded).
            snapshot: The snapshot id its provenance cites, if any.

        Returns:
            The miss (its ``problem`` says which kind) and the reply refusing the call; None when
            the real server would not certainly refuse it, or its answer to this very call was recorded.
        """
        problem = self.problem(name, arguments)
        if problem is None:
            return None
        try:
            key = call_key(self.record.name, method, name, arguments)
        except ValueError:  # JSON cannot hold them (NaN, Infinity): the resolver's miss says so
            return None
        if self.store.recordings(key=key, limit=1):
            return None  # the real server's own answer to this very call was recorded
        kind = Problem.UNKNOWN_TOOL if name not in self.tools else Problem.INVALID_ARGUMENTS
        resolution = Resolution(Tier.MISS, 0.0, reason=problem, key=key, problem=kind)
        reply = self.refuse_tool_call(name, arguments, {MATCH_META_KEY: provenance(resolution, snapshot)})
        return None if reply is None else (resolution, reply)

    def refuse_tool_call(self, name: str, arguments: dict[str, Any], meta: dict[str, Any]) -> Reply | None:
        """The real server's refusal of an unknown tool or invalid arguments; None when not certain.

        Args:
            name: Tool name.
            arguments: Call arguments.
            meta: ``_meta`` to put on a refusal result (provenance).
        """
        if self.problem(name, arguments) is None:
            return None
        if name not in self.tools:
            recorded = self._recorded_refusals().get("unknown")
            if recorded is None:
                return _result(f"Unknown tool: {name}", meta)
            return _like(recorded, _adapt(failure_text(recorded), recorded.name, name, None), meta)
        judgement = self._judge(name, arguments)
        violation = judgement.refusal
        assert violation is not None  # problem() said so
        same, made = judgement.refused_by, judgement.refused_as
        if same is not None and made is not None:  # the same kind of violation, recorded refused
            text = adapt_refusal(failure_text(same), made, violation, same.arguments, arguments)
            return _like(same, text, meta)
        recorded = self._recorded_refusals().get("invalid")
        if recorded is None:
            return _result(f"Input validation error: {violation.message}", meta)
        return _like(
            recorded, _adapt(failure_text(recorded), recorded.name, name, violation.describe()), meta
        )


def _result(text: str, meta: dict[str, Any]) -> Reply:
    """An ``isError`` result with one text block."""
    return {"content": [{"type": "text", "text": text}], "isError": True, "_meta": meta}


def _like(recorded: Recording, text: str, meta: dict[str, Any]) -> Reply:
    """A refusal in the recorded refusal's form: a JSON-RPC error with its code, or an isError result."""
    if recorded.error is not None:
        return MCPError(int(recorded.error.get("code", -32602)), text, recorded.error.get("data"))
    return _result(text, meta)


def _adapt(message: str, recorded_name: str, name: str, detail: str | None) -> str:
    """Reword a recorded refusal for another call: the new tool name, the new validation detail."""
    if detail is None:
        return message.replace(recorded_name, name) if recorded_name else message
    cut = message.find(recorded_name) if recorded_name else -1
    if cut >= 0:
        return f"{message[:cut]}{name}: {detail}"
    head = message.split(":", 1)[0] if ":" in message else "Input validation error"
    return f"{head}: {detail}"
