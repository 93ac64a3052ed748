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
- **Descriptors bounded below the process's limit.** Every connection holds a file descriptor;
  past ``RLIMIT_NOFILE`` (``ulimit -n``) ``accept()`` fails, asyncio stops accepting for a while
  and everything else that opens a file (the store, a sandbox's pipes) fails with it: a thousand
  half-sent requests took the server down until their deadline. :func:`connection_budget` keeps
  open connections below the limit, with room for the files the server itself opens; a connection
  past the bound is answered ``503`` with ``Retry-After`` and closed at once, so the server stays up
  and answers again as soon as connections end. asyncio accepts up to ``backlog`` connections at a
  time before any is seen (its ``backlog``), so that batch is kept small enough to fit in the room
  left (the kernel's queue of connections waiting to be accepted stays 2048 long).
- **Quiet by default**: no access-log line per request (a trainer's 256 rollouts wrote thousands).
"""

from __future__ import annotations

import os
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
    "connection_budget",
    "deadline_protocol",
    "uvicorn_server",
]

DEFAULT_KEEP_ALIVE = 75.0
"""Seconds an idle kept-alive connection stays open: past every common client's keep-alive expiry."""
DEFAULT_HEADER_TIMEOUT = 30.0
"""Seconds a client has to send a request's headers (from its first byte, or the connection's start)."""
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
"""uvicorn's log levels (``--log-level``)."""

_MAX_BATCH = 2048  # uvicorn's default backlog: how many connections asyncio accepts at a time
_FULL = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"retry-after: 1\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
)
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
        max_connections: Open connections at most; past it a new one gets ``503`` and is closed
            (None: as many as the process's descriptor limit leaves room for,
            :func:`connection_budget`).
    """

    keep_alive: float = DEFAULT_KEEP_ALIVE
    header_timeout: float | None = DEFAULT_HEADER_TIMEOUT
    log_level: str = "warning"
    access_log: bool = False
    max_connections: int | None = None


def _open_descriptors() -> int:
    """File descriptors this process holds now (an estimate where ``/proc`` is not there)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder))
        except OSError:
            continue
    return 64


def connection_budget(max_connections: int | None = None) -> tuple[int, int]:
    """How many connections the server keeps open at most, and how many asyncio accepts at a time.

    The bound leaves room below ``RLIMIT_NOFILE``'s soft limit for what the process holds already,
    for the connections accepted in one go before any of them is seen (a few batches), and for
    the files the server opens while it serves (store connections, pipes, logs).

    Args:
        max_connections: A bound asked for (None: derived from the descriptor limit); never above
            what the limit leaves room for.

    Returns:
        ``(bound, batch)``: open connections at most, and the listen backlog (the accept batch).
    """
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # no such limit here (Windows)
        soft = -1
    if soft < 0 or soft >= 1 << 24:  # RLIM_INFINITY or as good as
        soft = 1 << 20
    headroom = soft - _open_descriptors()
    batch = max(16, min(_MAX_BATCH, headroom // 16))
    room = max(1, headroom - 4 * batch - 64)
    return (room if max_connections is None else max(1, min(max_connections, room))), batch


def deadline_protocol(
    header_timeout: float | None, max_connections: int | None = None
) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol, with a deadline on request headers and a bound on open connections.

    The deadline runs from the connection's start, and again from the first byte after each
    answered request; a request whose headers are complete is the app's (the replay's
    ``--body-timeout`` bounds its body). The client gets ``408`` and the connection is closed.
    A connection made while ``max_connections`` are open gets ``503`` and is closed at once.

    Args:
        header_timeout: Seconds a request's headers may take (None: no deadline).
        max_connections: Open connections at most (None: no bound).
    """
    import asyncio

    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    message = f"request headers not received within {header_timeout or 0:g} s".encode()
    answer = _TIMED_OUT % (len(message), message)
    full = f"too many open connections (the server keeps at most {max_connections}); retry".encode()
    refusal = _FULL % (len(full), full)

    class HeaderDeadline(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
        """uvicorn's protocol (httptools or h11) with a deadline on request headers, bounded in number."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._waiting_since: float | None = None  # when the unfinished headers began
            self._timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            over = max_connections is not None and len(self.server_state.connections) >= max_connections
            super().connection_made(transport)
            if over:  # answered and closed at once: its descriptor is free again
                transport.write(refusal)  # type: ignore[attr-defined]
                transport.close()
                return
            if header_timeout is not None:
                self._waiting_since = time.monotonic()
                self._arm(header_timeout)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                self._waiting_since = None  # headers complete: the request is the app's
            elif self._waiting_since is None and data and header_timeout is not None:
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
            if self._waiting_since is None or header_timeout is None or self.transport.is_closing():
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

    bound, batch = connection_budget(options.max_connections)
    config = uvicorn.Config(
        app,
        log_level=options.log_level,
        access_log=options.access_log,
        timeout_keep_alive=options.keep_alive,  # type: ignore[arg-type]  # any number of seconds
        lifespan=lifespan,  # type: ignore[arg-type]
        http=deadline_protocol(options.header_timeout, bound),
        backlog=batch,
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
                for sock in sockets or ():
                    # asyncio listened with the small accept batch: the kernel's queue may stay long.
                    sock.listen(_MAX_BATCH)
                if self.started and on_started is not None:
                    on_started()
            finally:
                if on_settled is not None:
                    on_settled()

    return Server(config)
