"""Listening sockets, Host/Origin checks and serving in a thread, for the HTTP servers (recorder and replay).

Binding first means the URL — including a port the OS picked for ``--port 0`` — is known and
printed before serving starts; clients that connect early wait in the listen backlog.

DNS-rebinding protection (:class:`HostCheck`, applied to every request by :class:`HostGuard`) is on
whatever the interface: a web page can reach a server only through a name that resolves to it, and
it then sends that name as ``Host``. So ``Host`` must be an IP address literal (no page can rebind
one), ``localhost``, the machine's name when bound to every interface, the name bound to, or a
name allowed explicitly; ``Origin``, when sent, must be the request's own host, a loopback one or
an allowed name.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import threading
from collections.abc import Iterable, Iterator
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from replay_sim.errors import ConfigError
from replay_sim.httpserver import HttpOptions, uvicorn_server

__all__ = ["HostCheck", "HostGuard", "base_url", "is_loopback", "listen", "serving_in_thread"]

ANY_HOST = "*"
"""An allowed host that turns the Host/Origin checks off (behind a proxy that checks them itself)."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an interface or a Host header's name) is a loopback address or ``localhost``."""
    name = host.strip("[]").lower()
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return name == "localhost"


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


def _hostname(host: str) -> str:
    """The name in a Host header value (``name``, ``name:port``, ``[v6]:port``), lower-cased."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    name, _, _ = host.partition(":") if host.count(":") == 1 else (host, "", "")
    return name


class HostCheck:
    """Which ``Host`` and ``Origin`` headers a server bound to ``bound`` accepts (DNS-rebinding protection).

    Args:
        bound: The interface the server is bound to; every interface (``0.0.0.0``, ``::``) adds the
            machine's host name, a specific name adds that name.
        allowed: More names clients use to reach the server (``name`` for any port, or
            ``name:port``); ``*`` accepts every Host and Origin (checks off).
    """

    def __init__(self, bound: str = "127.0.0.1", allowed: Iterable[str] = ()) -> None:
        extra = [a.strip().lower() for a in allowed if a.strip()]
        self.off = ANY_HOST in extra
        names = {"localhost", *(a for a in extra if a != ANY_HOST)}
        if bound.strip("[]") in ("0.0.0.0", "::", ""):
            names.add(socket.gethostname().lower())
        elif not _is_ip(bound):
            names.add(bound.lower())
        self.names = frozenset(names)
        self._seen: dict[str, bool] = {}  # verdicts on the few Host values clients send

    def host_ok(self, host: str | None) -> bool:
        """Whether a request with this ``Host`` header is answered."""
        if self.off:
            return True
        if not host:
            return False
        verdict = self._seen.get(host)
        if verdict is None:
            value = host.strip().lower()
            name = _hostname(value)
            verdict = value in self.names or name in self.names or _is_ip(name)
            if len(self._seen) < 1024:  # bounded: any client may send any Host
                self._seen[host] = verdict
        return verdict

    def origin_ok(self, origin: str | None, host: str | None) -> bool:
        """Whether a request from a page at ``origin`` (None: not sent) to ``host`` is answered."""
        if self.off or origin is None:
            return True
        parts = urlsplit(origin.strip())
        if host and parts.netloc.lower() == host.strip().lower():
            return True  # same origin: a page this server served, through a Host already accepted
        name = (parts.hostname or "").lower()
        return bool(name) and (is_loopback(name) or name in self.names or parts.netloc.lower() in self.names)

    def describe(self) -> str:
        """The accepted hosts, for the start-up message."""
        if self.off:
            return "any Host (--allowed-host '*': DNS-rebinding protection is off)"
        return "IP addresses, " + ", ".join(sorted(self.names))


class HostGuard:
    """ASGI middleware refusing requests whose ``Host`` (421) or ``Origin`` (403) :class:`HostCheck` refuses.

    Args:
        app: The app to guard (every HTTP and WebSocket request; the lifespan passes through).
        check: Which hosts and origins are accepted.
    """

    def __init__(self, app: ASGIApp, check: HostCheck) -> None:
        self.app = app
        self.check = check

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.check.off:
            await self.app(scope, receive, send)
            return
        host = origin = None
        for key, value in scope["headers"]:
            if key == b"host":
                host = value.decode("latin-1")
            elif key == b"origin":
                origin = value.decode("latin-1")
        if not self.check.host_ok(host):
            status, problem = 421, f"Host {host!r} is not accepted (DNS-rebinding protection)"
        elif not self.check.origin_ok(origin, host):
            status, problem = 403, f"Origin {origin!r} is not accepted (DNS-rebinding protection)"
        else:
            await self.app(scope, receive, send)
            return
        hint = f"{problem}; a server reached by another name needs --allowed-host NAME"
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        if "/mcp" in scope.get("path", ""):
            body: object = {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": hint}}
        else:
            body = {"detail": hint}
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": json.dumps(body).encode()})


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening.

    Raises:
        ConfigError: The address cannot be bound (in use, not local, no permission).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # Naming TCP matters: asyncio sets TCP_NODELAY on an accepted connection only when the socket
    # says it is TCP (proto), and accepted sockets inherit the listener's proto. Without it every
    # kept-alive answer waits ~40 ms for the client's delayed ACK (Nagle). The listener's own
    # TCP_NODELAY is inherited by accepted connections on Linux too.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.listen(2048)
    return sock


def base_url(sock: socket.socket) -> str:
    """``http://host:port`` of a bound socket (IPv6 hosts in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@contextlib.contextmanager
def serving_in_thread(
    app: ASGIApp,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    options: HttpOptions | None = None,
    timeout: float = 60.0,
    wait_ready: bool = True,
    ready_timeout: float = 600.0,
) -> Iterator[str]:
    """Serve an ASGI app with uvicorn in a background thread while the ``with`` block runs.

    The socket is bound with :func:`listen` first, so ``port=0`` gets a free port from the OS
    without a race; the block starts once the app's lifespan has started — and, for an app that
    says when it is ready (a ``readiness`` attribute with ``wait(timeout)`` and ``problems()``,
    as the replay app has), once it is ready — and leaving it stops the server (lifespan shutdown
    included).

    Args:
        app: The ASGI app (for example :func:`replay_sim.replay.http.app.create_app`'s).
        host: Interface to bind.
        port: TCP port (0 picks a free one).
        options: Keep-alive, header deadline and logging (default: :class:`HttpOptions`' defaults).
        timeout: Seconds the app may take to start.
        wait_ready: Wait for the app to be ready, too (when it says).
        ready_timeout: Seconds it may take to be ready.

    Yields:
        The base URL, ``http://host:port`` with the real port.

    Raises:
        ConfigError: The address cannot be bound, or the app did not start within ``timeout``
            (or was not ready within ``ready_timeout``).
    """
    settled = threading.Event()  # set once the server has started, or has given up starting
    sock = listen(host, port)
    url = base_url(sock)
    server = uvicorn_server(app, options or HttpOptions(), lifespan="on", on_settled=settled.set)

    def run() -> None:
        try:
            server.run(sockets=[sock])
        finally:
            settled.set()

    thread = threading.Thread(target=run, name=f"uvicorn {url}", daemon=True)
    with sock:
        thread.start()
        try:
            if not settled.wait(timeout) or not server.started:
                raise ConfigError(f"the app at {url} did not start within {timeout:g}s (see the log above)")
            readiness = getattr(app, "readiness", None) if wait_ready else None
            if readiness is not None and not readiness.wait(ready_timeout):
                problems = "; ".join(readiness.problems())
                raise ConfigError(
                    f"the app at {url} was not ready within {ready_timeout:g} s: {problems} "
                    "(wait_ready=False starts serving without waiting)"
                )
            yield url
        finally:
            server.should_exit = True
            thread.join(timeout=30)
