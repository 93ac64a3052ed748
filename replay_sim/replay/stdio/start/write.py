"""Writing the start table a ``serve --stdio`` start answers from (:mod:`replay_sim.replay.stdio.start`).

Every answer in it is the replay's own, made the way a stdio client gets it: ``initialize`` at each
handshake version and the listings, asked of the replay's MCP server over in-memory streams and
serialised as the stdio transport writes them; each call through the fast path
(:class:`~replay_sim.replay.core.prepared.Prepared`) as a new session's first call. Only calls whose
answer does not depend on the session are kept (see :mod:`~replay_sim.replay.stdio.start`): an
exact key recorded from the initial state by a tool that does not change state, and whose params
the start reads back to the same key.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.shared.message import SessionMessage
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION

from replay_sim.errors import StoreError
from replay_sim.protocol import LISTING_METHODS
from replay_sim.replay.core.connections import stdio_client
from replay_sim.replay.core.histories import one_client
from replay_sim.replay.core.prepared import FAST_METHODS, Style
from replay_sim.replay.core.replay import Replay
from replay_sim.replay.factory import open_replay
from replay_sim.replay.stdio.start.session import request_key
from replay_sim.replay.stdio.start.table import (
    FORMAT,
    SCHEMA,
    START_TABLE,
    code_digest,
    identity,
    meta_seal,
    seal,
    stale,
)
from replay_sim.store import Store
from replay_sim.store.content import content_version

__all__ = ["write_start_table"]

_HEAD = b'{"jsonrpc":"2.0","id":0,"result":'


class _Session:
    """A history key of its own (weakly referable, as a connection's is): a new session."""


def write_start_table(db: Path, index_dir: Path, progress: Callable[[int, int], None] | None = None) -> int:
    """Write the start table of every server recorded in the store at ``db`` into ``index_dir``.

    The file is replaced whole (a start reads the old one or the new one, never a part); one
    written from the store as it is, by this code, is left as it is.

    Args:
        db: The recording store.
        index_dir: Its index folder.
        progress: Called as ``progress(done, total)`` with the distinct calls looked at.

    Returns:
        How many calls it answers.
    """
    target = Path(index_dir) / START_TABLE
    with Store(db, create=False):  # gives a store written by an older replay-sim its content version
        pass
    kept = _current(db, target)
    if kept is not None:
        return kept
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as store:
        found = content_version(store)  # before the answers are read: a write meanwhile leaves it stale
    if found is None:
        raise StoreError(f"{db}: the store has no content version; open it for writing once")
    openings: list[tuple[str, str, str, bytes]] = []
    answers: list[tuple[str, str, int, bytes]] = []
    with open_replay(db, index_dir=index_dir) as replay:
        names = replay.names()
        calls = {name: _calls(replay, name) for name in names}
        total, done = sum(len(c) for c in calls.values()), 0
        for name in names:
            openings += anyio.run(_openings, replay, name)
            for row in _answers(replay, name, calls[name]):
                done += 1
                if row is not None:
                    answers.append(row)
                if progress is not None and (done % 500 == 0 or done == total):
                    progress(done, total)
    meta = identity(db, found) | {"format": FORMAT, "code": code_digest(), "servers": json.dumps(names)}
    meta["seal"] = meta_seal(found.store, meta)
    sealed_openings = [(*row, seal(found.store, *row)) for row in openings]
    sealed_answers = [(*row, seal(found.store, *row)) for row in answers]
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial.unlink(missing_ok=True)
    with contextlib.closing(sqlite3.connect(partial)) as conn, conn:
        conn.executescript(SCHEMA)
        conn.executemany("INSERT INTO meta VALUES (?, ?)", meta.items())
        conn.executemany("INSERT INTO openings VALUES (?, ?, ?, ?, ?)", sealed_openings)
        conn.executemany("INSERT INTO answers VALUES (?, ?, ?, ?, ?)", sealed_answers)
    os.replace(partial, target)
    return len(answers)


def _current(db: Path, target: Path) -> int | None:
    """How many calls the start table at ``target`` answers, when it was written from the store at
    ``db`` as it is, by this code, and every row of it is as it was written; else None."""
    try:
        with (
            contextlib.closing(sqlite3.connect(f"file:{target}?mode=ro", uri=True)) as table,
            contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as store,
        ):
            meta = dict(table.execute("SELECT key, value FROM meta").fetchall())
            names = [n for (n,) in store.execute("SELECT name FROM servers UNION SELECT server FROM calls")]
            found = content_version(store)
            if (
                found is None
                or meta.get("servers") != json.dumps(sorted(names))
                or stale(meta, db, store, names)
            ):
                return None
            answered = 0
            for query in ("SELECT * FROM openings", "SELECT * FROM answers"):
                for *row, sealed in table.execute(query):
                    if sealed != seal(found.store, *(bytes(v) if isinstance(v, bytes) else v for v in row)):
                        return None
                    answered += query.endswith("answers")
    except (sqlite3.Error, ValueError, OSError):
        return None
    return answered


def _body(message: SessionMessage) -> bytes | None:
    """A response's result JSON as the stdio transport writes it (None: an error)."""
    line = message.message.model_dump_json(by_alias=True, exclude_unset=True).encode()
    return line[len(_HEAD) : -1] if line.startswith(_HEAD) and line.endswith(b"}") else None


async def _openings(replay: Replay, name: str) -> list[tuple[str, str, str, bytes]]:
    """``initialize`` asked at each handshake version, and the listings served at it."""
    found: list[tuple[str, str, str, bytes]] = []
    for version in HANDSHAKE_PROTOCOL_VERSIONS:
        found += await _opening(replay, name, version)
    return found


async def _opening(replay: Replay, name: str, version: str) -> list[tuple[str, str, str, bytes]]:
    """A stdio session of server ``name`` opened at ``version``: its ``initialize`` answer and listings."""
    server = replay.server(name)
    to_server, server_reads = anyio.create_memory_object_stream[SessionMessage | Exception](8)
    server_writes, from_server = anyio.create_memory_object_stream[SessionMessage](8)

    async def ask(method: str, params: dict[str, Any] | None) -> bytes | None:
        request = types.JSONRPCRequest(jsonrpc="2.0", id=0, method=method, params=params)
        await to_server.send(SessionMessage(request))
        while True:
            message = await from_server.receive()
            if isinstance(message.message, types.JSONRPCResponse | types.JSONRPCError):
                return _body(message)

    found: list[tuple[str, str, str, bytes]] = []
    with one_client(), stdio_client():
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.run, server_reads, server_writes, server.create_initialization_options())
            client = {"name": "replay-sim", "version": "0"}
            result = await ask(
                "initialize", {"protocolVersion": version, "capabilities": {}, "clientInfo": client}
            )
            if result is not None and json.loads(result).get("protocolVersion") == version:
                found.append((name, version, "initialize", result))
                initialized = types.JSONRPCNotification(jsonrpc="2.0", method="notifications/initialized")
                await to_server.send(SessionMessage(initialized))
                for method in LISTING_METHODS:
                    listed = (
                        await ask(method, None) if server.get_request_handler(method) is not None else None
                    )
                    if listed is not None:
                        found.append((name, version, method, listed))
            tg.cancel_scope.cancel()
    return found


def _calls(replay: Replay, name: str) -> list[tuple[str, str]]:
    """The distinct calls (exact key, method) recorded of ``name`` that the fast path answers."""
    return sorted({(r.key, r.method) for r in replay.store.recordings(name) if r.method in FAST_METHODS})


def _answers(
    replay: Replay, name: str, calls: list[tuple[str, str]]
) -> Iterator[tuple[str, str, int, bytes] | None]:
    """For each call, its row when its answer does not depend on the session, else None.

    An answer is made at the latest handshake version and served at every one: a method whose first
    answer differs at any other version is not kept.
    """
    lookup = replay.resolver.lookup
    same_everywhere: dict[str, bool] = {}
    prepared: set[tuple[str, str]] = set()  # the tools whose matching state is built
    for key, method in calls:
        initial = [r for r in lookup.by_key(key) if lookup.state_of(r) == ()]
        if lookup.is_mutating(key) or not initial:
            yield None
            continue
        recording = initial[0]
        if method == "resources/read":
            params: dict[str, Any] = {"uri": recording.name}
        else:
            params = {"name": recording.name, "arguments": recording.arguments}
        if request_key(name, {"method": method, "params": params}) != (method, key):
            yield None  # the start would not find it by these params
            continue
        if (method, recording.name) not in prepared:  # build the tool's matching state first
            replay.resolver.resolve(name, method, params)
            prepared.add((method, recording.name))
        body = _answer(replay, name, method, params, LATEST_HANDSHAKE_VERSION)
        if body is not None and method not in same_everywhere:
            others = {_answer(replay, name, method, params, v) for v in HANDSHAKE_PROTOCOL_VERSIONS}
            same_everywhere[method] = others == {body}
        if body is None or not same_everywhere[method]:
            yield None
        else:
            yield name, key, int(len(initial) == 1), body  # several: chosen by the calls before


def _answer(replay: Replay, name: str, method: str, params: dict[str, Any], version: str) -> bytes | None:
    """The fast path's answer to a call, as a new stdio session's first call."""
    return replay.prepared.answer(name, method, params, _Session(), version, Style.PYDANTIC)
