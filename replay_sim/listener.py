"""Listening sockets and Host checks for the HTTP servers (recorder and replay).

Binding first means the URL — including a port the OS picked for ``--port 0`` — is known and
printed before serving starts; clients that connect early wait in the listen backlog.
"""

from __future__ import annotations

import socket

from mcp.server.transport_security import TransportSecuritySettings

from replay_sim.errors import ConfigError

__all__ = ["base_url", "listen", "transport_security"]

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
