"""Listening sockets and Host checks for the HTTP servers (recorder and replay), and serving in a thread.

Binding first means the URL — including a port the OS picked for ``--port 0`` — is known and
printed before serving starts; clients that connect early wait in the listen backlog.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp

from replay_sim.errors import ConfigError

__all__ = ["base_url", "listen", "serving_in_thread", "transport_security"]

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` and listening.

    Raises:
        ConfigError: The address cannot be bound (in use, not local, no permission).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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


def transport_security(host: str) -> TransportSecuritySettings | None:
    """DNS-rebinding protection for a loopback bind (the SDK's default); none for other binds.

    On loopback, requests whose Host or Origin header is not a loopback name get 421/403, so a web
    page cannot reach the local endpoint through a rebound DNS name.
    """
    if host not in _LOOPBACK:
        return None
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.1", "localhost"],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
    )


@contextlib.contextmanager
def serving_in_thread(
    app: ASGIApp, host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning", timeout: float = 60.0
) -> Iterator[str]:
    """Serve an ASGI app with uvicorn in a background thread while the ``with`` block runs.

    The socket is bound with :func:`listen` first, so ``port=0`` gets a free port from the OS
    without a race; the block starts once the app's lifespan has started, and leaving it stops the
    server (lifespan shutdown included).

    Args:
        app: The ASGI app (for example :func:`replay_sim.replay.app.create_app`'s).
        host: Interface to bind.
        port: TCP port (0 picks a free one).
        log_level: uvicorn's log level.
        timeout: Seconds the app may take to start.

    Yields:
        The base URL, ``http://host:port`` with the real port.

    Raises:
        ConfigError: The address cannot be bound, or the app did not start within ``timeout``.
    """
    import uvicorn

    settled = threading.Event()  # set once the server has started, or has given up starting

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            try:
                await super().startup(sockets)
            finally:
                settled.set()

    sock = listen(host, port)
    url = base_url(sock)
    server = Server(uvicorn.Config(app, log_level=log_level, lifespan="on"))

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
            yield url
        finally:
            server.should_exit = True
            thread.join(timeout=30)
