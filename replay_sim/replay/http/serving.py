"""Serving a replay inside a trainer's own process: a base URL, episodes handed out, a clean stop.

::

    async with replay_sim.serving(snapshot="snapshots/v1") as sim:   # or: with replay_sim.serving(...)
        episode = sim.episode(seed=7)
        config = episode.mcp_servers_json()  # {"mcpServers": {name: {"url": ..., "transport": "http"}}}
        ...                                           # the agent talks MCP to episode.url("git")
        print(episode.stats())                        # calls by tier, misses, faults, diverged, seed
        episode.close()

The HTTP server (the same app as ``replay-sim serve``) runs in a background thread on a port of
its own (``port=0``: one the OS picks), so it serves an async trainer's event loop and a
synchronous trainer alike; leaving the block stops it and closes the store. Episode handles act on
the replay directly — no HTTP round trip — and are safe to use from any thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import anyio.to_thread

from replay_sim.httpserver import DEFAULT_KEEP_ALIVE, HttpOptions
from replay_sim.listener import serving_in_thread
from replay_sim.protocol import episode_path
from replay_sim.redaction import Redactor
from replay_sim.replay.core.episodes import Episode
from replay_sim.replay.core.replay import Replay
from replay_sim.replay.factory import open_replay
from replay_sim.replay.http.app import create_app
from replay_sim.replay.options import (
    DEFAULT_EPISODE_IDLE_TIMEOUT,
    DEFAULT_MAX_EPISODES,
    DEFAULT_SANDBOX_CALL_LIMIT,
    DEFAULT_SANDBOX_IDLE,
    Limits,
    MissDetail,
    MissPolicyName,
)
from replay_sim.replay.policies.instances import SandboxPool
from replay_sim.replay.policies.miss import Forward
from replay_sim.replay.shaping.faults import Faults, Latency
from replay_sim.resolve.calibration import MatchConfig

__all__ = ["EpisodeHandle", "ReplayServer", "Serving", "serving"]


class EpisodeHandle:
    """One episode of a served replay: its URLs, its config for agent frameworks, its stats.

    Usable as a context manager (``with sim.episode() as episode:``) that ends it on the way out.

    Attributes:
        id: The episode id.
        seed: Its seed (draws its faults).
    """

    def __init__(self, server: ReplayServer, episode: Episode) -> None:
        self._server = server
        self.id = episode.id
        self.seed = episode.seed

    def url(self, server: str) -> str:
        """The episode's endpoint on one recorded server: ``<base>/episodes/<id>/mcp/<server>``.

        Raises:
            KeyError: No recorded server of that name is served.
        """
        if server not in self._server.servers:
            raise KeyError(f"no recorded server {server!r}; serving: {', '.join(self._server.servers)}")
        return self._server.url + episode_path(self.id, server)

    @property
    def urls(self) -> dict[str, str]:
        """The episode's endpoint on every recorded server, by server name."""
        return {name: self.url(name) for name in self._server.servers}

    def mcp_servers_json(self, transport: str = "http") -> dict[str, Any]:
        """The episode's servers in the ``mcpServers`` shape agent frameworks take.

        ``{"mcpServers": {name: {"url": <episode URL>, "transport": "http"}}}`` is what fastmcp's
        ``Client`` and verl's ``mcp_servers_config_path`` file take; its inner mapping is what
        LangChain's ``MultiServerMCPClient`` takes (it accepts ``"http"`` too).

        Args:
            transport: The transport name written for each server (fastmcp: ``http`` or
                ``streamable-http``; LangChain: ``http``, ``streamable_http`` or ``streamable-http``).
        """
        return {"mcpServers": {name: {"url": url, "transport": transport} for name, url in self.urls.items()}}

    def stats(self) -> dict[str, Any]:
        """What the episode was answered (as ``GET /api/episodes/<id>``): calls by tier, misses,
        faults, whether it diverged, its seed.

        Raises:
            KeyError: The episode is no longer live (closed, or expired when idle).
        """
        episodes = self._server.replay.episodes
        live = episodes.get(self.id)
        if live is None:
            raise KeyError(f"episode {self.id!r} is no longer live (closed, or expired when idle)")
        return {**episodes.summary(live), "urls": self.urls}

    def close(self) -> dict[str, Any] | None:
        """End the episode and free its state; returns its last summary (None if it was not live)."""
        episodes = self._server.replay.episodes
        ended = episodes.end(self.id)
        return None if ended is None else episodes.summary(ended)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EpisodeHandle(id={self.id!r}, seed={self.seed})"


class ReplayServer:
    """A replay served over HTTP in this process (what :func:`serving` yields).

    Attributes:
        url: The base URL (``http://127.0.0.1:<port>``); ``/mcp/<server>``, ``/episodes/<id>/mcp/<server>``,
            ``/api``, ``/docs`` and ``/metrics`` hang off it.
        replay: The replay served (its store, resolver, episodes and metrics).
        servers: The recorded servers served, by name.
    """

    def __init__(self, url: str, replay: Replay) -> None:
        self.url = url
        self.replay = replay
        self.servers = replay.names()

    def endpoint(self, server: str) -> str:
        """A server's endpoint with no episode: history per MCP session (handshake era) or none."""
        return f"{self.url}/mcp/{server}"

    def episode(
        self, id: str | None = None, *, seed: int | None = None, metadata: Any = None
    ) -> EpisodeHandle:
        """Start an episode (as ``POST /api/episodes``).

        Args:
            id: Its id (default: a new one); see :data:`~replay_sim.protocol.EPISODE_ID_GRAMMAR`.
            seed: Its seed (default: drawn from its id), which draws its faults.
            metadata: JSON kept with it (at most 16 KiB).

        Raises:
            EpisodeError: A malformed or live id, bad metadata, or the cap of live episodes reached.
        """
        return EpisodeHandle(self, self.replay.episodes.create(id, seed, metadata))

    def stats(self) -> dict[str, Any]:
        """Calls per server, tool and tier (as ``GET /api/stats``' ``calls``), faults, live episodes."""
        return {
            "calls": self.replay.metrics.stats(),
            "faults": self.replay.metrics.faults(),
            "episodes": len(self.replay.episodes),
        }

    def __repr__(self) -> str:
        return f"ReplayServer(url={self.url!r}, servers={self.servers})"


class Serving:
    """The context manager :func:`serving` returns: ``with`` and ``async with`` alike."""

    def __init__(
        self,
        start: Callable[[], Replay],
        host: str,
        port: int,
        options: dict[str, Any],
        http: HttpOptions,
        ready_timeout: float | None,
    ) -> None:
        self._start = start
        self._host = host
        self._port = port
        self._options = options
        self._http = http
        self._ready_timeout = ready_timeout
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> ReplayServer:
        if self._stack is not None:
            raise RuntimeError("this replay is being served already: call replay_sim.serving(...) again")
        with contextlib.ExitStack() as stack:
            replay = stack.enter_context(self._start())
            app = create_app(replay, host=self._host, **self._options)
            wait = self._ready_timeout
            served = serving_in_thread(
                app,
                self._host,
                self._port,
                options=self._http,
                wait_ready=wait is not None,
                ready_timeout=wait or 0.0,
            )
            url = stack.enter_context(served)
            self._stack = stack.pop_all()
        return ReplayServer(url, replay)

    def __exit__(self, *exc: object) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()  # the server stops (lifespan shutdown included), then the store closes

    async def __aenter__(self) -> ReplayServer:
        # Opening the store, loading the index and model, and starting take a while: not on the loop.
        return await anyio.to_thread.run_sync(self.__enter__)

    async def __aexit__(self, *exc: object) -> None:
        await anyio.to_thread.run_sync(self.__exit__)


def serving(
    db: str | Path | None = None,
    *,
    snapshot: str | Path | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    miss: str = MissPolicyName.ERROR,
    latency: Latency | str | None = None,
    faults: Faults | str | list[str] | None = None,
    max_episodes: int = DEFAULT_MAX_EPISODES,
    episode_idle_timeout: float | None = DEFAULT_EPISODE_IDLE_TIMEOUT,
    limits: Limits | None = None,
    token: str | None = None,
    miss_detail: str = MissDetail.FULL,
    keep_alive: float = DEFAULT_KEEP_ALIVE,
    log_level: str = "warning",
    access_log: bool = False,
    wait_ready: bool = True,
    ready_timeout: float = 600.0,
    redactor: Redactor | None = None,
    forward: Forward | None = None,
    sandboxes: SandboxPool | None = None,
    sandbox_timeout: float = 30.0,
    sandbox_idle: float | None = DEFAULT_SANDBOX_IDLE,
    sandbox_call_limit: float | None = DEFAULT_SANDBOX_CALL_LIMIT,
    llm_url: str | None = None,
    llm_model: str | None = None,
    llm_api_key: str | None = None,
    index_dir: str | Path | None = None,
    match_config: MatchConfig | None = None,
    min_confidence: float | None = None,
) -> Serving:
    """Serve a replay over HTTP in this process while a ``with`` or ``async with`` block runs.

    Args:
        db: The recording store (default ``cache/replay.db``; ignored with ``snapshot``).
        snapshot: A snapshot bundle (verified first; its id is cited and draws the faults).
        host: Interface to bind (loopback by default).
        port: TCP port (0, the default: one the OS picks; read it from ``sim.url``).
        miss: Miss policy (``error``, ``nearest``; see :func:`~replay_sim.replay.factory.open_replay`).
        latency: ``none`` (default), ``recorded``, ``fixed:MS`` or ``scale:F``.
        faults: Which tool calls fail on purpose: a :class:`~replay_sim.replay.shaping.faults.Faults`, or
            ``--faults`` values (``"0.05"``, ``"git/git_log=0.2:timeout,error"``, a TOML file).
        max_episodes: Live episodes at most; one more is refused, none evicted.
        episode_idle_timeout: Seconds after which an idle episode expires (None: never).
        limits: Every other bound (sessions, concurrency, body time); its episode bounds are
            ``max_episodes`` and ``episode_idle_timeout``.
        token: The admin API's bearer token (required beyond loopback).
        miss_detail: How much a miss tells the agent: ``full`` (default: the nearest recordings
            and the arguments in which they differ), ``reason`` (no argument values: nothing a
            policy in training can copy), ``none`` (only that no recording matches).
        keep_alive: Seconds an idle HTTP connection is kept open (past every common client's).
        log_level: uvicorn's log level.
        access_log: One log line per HTTP request (off: a trainer's rollouts make thousands).
        wait_ready: Enter the block only once the replay is ready — its index loaded, as
            ``GET /api/ready`` says (a tool's matching state and the embedding model are loaded
            by the first calls that need them). False: as soon as it listens (exact hits are
            answered at once; a call needing the index waits for it, at most ten seconds, then is
            told the replay is still starting).
        ready_timeout: Seconds ``wait_ready`` waits before failing.
        redactor: The redaction rules and secret values the recordings were made with, beyond the
            store's (see :func:`~replay_sim.replay.factory.open_replay`, as for the rest below).
        forward: How the ``live`` miss policy reaches the real servers.
        sandboxes: The record side's instance pool for the ``sandbox`` miss policy.
        sandbox_timeout: Seconds a call may wait for a sandbox instance.
        sandbox_idle: Seconds after which an idle episode's instance is given back (None: never).
        sandbox_call_limit: Seconds one call to a sandbox instance may take at most, progress or not.
        llm_url: OpenAI-compatible endpoint (miss policy ``synthesize``).
        llm_model: Model name for ``llm_url``.
        llm_api_key: Bearer token for ``llm_url``.
        index_dir: Where the vector index lives (a snapshot brings its own).
        match_config: Thresholds and per-tool overrides.
        min_confidence: The operating point: answers whose learned confidence is below it miss,
            candidates at or above it are served (None: the strict tiers decide).

    Returns:
        A context manager yielding a :class:`ReplayServer` (``sim.url``, ``sim.episode()``).

    Raises:
        ConfigError: Inconsistent options, the address cannot be bound, or the replay was not
            ready within ``ready_timeout``.
        SnapshotError: The snapshot is missing or tampered with.
        StoreError: The store does not exist or cannot be opened.
    """
    if isinstance(faults, str):
        faults = Faults.parse([faults])
    elif isinstance(faults, list):
        faults = Faults.parse(faults)
    if isinstance(latency, str):
        latency = Latency.parse(latency)
    bounds = dataclasses.replace(
        limits or Limits(), max_episodes=max_episodes, episode_idle_timeout=episode_idle_timeout
    )

    def start() -> Replay:
        return open_replay(
            db, snapshot=snapshot, miss=miss, latency=latency, faults=faults, miss_detail=miss_detail,
            redactor=redactor, forward=forward, sandboxes=sandboxes, sandbox_timeout=sandbox_timeout,
            sandbox_idle=sandbox_idle, sandbox_call_limit=sandbox_call_limit, llm_url=llm_url,
            llm_model=llm_model, llm_api_key=llm_api_key, index_dir=index_dir, match_config=match_config,
            min_confidence=min_confidence,
        )  # fmt: skip

    http = HttpOptions(
        keep_alive=keep_alive, header_timeout=bounds.body_timeout, log_level=log_level, access_log=access_log
    )
    wait = ready_timeout if wait_ready else None
    return Serving(start, host, port, {"limits": bounds, "token": token}, http, wait)
