"""JSON answers from the SDK path: one ``application/json`` body unless the answer streams.

The SDK's session manager answers every handshake-era POST with an SSE stream, or — all sessions
alike — every POST with JSON, which leaves no stream for the notifications and server→client
requests a recorded call re-enacts. :class:`JsonUnlessStreamed` decides per request, as the SDK's
2026-era entry does: the stream's start is held back until its first event; when that event is
the request's own response, it goes out as a single JSON body instead (the same JSON-RPC bytes);
anything else first — a notification, a question to the client, a ping — starts the stream as
the SDK sent it. A handler about to hold its answer (injected latency, a timeout fault) starts the
stream at once (:func:`~replay_sim.replay.core.connections.stream_now`), so a client waiting for the
answer sees the response begin.

Both forms are the client's to accept; one that prefers the stream — ``text/event-stream`` with a
higher q-value than ``application/json``, or listed first at the same one — gets it
(:func:`prefers_json`). MCP SDK clients list ``application/json`` first.
"""

from __future__ import annotations

import functools
import re

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from replay_sim.replay.core.connections import STREAM_KEY

__all__ = ["JsonUnlessStreamed", "prefers_json"]


_EVENT_HEAD = b"event: message\r\ndata: "
_EVENT_TAIL = b"\r\n\r\n"
# A response as the SDK serialises it (model_dump_json: fixed key order, no spaces).
_RESPONSE = re.compile(rb'\{"jsonrpc":"2\.0","id":(?:-?\d+|"(?:[^"\\]|\\.)*"),"(?:result|error)":')


class JsonUnlessStreamed:
    """ASGI wrapper of the SDK's handshake-era POST handling: single answers as JSON, streams as SSE.

    Args:
        app: The session manager's request handler.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        held: Message | None = None
        mode = ""  # "" undecided, "stream" passing the SDK's messages on, "json" answered
        lock = anyio.Lock()

        async def start_stream() -> None:
            nonlocal held, mode
            async with lock:
                if mode:
                    return
                mode = "stream"
                if held is not None:
                    start, held = held, None
                    await send(start)

        async def deferred(message: Message) -> None:
            nonlocal held, mode
            async with lock:
                if mode == "json":
                    return  # the end of a stream already answered as JSON
                if mode == "stream":
                    await send(message)
                    return
                if message["type"] == "http.response.start":
                    if _is_stream(message):
                        held = message
                    else:
                        mode = "stream"
                        await send(message)
                    return
                single = _single_response(message) if held is not None else None
                if single is None:
                    mode = "stream"
                    if held is not None:
                        start, held = held, None
                        await send(start)
                    await send(message)
                    return
                assert held is not None
                mode = "json"
                start = {
                    "type": "http.response.start",
                    "status": held["status"],
                    "headers": _json_headers(held, single),
                }
                held = None
                await send(start)
                await send({"type": "http.response.body", "body": single})

        scope[STREAM_KEY] = start_stream
        await self.app(scope, receive, deferred)
        if held is not None:  # the stream was started and ended with no event: send it as it was
            await send(held)
            await send({"type": "http.response.body", "body": b""})


@functools.lru_cache(maxsize=256)
def prefers_json(accept: str) -> bool:
    """Whether an ``Accept`` header takes ``application/json`` at least as gladly as ``text/event-stream``.

    Preference is the q-value, then the order listed (a wildcard counts for both at its place).
    """
    best: dict[str, tuple[float, int]] = {}
    for place, item in enumerate(accept.split(",")):
        kind, *options = (part.strip() for part in item.split(";"))
        quality = 1.0
        for option in options:
            name, _, value = option.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        kind = kind.lower()
        for form, ranges in (
            ("json", ("application/json", "application/*", "*/*")),
            ("sse", ("text/event-stream", "text/*", "*/*")),
        ):
            if kind in ranges and (form not in best or (quality, -place) > (best[form][0], -best[form][1])):
                best[form] = (quality, place)
    if "json" not in best or best["json"][0] <= 0:
        return False
    if "sse" not in best:
        return True
    return (best["json"][0], -best["json"][1]) >= (best["sse"][0], -best["sse"][1])


def _is_stream(message: Message) -> bool:
    return any(k == b"content-type" and v.startswith(b"text/event-stream") for k, v in message["headers"])


def _single_response(message: Message) -> bytes | None:
    """The JSON-RPC response an SSE body chunk carries as its one event, else None."""
    body: bytes = message.get("body", b"")
    if not (body.startswith(_EVENT_HEAD) and body.endswith(_EVENT_TAIL)):
        return None
    data = body[len(_EVENT_HEAD) : -len(_EVENT_TAIL)]
    if b"\r" in data or b"\n" in data or _RESPONSE.match(data) is None:
        return None  # more than one line, or not the response (a notification, a question)
    return data


def _json_headers(start: Message, body: bytes) -> list[tuple[bytes, bytes]]:
    """The SDK's JSON-response headers: content type, the session id the stream carried, length."""
    session = [(k, v) for k, v in start["headers"] if k == b"mcp-session-id"]
    return [(b"content-type", b"application/json"), *session, (b"content-length", str(len(body)).encode())]
