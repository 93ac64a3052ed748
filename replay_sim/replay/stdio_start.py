"""A ``serve --stdio`` start that answers before the MCP SDK is loaded: ``initialize``, listings, exact hits.

Agent frameworks start an MCP server per rollout over stdio, and importing the MCP SDK, pydantic's
models and the resolver takes most of a second. What a rollout asks first — ``initialize``, the
listings, calls recorded exactly — needs none of it when it was prepared once: ``replay-sim index
build`` writes the *start table* (:data:`START_TABLE` in the index folder,
:mod:`replay_sim.replay.start_table`), the replay's own answers to those requests, as the replay
writes them on stdio. A start reads it (:meth:`StartTable.open`) and answers from it
(:func:`serve_until_needed`); the replay is loaded only when a request needs it: the first request
the table cannot answer for certain hands the connection over (:class:`Handover`), and the replay
is told every request answered so far — their answers discarded, each compared with the one
sent — so the episode's history, metrics and the SDK's session are what they would have been. A
client that needs nothing else never loads the replay.

Only what does not depend on the episode is answered: a call recorded exactly, from the state
every session starts in, by a tool that does not change it — any number of them, in any order,
when its key was recorded once; only as the session's first call otherwise (the recording then
chosen is the oldest). The table is used only when it was built from this very store (its calls,
servers, listings and meta), by this version of replay-sim, the store passed its integrity check
unchanged since (:mod:`replay_sim.store.verified`), and nothing the table cannot see is asked of
the replay (a snapshot, a recorder config, faults, latency, ``--strict``, a matching config);
a store written meanwhile (``PRAGMA data_version``) hands over at the next request.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import sqlite3
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replay_sim.canonical import call_identity, call_key
from replay_sim.protocol import LISTING_METHODS
from replay_sim.store import verified

__all__ = [
    "START_TABLE",
    "Handover",
    "StartTable",
    "code_digest",
    "request_key",
    "serve_until_needed",
    "store_basis",
]

START_TABLE = "stdio-start.sqlite"
"""The start table's file in the index folder."""
FORMAT = "1"
"""The start table's layout (another one is not read)."""

_CHUNK = 1 << 16
_MAX_LINE = 1 << 20  # a longer request line is the replay's to read
_SAFE_ID = re.compile(r"[A-Za-z0-9_.:/-]{1,128}")  # string ids JSON spells as they are
_CALL_PARAMS = {
    "tools/call": frozenset({"name", "arguments"}),
    "resources/read": frozenset({"uri"}),
    "prompts/get": frozenset({"name", "arguments"}),
}
_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE openings (server TEXT, version TEXT, method TEXT, result BLOB NOT NULL,
                       PRIMARY KEY (server, version, method));
CREATE TABLE answers (server TEXT, key TEXT, anytime INTEGER NOT NULL, result BLOB NOT NULL,
                      PRIMARY KEY (server, key)) WITHOUT ROWID;
"""


def code_digest() -> str:
    """This replay-sim's code, as a digest of its source files' names, sizes and times: a table
    written by other code (another version, an edited checkout) is not read."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent
    for folder, folders, files in os.walk(root):
        folders[:] = sorted(f for f in folders if f != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                found = os.stat(os.path.join(folder, name))
                digest.update(f"{folder}/{name}:{found.st_size}:{found.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def store_basis(conn: sqlite3.Connection, server: str) -> str:
    """What a start table of ``server`` was built from: the store's calls, that server's recorded
    identity and listings, and the store's meta (kept tool effects among them), as one digest."""
    digest = hashlib.sha256()
    ((count, last),) = conn.execute("SELECT COUNT(*), COALESCE(MAX(id), 0) FROM calls").fetchall()
    digest.update(f"calls:{count}:{last}\n".encode())
    for query in (
        "SELECT * FROM servers WHERE name=? ORDER BY 1",
        "SELECT * FROM listings WHERE server=? ORDER BY 1, 2",
    ):
        for row in conn.execute(query, (server,)):
            digest.update(repr(row).encode() + b"\n")
    for row in conn.execute("SELECT key, value FROM meta ORDER BY key"):
        digest.update(repr(row).encode() + b"\n")
    return digest.hexdigest()


def request_key(server: str, request: dict[str, Any]) -> tuple[str, str] | None:
    """A call request's ``(method, exact key)`` when its params are plain (no ``_meta``), else None."""
    method, params = request.get("method"), request.get("params")
    if not isinstance(method, str) or method not in _CALL_PARAMS:
        return None
    if not isinstance(params, dict) or params.keys() - _CALL_PARAMS[method]:
        return None
    if method == "resources/read":
        if not isinstance(params.get("uri"), str):
            return None
    else:
        arguments = params.get("arguments")
        if not isinstance(params.get("name"), str) or not (arguments is None or isinstance(arguments, dict)):
            return None
        if method == "prompts/get" and arguments and not all(isinstance(v, str) for v in arguments.values()):
            return None
    name, arguments = call_identity(method, params)
    return method, call_key(server, method, name, arguments)


class StartTable:
    """The answers a stdio start of one recorded server may give, read from its start table.

    Args:
        conn: The start table, open.
        store: The store, open read-only (whose writes :meth:`current` watches).
        server: The recorded server served.
    """

    def __init__(self, conn: sqlite3.Connection, store: sqlite3.Connection, server: str) -> None:
        self.conn = conn
        self.store = store
        self.server = server
        self._data_version = self._store_version()

    @classmethod
    def open(cls, db: Path, index_dir: Path, server: str) -> tuple[StartTable | None, str]:
        """The start table of ``server`` for the store at ``db``, or None and why not: "" when there
        is no table, or the store was written since its integrity check (the replay checks it, and
        the next start uses the table)."""
        path = Path(index_dir) / START_TABLE
        if not path.is_file():
            return None, ""
        try:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            store = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        except sqlite3.Error:
            return None, ""
        try:
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
            if meta.get("format") != FORMAT or meta.get("code") != code_digest():
                why = "it was written by other replay-sim code (another version, or an edited checkout)"
            elif server not in json.loads(meta.get("servers", "[]")):
                why = f"it has no server {server!r}"
            elif meta.get(f"basis:{server}") != store_basis(store, server):
                why = "the store changed since it was written"
            elif not verified.verified(db, verified.stamp_of(db)):
                why = ""
            else:
                return cls(conn, store, server), ""
        except (sqlite3.Error, ValueError) as exc:
            why = f"it cannot be read ({exc})"
        conn.close()
        store.close()
        return None, why and f"{path} is not used: {why}; `replay-sim index build` writes it again"

    def _store_version(self) -> int:
        return int(self.store.execute("PRAGMA data_version").fetchone()[0])

    def current(self) -> bool:
        """Whether no other connection has written to the store since the table was opened."""
        return self._store_version() == self._data_version

    def opening(self, version: str, method: str) -> bytes | None:
        """The result JSON of ``initialize`` asked at ``version``, or of a listing served at it."""
        row = self.conn.execute(
            "SELECT result FROM openings WHERE server=? AND version=? AND method=?",
            (self.server, version, method),
        ).fetchone()
        return None if row is None else bytes(row[0])

    def call(self, key: str) -> tuple[bytes, bool] | None:
        """The result JSON of the call with this exact key, and whether it holds after other calls."""
        row = self.conn.execute(
            "SELECT result, anytime FROM answers WHERE server=? AND key=?", (self.server, key)
        ).fetchone()
        return None if row is None else (bytes(row[0]), bool(row[1]))

    def close(self) -> None:
        self.conn.close()
        self.store.close()


@dataclass
class Handover:
    """What a stdio start hands the replay: what it answered, and what it read and did not.

    Attributes:
        lines: The requests and notifications answered (or taken) so far, in order, each request
            under a new id of :attr:`marker`'s (the replay must see them; the client must not see
            its answers again).
        sent: Each such id and the result JSON the client was sent for it.
        rest: What was read from stdin and not answered: the replay reads it first.
        ended: The client closed stdin: nothing is left to serve.
        marker: The prefix of the ids given to the requests in :attr:`lines`.
    """

    lines: list[bytes] = field(default_factory=list)
    sent: dict[str, bytes] = field(default_factory=dict)
    rest: bytes = b""
    ended: bool = False
    marker: str = field(default_factory=lambda: f"replay-sim/start/{secrets.token_hex(6)}/")

    def took(self, request: dict[str, Any], result: bytes | None) -> None:
        """Keep a request answered with ``result`` (None: a notification taken)."""
        if result is None:
            self.lines.append(json.dumps(request).encode())
            return
        id_ = f"{self.marker}{len(self.lines)}"
        self.lines.append(json.dumps({**request, "id": id_}).encode())
        self.sent[id_] = result

    def is_request(self, line: bytes) -> bool:
        """Whether ``line``, one of :attr:`lines`, is a request (the client has its answer)."""
        return self.marker.encode() in line

    def swallow(self, line: bytes) -> bool:
        """Whether ``line`` (a response the replay writes) answers a request of :attr:`lines`: then it
        is not written, and a result other than the one the client was sent is reported on stderr."""
        if not self.sent or self.marker.encode() not in line[:256]:
            return False
        try:
            message = json.loads(line)
        except ValueError:
            return False
        sent = self.sent.pop(str(message.get("id")), None) if isinstance(message, dict) else None
        if sent is None:
            return False
        if message.get("result") != json.loads(sent):
            print(
                f"replay-sim: warning: the stdio start answered a request otherwise than the replay: "
                f"sent {sent[:300]!r}, the replay says {line[:300]!r}",
                file=sys.stderr,
                flush=True,
            )
        return True


def _envelope(id_: int | str, result: bytes) -> bytes:
    """The response line the SDK writes for ``result`` (ids are ints or :data:`_SAFE_ID` strings)."""
    spelled = str(id_) if isinstance(id_, int) else f'"{id_}"'
    return b"".join((b'{"jsonrpc":"2.0","id":', spelled.encode(), b',"result":', result, b"}\n"))


def _plain_id(request: dict[str, Any]) -> bool:
    id_ = request.get("id")
    if type(id_) is int:
        return abs(id_) < 2**53
    return isinstance(id_, str) and _SAFE_ID.fullmatch(id_) is not None


def _plain_initialize(params: Any) -> bool:
    """Whether ``initialize`` params are what the SDK accepts as they are (anything else: the SDK's)."""
    if not isinstance(params, dict) or params.keys() - {"protocolVersion", "capabilities", "clientInfo"}:
        return False
    capabilities, info = params.get("capabilities"), params.get("clientInfo")
    return (
        isinstance(params.get("protocolVersion"), str)
        and isinstance(capabilities, dict)
        and all(isinstance(v, dict) for v in capabilities.values())
        and isinstance(info, dict)
        and not info.keys() - {"name", "version", "title"}
        and all(isinstance(info.get(k), str) for k in ("name", "version"))
        and all(isinstance(v, str) for v in info.values())
    )


class _Session:
    """What the client's requests settled so far, and the answers they get from the table."""

    def __init__(self, table: StartTable) -> None:
        self.table = table
        self.version: str | None = None  # once initialize is answered
        self.initialized = False
        self.calls = 0

    def answer(self, message: Any) -> tuple[bytes | None, bool]:
        """``(result JSON, True)``, ``(None, True)`` for a notification taken, or ``(None, False)``:
        the replay must read this message."""
        if not isinstance(message, dict) or message.keys() - {"jsonrpc", "id", "method", "params"}:
            return None, False
        if message.get("jsonrpc") != "2.0" or not isinstance(message.get("method"), str):
            return None, False
        method: str = message["method"]
        params: Any = message.get("params")
        if "id" not in message:
            taken = (
                method == "notifications/initialized" and self.version is not None and params in (None, {})
            )
            self.initialized = self.initialized or taken
            return None, taken
        if not _plain_id(message):
            return None, False
        if method == "initialize":
            if self.version is not None or not _plain_initialize(params):
                return None, False
            result = self.table.opening(params["protocolVersion"], "initialize")
            if result is not None:
                self.version = params["protocolVersion"]
        elif not self.initialized:
            return None, False
        elif method in LISTING_METHODS:
            result = self.table.opening(self.version or "", method) if params in (None, {}) else None
        else:
            result = self._call(message)
        return result, result is not None

    def _call(self, request: dict[str, Any]) -> bytes | None:
        found = request_key(self.table.server, request)
        if found is None or not self.table.current():
            return None
        answer = self.table.call(found[1])
        if answer is None or not (answer[1] or self.calls == 0):
            return None
        self.calls += 1
        return answer[0]


def serve_until_needed(table: StartTable, stdin: int = 0, stdout: int = 1) -> Handover:
    """Answer request lines from the start table until one needs the replay, or stdin ends.

    Args:
        table: The start table of the server served.
        stdin: The file descriptor requests are read from.
        stdout: The file descriptor answers are written to.

    Returns:
        What the replay must know to go on (:class:`Handover`).
    """
    session = _Session(table)
    handover = Handover()
    buffer = b""
    while True:  # the buffer holds no whole line here
        chunk = os.read(stdin, _CHUNK)
        if not chunk:
            handover.rest, handover.ended = buffer, True
            return handover
        buffer += chunk
        while b"\n" in buffer:
            line, _, after = buffer.partition(b"\n")
            if not line.strip():
                buffer = after
                continue
            try:
                message = json.loads(line)
            except (ValueError, RecursionError):
                message = None
            result, taken = session.answer(message) if message is not None else (None, False)
            if not taken:
                handover.rest = buffer
                return handover
            handover.took(message, result)
            if result is not None:
                _write_all(stdout, _envelope(message["id"], result))
            buffer = after
        if len(buffer) > _MAX_LINE:
            handover.rest = buffer
            return handover


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
