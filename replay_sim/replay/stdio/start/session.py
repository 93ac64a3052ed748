"""A stdio start's session: request lines answered from the start table until one needs the replay."""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
from dataclasses import dataclass, field
from typing import Any

from replay_sim.canonical import call_identity, call_key
from replay_sim.protocol import FAST_CALL_PARAMS, LISTING_METHODS, plain_call_params
from replay_sim.replay.stdio.start.table import StartTable

__all__ = ["Handover", "request_key", "serve_until_needed"]

_CHUNK = 1 << 16
_MAX_LINE = 1 << 20  # a longer request line is the replay's to read
_SAFE_ID = re.compile(r"[A-Za-z0-9_.:/-]{1,128}")  # string ids JSON spells as they are


def request_key(server: str, request: dict[str, Any]) -> tuple[str, str] | None:
    """A call request's ``(method, exact key)`` when its params are plain (no ``_meta``), else None."""
    method, params = request.get("method"), request.get("params")
    if not isinstance(method, str) or method not in FAST_CALL_PARAMS or not isinstance(params, dict):
        return None
    if "_meta" in params or not plain_call_params(method, params):
        return None
    try:
        name, arguments = call_identity(method, params)
        return method, call_key(server, method, name, arguments)
    except (ValueError, RecursionError):  # no JSON value (1e999), a lone surrogate, deep nesting
        return None


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
        if not _plain_id(message) or not self.table.current():  # a store written: the replay's from here
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
        if found is None:
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
            result, taken, message = _settle(session, line)
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


def _settle(session: _Session, line: bytes) -> tuple[bytes | None, bool, Any]:
    """What the start does with a request line: :meth:`_Session.answer`'s verdict, and the message.

    Never raises: a line the start cannot read or key — not JSON, ``NaN`` or ``Infinity`` (which
    JSON has not, though Python's ``json.dumps`` writes them), a number past a float, a lone
    surrogate, deep nesting — is the replay's, which answers every line as it does without a table
    (a result, a miss, or a JSON-RPC error).
    """
    try:
        message = json.loads(line, parse_constant=_no_constant)
        result, taken = session.answer(message)
    except Exception:
        return None, False, None
    return result, taken, message


def _no_constant(name: str) -> Any:
    raise ValueError(f"JSON has no {name}")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
