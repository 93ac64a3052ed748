"""How every replay-sim HTTP server runs uvicorn: kept-alive connections, header deadlines, quiet logs.

The replay server (``replay-sim serve``, :func:`~replay_sim.replay.http.serving.serving`) and the HTTP
recorder (``replay-sim record --http``) share these settings (:class:`HttpOptions`):

- **Keep-alive past every client's.** A server that closes an idle connection at the moment a
  client reuses it makes that client's request fail (``ReadError``, "Connection closed") — and the
  client cannot tell whether a write happened. uvicorn closes after 5 s, exactly httpx's (the MCP
  SDK's) expiry; we keep idle connections 75 s (nginx's default), past httpx's 5 s, Node's 5 s,
  aiohttp's 15 s and requests' never-reuse-after-close, so the client always closes first.
- **Headers have a deadline.** uvicorn never times out a request whose headers stop half-way, so
  a few hundred half-sent requests hold sockets and memory for ever; :func:`deadline_protocol`
  answers ``408`` and closes such a connection ``header_timeout`` seconds after the request (or the
  connection) began, as the replay's ``--body-timeout`` does for bodies.
- **Quiet by default**: no access-log line per request (a trainer's 256 rollouts wrote thousands).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # asyncio and uvicorn are imported when a server runs: `serve --stdio` reads only defaults
    import asyncio
    import socket

    import uvicorn

__all__ = [
    "DEFAULT_HEADER_TIMEOUT",
    "DEFAULT_KEEP_ALIVE",
    "LOG_LEVELS",
    "HttpOptions",
    "deadline_protocol",
    "uvicorn_server",
]

DEFAULT_KEEP_ALIVE = 75.0
"""Seconds an idle kept-alive connection stays open: past every common client's keep-alive expiry."""
DEFAULT_HEADER_TIMEOUT = 30.0
"""Seconds a client has to send a request's headers (from its first byte, or the connection's start)."""
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
"""uvicorn's log levels (``--log-level``)."""

_TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)


@dataclass(frozen=True, slots=True)
class HttpOptions:
    """How an HTTP server of replay-sim treats connections and what it logs.

    Attributes:
        keep_alive: Seconds an idle connection is kept open between requests.
        header_timeout: Seconds a client has to send a request's headers (None: no limit).
        log_level: uvicorn's log level (``warning``: start-up problems and errors only).
        access_log: One log line per request (stdout).
    """

    keep_alive: float = DEFAULT_KEEP_ALIVE
    header_timeout: float | None = DEFAULT_HEADER_TIMEOUT
    log_level: str = "warning"
    access_log: bool = False


def deadline_protocol(header_timeout: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol, closing a connection whose request headers take over ``header_timeout`` s.

    The deadline runs from the connection's start, and again from the first byte after each
    answered request; a request whose headers are complete is the app's (the replay's
    ``--body-timeout`` bounds its body). The client gets ``408`` and the connection is closed.
    """
    import asyncio

    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    message = f"request headers not received within {header_timeout:g} s".encode()
    answer = _TIMED_OUT % (len(message), message)

    class HeaderDeadline(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
        """uvicorn's protocol (httptools or h11) with a deadline on request headers."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._waiting_since: float | None = None  # when the unfinished headers began
            self._timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self._waiting_since = time.monotonic()
            self._arm(header_timeout)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                self._waiting_since = None  # headers complete: the request is the app's
            elif self._waiting_since is None and data:
                self._waiting_since = time.monotonic()  # a new request has begun
                if self._timer is None:
                    self._arm(header_timeout)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            super().connection_lost(exc)

        def _arm(self, delay: float) -> None:
            self._timer = asyncio.get_running_loop().call_later(delay, self._expire)

        def _expire(self) -> None:
            self._timer = None
            if self._waiting_since is None or self.transport.is_closing():
                return
            left = self._waiting_since + header_timeout - time.monotonic()
            if left > 0:  # a later request's headers began after this timer was set
                self._arm(left)
                return
            self.transport.write(answer)
            self.transport.close()

    return HeaderDeadline


def uvicorn_server(
    app: Any,
    options: HttpOptions,
    *,
    lifespan: str = "auto",
    on_started: Callable[[], None] | None = None,
    on_settled: Callable[[], None] | None = None,
) -> uvicorn.Server:
    """A uvicorn server for ``app`` run as :class:`HttpOptions` say; call its ``serve(sockets=[sock])``.

    Args:
        app: The ASGI app.
        options: Keep-alive, header deadline and logging.
        lifespan: uvicorn's lifespan mode (``on``: the app's lifespan must start).
        on_started: Called (in the server's event loop) once the app's lifespan has started and
            the sockets accept connections.
        on_settled: Called once start-up has finished, whether it succeeded or not.
    """
    import uvicorn

    config = uvicorn.Config(
        app,
        log_level=options.log_level,
        access_log=options.access_log,
        timeout_keep_alive=options.keep_alive,  # type: ignore[arg-type]  # any number of seconds
        lifespan=lifespan,  # type: ignore[arg-type]
        http=deadline_protocol(options.header_timeout) if options.header_timeout is not None else "auto",
    )

    import contextlib
    import signal
    import threading
    from collections.abc import Iterator

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            # SIGHUP (a closed terminal, a supervisor's reload) shuts down as SIGTERM does: the
            # lifespan's end runs (what is queued is written) before the signal's default action.
            with super().capture_signals():
                if threading.current_thread() is not threading.main_thread():
                    yield
                    return
                previous = signal.signal(signal.SIGHUP, self.handle_exit)
                try:
                    yield
                finally:
                    signal.signal(signal.SIGHUP, previous)

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            try:
                await super().startup(sockets)
                if self.started and on_started is not None:
                    on_started()
            finally:
                if on_settled is not None:
                    on_settled()

    return Server(config)
