"""Shared helpers for the resolver-side tests: small real SQLite stores and the real embedding model."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from replay_sim.resolve.embedding import SentenceTransformerEmbedder
from replay_sim.store import ServerRecord, Store

SEARCH_TOOL = {
    "name": "search",
    "description": "Search the help centre.",
    "inputSchema": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What to look for"},
            "repo_path": {"type": "string"},
            "limit": {"type": "integer", "default": 5},
            "since": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        },
        "required": ["query", "repo_path"],
    },
    "annotations": {"readOnlyHint": True},
}
ECHO_TOOL = {
    "name": "echo",
    "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]},
    "annotations": {"readOnlyHint": True},
}
WRITE_TOOL = {
    "name": "write_file",
    "inputSchema": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
        "additionalProperties": False,
    },
    "annotations": {"readOnlyHint": False},
}
READ_TOOL = {
    "name": "read_file",
    "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    "annotations": {"readOnlyHint": True},
}
TOOLS = [SEARCH_TOOL, ECHO_TOOL, WRITE_TOOL, READ_TOOL]


def text(value: str) -> dict[str, Any]:
    """A CallToolResult with one text block."""
    return {"content": [{"type": "text", "text": value}], "isError": False}


def call(store: Store, name: str, arguments: dict[str, Any], result: str, session: str = "s-read") -> int:
    """Record one tools/call on server ``demo``."""
    store.start_session("demo", session)
    return store.record_call(
        "demo", "tools/call", {"name": name, "arguments": arguments}, result=text(result), session=session
    )


def x_tool(name: str, annotations: dict[str, Any] | None = None) -> dict[str, Any]:
    """A listed tool taking one argument ``x`` (with ``annotations``, if given)."""
    tool: dict[str, Any] = {"name": name, "inputSchema": {"type": "object", "properties": {"x": {}}}}
    if annotations is not None:
        tool["annotations"] = annotations
    return tool


def record_x(store: Store, session: str, name: str, x: Any, answer: str) -> int:
    """Record ``name(x=x)`` answered ``answer`` as the next call of ``session`` on server ``srv``."""
    store.start_session("srv", session)
    params = {"name": name, "arguments": {"x": x}}
    return store.record_call("srv", "tools/call", params, result=text(answer), session=session)


def confidence_store(path: Path, sessions: int = 6) -> Path:
    """A store on server ``srv``: ``pure`` answers the same call alike after anything (``sessions``
    sessions of three calls); ``counter`` counts its own calls (session ``c<i>`` calls it ``i`` times)."""
    with Store(path) as store:
        store.put_listing("srv", "tools/list", {"tools": [x_tool("pure"), x_tool("counter")]})
        for i in range(1, sessions + 1):
            record_x(store, f"p{i}", "pure", i, str(i))
            record_x(store, f"p{i}", "pure", 100, "100")
            record_x(store, f"p{i}", "pure", 200, "200")
        for i in range(1, sessions + 1):
            for n in range(1, i + 1):
                record_x(store, f"c{i}", "counter", 0, str(n))
    return path


def demo_store(path: Path) -> Store:
    """A store with the demo server's listing and a few recordings from the initial state and after writes."""
    store = Store(path)
    store.put_listing("demo", "tools/list", {"tools": TOOLS})
    repo = "/srv/repo"
    call(
        store,
        "search",
        {"query": "how do I reset my password", "repo_path": repo},
        "Reset it under Settings.",
    )
    call(
        store, "search", {"query": "what is the refund policy", "repo_path": repo}, "Refunds within 30 days."
    )
    call(store, "search", {"query": "where is my order", "repo_path": repo}, "Track it under Orders.")
    call(
        store,
        "search",
        {"query": "how do I reset my password", "repo_path": "/srv/other"},
        "Other repo answer.",
    )
    call(store, "echo", {"message": "hello world"}, "Echo: hello world")
    call(store, "echo", {"message": "good morning"}, "Echo: good morning")
    call(store, "read_file", {"path": "/a.txt"}, "one")
    call(
        store,
        "write_file",
        {"path": "/a.txt", "content": "two"},
        "Successfully wrote /a.txt",
        session="s-write",
    )
    call(store, "read_file", {"path": "/a.txt"}, "two", session="s-write")
    return store


REPO = "/srv/repo"


def search(query: str) -> dict[str, Any]:
    return {"name": "search", "arguments": {"query": query, "repo_path": REPO}}


def calibrated_store(path: Path) -> Store:
    """The demo server and store, with the two close questions that calibrate search's threshold."""
    store = demo_store(path)
    store.put_server(ServerRecord("demo", {"name": "demo", "version": "1"}, {"tools": {}}))
    call(store, "search", {"query": "how do I change my password", "repo_path": REPO}, "Under Security.")
    call(store, "search", {"query": "how do I recover my password", "repo_path": REPO}, "By email.")
    return store


class GatedEmbedder:
    """The real model behind a gate: every encode waits until the test opens it (a model loading)."""

    def __init__(self, model: SentenceTransformerEmbedder) -> None:
        self.model = model
        self.gate = threading.Event()
        self.waiting = threading.Event()

    @property
    def model_id(self) -> str:
        return self.model.model_id

    @property
    def dimension(self) -> int:
        return self.model.dimension

    @property
    def loaded(self) -> bool:
        """Loaded once the gate is open."""
        return self.gate.is_set()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.waiting.set()
        self.gate.wait()
        return self.model.encode(texts)
