"""Running the replay app: uvicorn on a socket bound first, until interrupted."""

from __future__ import annotations

from collections.abc import Callable

from replay_sim.listener import base_url, listen
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
) -> None:
    """Serve the replay app with uvicorn until interrupted.

    Args:
        replay: The replay servers.
        host: Interface to bind.
        port: TCP port (0 picks a free one).
        log_level: uvicorn's log level.
        on_ready: Called with the base URL (the real port) once the socket listens.

    Raises:
        ConfigError: The address cannot be bound.
    """
    import uvicorn

    sock = listen(host, port)
    if on_ready is not None:
        on_ready(base_url(sock))
    with sock:
        app = create_app(replay, host=host, freeze_gc=True)
        uvicorn.Server(uvicorn.Config(app, log_level=log_level)).run(sockets=[sock])
