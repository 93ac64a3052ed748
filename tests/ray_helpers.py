"""What the Ray Serve tests share: the 2026-07-28 era's request headers and envelope, a local deployment."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from replay_sim.scale.deploy import ScaleSettings

MODERN = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "MCP-Protocol-Version": "2026-07-28",
}
"""The headers of a 2026-07-28 era request."""
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"},
    "io.modelcontextprotocol/clientCapabilities": {},
}
"""The ``_meta`` envelope of a 2026-07-28 era request."""


def free_port() -> int:
    """A port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def deployed_on_ray(settings: ScaleSettings) -> Iterator[str]:
    """``settings``' app on a local Ray with 2 CPUs, Serve's proxy on a free port; yields the base URL.

    Ray is imported here, by tests that skipped already where it is not installed.
    """
    import ray
    from ray import serve

    from replay_sim.scale.deploy import APP_NAME, build_app

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(settings), name=APP_NAME)
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()
