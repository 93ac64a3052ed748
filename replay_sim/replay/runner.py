"""Running the replay app: uvicorn on a socket bound first, until interrupted."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from replay_sim.listener import base_url, listen
from replay_sim.replay.admission import Limits
from replay_sim.replay.app import create_app
from replay_sim.replay.replay import Replay

__all__ = ["serve"]


def serve(
    replay: Replay,
    host: str = "127.0.0.1",
    port: int = 8765,
    *,
    log_level: str = "info",
    on_ready: Callable[[str], None] | None = None,
    allowed_hosts: Iterable[str] = (),
    token: str | None = None,
    limits: Limits | None = None,
) -> None:
    """Serve the replay app with uvicorn until interrupted.

    Args:
        replay: The replay servers.
        host: Interface to bind.
        port: TCP port (0 picks a free one).
        log_level: uvicorn's log level.
        on_ready: Called with the base URL (the real port) once the socket listens.
        allowed_hosts: More names clients reach the server by (see :func:`create_app`).
        token: The admin API's bearer token (required beyond loopback).
        limits: Sessions, concurrency and body read time.

    Raises:
        ConfigError: The address cannot be bound, or it is beyond loopback and there is no token.
    """
    import uvicorn

    app = create_app(
        replay, host=host, freeze_gc=True, allowed_hosts=allowed_hosts, token=token, limits=limits
    )
    sock = listen(host, port)
    if on_ready is not None:
        on_ready(base_url(sock))
    with sock:
        uvicorn.Server(uvicorn.Config(app, log_level=log_level)).run(sockets=[sock])
