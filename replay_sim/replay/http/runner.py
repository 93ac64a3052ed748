"""Running the replay app: uvicorn on a socket bound first, until interrupted; announced once ready."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from replay_sim.httpserver import HttpOptions, uvicorn_server
from replay_sim.listener import base_url, listen
from replay_sim.replay.core.replay import Replay
from replay_sim.replay.http.app import create_app
from replay_sim.replay.options import Limits

__all__ = ["serve"]


def serve(
    replay: Replay,
    host: str = "127.0.0.1",
    port: int = 8765,
    *,
    options: HttpOptions | None = None,
    on_listening: Callable[[str], None] | None = None,
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
        options: Keep-alive, header deadline and logging (default: :class:`HttpOptions`' defaults,
            with the limits' body timeout as the header deadline too).
        on_listening: Called with the base URL (the real port) once the socket is bound.
        on_ready: Called with the base URL once the server is ready: the endpoints run, the index
            is loaded (``/api/ready`` answers 200); from another thread.
        allowed_hosts: More names clients reach the server by (see :func:`create_app`).
        token: The admin API's bearer token (required beyond loopback).
        limits: Sessions, concurrency and body read time.

    Raises:
        ConfigError: The address cannot be bound, or it is beyond loopback and there is no token.
    """
    limits = limits or Limits()
    options = options or HttpOptions(header_timeout=limits.body_timeout)
    app = create_app(
        replay, host=host, freeze_gc=True, allowed_hosts=allowed_hosts, token=token, limits=limits
    )
    sock = listen(host, port)
    url = base_url(sock)
    if on_listening is not None:
        on_listening(url)

    def started() -> None:
        if on_ready is None or app.readiness is None:
            return
        readiness, announce = app.readiness, on_ready

        def announce_when_ready() -> None:
            readiness.wait()
            announce(url)

        threading.Thread(target=announce_when_ready, name="replay-sim ready", daemon=True).start()

    with sock:
        uvicorn_server(app, options, on_started=started).run(sockets=[sock])
