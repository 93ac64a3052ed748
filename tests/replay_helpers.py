"""Shared helpers for the replay, admin, miss and demo tests: a small recorded store, raw MCP over HTTP.

A live server for them: :func:`replay_sim.listener.serving_in_thread`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client

from replay_sim.store import ServerRecord, Store

COUNTER_TOOLS = {
    "tools": [
        {
            "name": "echo",
            "title": "Echo",
            "description": "Echo a message back.",
            "annotations": {"readOnlyHint": True},
            "inputSchema": {
                "type": "object",
                "properties": {"message": {"type": "string"}, "times": {"type": "integer", "default": 1}},
                "required": ["message"],
            },
        },
        {
            "name": "counter",
            "description": "Read the counter.",
            "annotations": {"readOnlyHint": True},
            "inputSchema": {"type": "object", "properties": {}},
        },
        {
            "name": "increment",
            "description": "Add one to the counter.",
            "inputSchema": {"type": "object", "properties": {}},
        },
        {
            "name": "slow",
            "description": "Reports progress and logs while working.",
            "annotations": {"readOnlyHint": True},
            "inputSchema": {"type": "object", "properties": {"steps": {"type": "integer"}}},
        },
    ]
}


DEMO_INFO = {
    "name": "demo-server",
    "version": "1.2.3",
    "title": "Demo Server",
    "websiteUrl": "https://example.org",
}
DEMO_CAPABILITIES = {
    "tools": {"listChanged": False},
    "resources": {},
    "prompts": {},
    "completions": {},
    "logging": {},
}
PASS_THROUGH = {
    "isError": False,
    "content": [{"type": "text", "text": "hello", "x-extra": 1}],
    "vendorField": [1, 2],
}
"""A recorded result with a field no SDK model knows and keys in a non-canonical order."""


def text_result(text: str, **extra: Any) -> dict[str, Any]:
    """A CallToolResult's wire JSON with one text item."""
    return {"content": [{"type": "text", "text": text}], "isError": False, **extra}


def build_store(path: Path) -> Store:
    """A store recorded from a stateful 'demo' server and a stateless 'other' server.

    Session s-1 makes read-only calls (echo, a recorded error, progress, resource, prompt, completion),
    then reads the counter (0), increments it, reads it again (1): two recordings of the same
    ``counter`` call whose answers differ, told apart only by session history.
    """
    store = Store(path)
    store.put_server(
        ServerRecord(
            "demo",
            {
                "name": "demo-server",
                "version": "1.2.3",
                "title": "Demo Server",
                "websiteUrl": "https://example.org",
            },
            {
                "tools": {"listChanged": False},
                "resources": {},
                "prompts": {},
                "completions": {},
                "logging": {},
            },
            "2025-11-25",
            "Use echo to echo.",
        )
    )
    store.put_listing("demo", "tools/list", COUNTER_TOOLS)
    store.put_listing(
        "demo",
        "resources/list",
        {"resources": [{"uri": "file:///readme.md", "name": "readme", "mimeType": "text/markdown"}]},
    )
    store.put_listing(
        "demo",
        "resources/templates/list",
        {"resourceTemplates": [{"uriTemplate": "file:///{path}", "name": "files"}]},
    )
    store.put_listing(
        "demo",
        "prompts/list",
        {
            "prompts": [
                {"name": "greet", "description": "Greet", "arguments": [{"name": "who", "required": True}]}
            ]
        },
    )
    session = store.start_session("demo", "s-1")
    # A result with a field no SDK model knows and keys in a non-canonical order: must pass through.
    store.record_call(
        "demo",
        "tools/call",
        {"name": "echo", "arguments": {"message": "hello"}},
        result={
            "isError": False,
            "content": [{"type": "text", "text": "hello", "x-extra": 1}],
            "vendorField": [1, 2],
        },
        session=session,
    )
    store.record_call(
        "demo",
        "tools/call",
        {"name": "echo", "arguments": {"message": "boom"}},
        error={"code": -32603, "message": "Internal error: boom"},
        session=session,
    )
    store.record_call(
        "demo",
        "tools/call",
        {"name": "slow", "arguments": {"steps": 2}},
        result=text_result("done"),
        session=session,
        notifications=[
            {
                "method": "notifications/progress",
                "params": {"progressToken": "rec-7", "progress": 1, "total": 2},
            },
            {
                "method": "notifications/message",
                "params": {"level": "info", "logger": "slow", "data": "halfway"},
            },
            {
                "method": "notifications/progress",
                "params": {"progressToken": "rec-7", "progress": 2, "total": 2},
            },
        ],
    )
    store.record_call(
        "demo",
        "resources/read",
        {"uri": "file:///readme.md"},
        result={"contents": [{"uri": "file:///readme.md", "mimeType": "text/markdown", "text": "# Demo"}]},
        session=session,
    )
    store.record_call(
        "demo",
        "prompts/get",
        {"name": "greet", "arguments": {"who": "Ada"}},
        result={"messages": [{"role": "user", "content": {"type": "text", "text": "Hello Ada"}}]},
        session=session,
    )
    store.record_call(
        "demo",
        "completion/complete",
        {"ref": {"type": "ref/prompt", "name": "greet"}, "argument": {"name": "who", "value": "A"}},
        result={"completion": {"values": ["Ada", "Alan"], "hasMore": False}},
        session=session,
    )
    store.record_call(
        "demo", "tools/call", {"name": "counter", "arguments": {}}, result=text_result("0"), session=session
    )
    store.record_call(
        "demo",
        "tools/call",
        {"name": "increment", "arguments": {}},
        result=text_result("ok"),
        session=session,
    )
    store.record_call(
        "demo", "tools/call", {"name": "counter", "arguments": {}}, result=text_result("1"), session=session
    )
    store.put_server(ServerRecord("other", {"name": "other", "version": "0.1"}, {"tools": {}}, "2025-06-18"))
    store.put_listing("other", "tools/list", {"tools": [{"name": "ping", "inputSchema": {"type": "object"}}]})
    store.record_call("other", "tools/call", {"name": "ping", "arguments": {}}, result=text_result("pong"))
    return store


def tool_call(name: str, **arguments: Any) -> dict[str, Any]:
    """tools/call params."""
    return {"name": name, "arguments": arguments}


def make_replay(path: Path, **options: Any) -> Any:
    """A Replay over :func:`build_store` with an in-memory index (nothing written outside tmp)."""
    from replay_sim.replay.core.replay import Replay
    from replay_sim.resolve.resolver import Resolver

    store = build_store(path)
    return Replay(store, resolver=Resolver(store, index_dir=None), **options)


def call_tools(url: str, calls: list[tuple[str, dict[str, Any]]]) -> None:
    """Make tool calls on a served replay endpoint through one real MCP client session."""

    async def run() -> None:
        async with Client(url, mode="legacy") as client:
            for name, arguments in calls:
                await client.call_tool(name, arguments)

    anyio.run(run)


def match_of(result: Any) -> dict[str, Any]:
    """The replay-sim provenance of a result model or wire dict, without its learned confidence.

    ``confidence`` and ``drivers`` depend on the store's model (tests/resolve/test_confidence.py
    and the HTTP test check them); the tiers' own record is compared here.
    """
    meta = result.get("_meta") if isinstance(result, dict) else result.meta
    match = (meta or {})["replay-sim/match"]
    return {k: v for k, v in match.items() if k not in ("confidence", "drivers")}


ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def payload(response: httpx2.Response) -> dict[str, Any]:
    """The JSON-RPC response in a streamable HTTP answer (plain JSON or the last SSE data event)."""
    if response.headers.get("content-type", "").startswith("application/json"):
        return response.json()
    events = [line[5:].strip() for line in response.text.splitlines() if line.startswith("data:")]
    return json.loads([e for e in events if e][-1])


def initialize(version: str = "2025-11-25") -> dict[str, Any]:
    """A handshake-era ``initialize`` request (id 0) of a test client."""
    params = {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    return {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}


async def raw_session(http: httpx2.AsyncClient, url: str, episode: str | None = None) -> dict[str, str]:
    """Initialize a handshake-era MCP session over raw HTTP; returns the headers later requests need."""
    headers = dict(ACCEPT) | ({"X-Replay-Episode": episode} if episode else {})
    response = await http.post(url, json=initialize(), headers=headers)
    headers |= {"Mcp-Session-Id": response.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
    await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    return headers


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def render_dashboard(url: str) -> subprocess.CompletedProcess[str]:
    """The dashboard's DOM once its fetches ran, as headless Chromium renders it."""
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [
                str(CHROMIUM),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--user-data-dir={profile}",
                "--virtual-time-budget=10000",  # run the page's fetches before dumping the DOM
                "--dump-dom",
                f"{url}/",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
