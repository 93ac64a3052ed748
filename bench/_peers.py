"""The other MCP replayers, measured beside replay-sim in the same runs (issue 22's peers).

The peers live in their own throw-away virtualenv, never replay-sim's (they pin other MCP SDKs);
``REPLAY_SIM_PEERS_VENV`` names it (default ``/tmp/peers-venv``). Make it with Python >= 3.12
(mcp-cassette needs it), pinning starlette below 1.0 (mcp-recorder 0.5.0 passes ``on_startup``,
which Starlette 1.0 removed)::

    python3.12 -m venv /tmp/peers-venv
    /tmp/peers-venv/bin/pip install mcp-rec==0.1.1 mcp-cassette==0.4.0 mcp-recorder==0.5.0 starlette==0.52.1

Without it the benches skip the peers, saying so in one line. Each peer records the same bare SDK
server the benches use as their baseline, through its own recorder, and then replays that recording:

- ``mcp-rec``: ``mcp-rec record -o FILE -- CMD`` (a stdio pass-through writing JSONL), ``mcp-rec
  replay FILE`` (stdio only; each recorded answer is served once, so a recording holds as many
  copies of a call as it will be asked);
- ``mcp-cassette``: ``mcp-cassette record --cassette FILE -- CMD`` and ``mcp-cassette serve FILE``
  over stdio; over HTTP it records through ``--url`` and serves on ``--port 0``, printing its URL;
- ``mcp-recorder``: ``mcp-recorder record --target-stdio CMD --port P`` (an HTTP proxy in front
  of a stdio server), ``mcp-recorder replay --cassette FILE --port P`` (HTTP only).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import anyio

PEERS_VENV = Path(os.environ.get("REPLAY_SIM_PEERS_VENV", "/tmp/peers-venv"))
PIP_LINE = "pip install mcp-rec==0.1.1 mcp-cassette==0.4.0 mcp-recorder==0.5.0 starlette==0.52.1"
PEER_ENV = {**os.environ, "MCP_REC_NO_NOTICE": "1"}
"""The environment every peer runs in (mcp-rec prints an advertisement on its first run otherwise)."""


def peers_bin() -> Path | None:
    """The peers' ``bin`` directory, or None (after one line saying so) when they are not installed."""
    found = PEERS_VENV / "bin"
    if all((found / name).exists() for name in ("mcp-rec", "mcp-cassette", "mcp-recorder")):
        return found
    print(f"   peers skipped: no {PEERS_VENV} (REPLAY_SIM_PEERS_VENV) with them: {PIP_LINE}", flush=True)
    return None


def write_script(directory: Path, name: str, source: str) -> Path:
    """``source`` saved as ``directory/name`` (recorders take a command line, not ``-c`` code)."""
    path = directory / name
    path.write_text(source)
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 free a moment ago (for the peers that cannot take ``--port 0``)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_listening(url: str, deadline: float) -> None:
    """Return once something accepts TCP connections where ``url`` points (peers print their URL
    before they listen).

    Raises:
        TimeoutError: Nothing listened there by ``deadline`` (a ``time.monotonic()`` value).
    """
    where = urlsplit(url)
    while True:
        try:
            socket.create_connection((where.hostname, where.port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listened at {url} in time") from None
            time.sleep(0.005)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGINT ``process`` and wait for it to exit (mcp-recorder saves its cassette on SIGINT only:
    on SIGTERM uvicorn re-raises the signal before the save runs)."""
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def record_http(command: list[str], url: str, call: object) -> None:
    """Run recorder ``command`` listening at ``url``, make one call through it, then stop it.

    Args:
        command: The recorder's command line (it listens at ``url``).
        url: Where to call it.
        call: An async function of (url, deadline) making the client's exchange (it retries until
            the recorder listens).
    """
    process = subprocess.Popen(command, env=PEER_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(url, time.monotonic() + 60)
        anyio.run(call, url, time.monotonic() + 60)  # type: ignore[arg-type]
    finally:
        stop(process)
