"""The Ray Serve application: N replay replicas of one frozen snapshot, each episode on one.

```
client ─► Serve HTTP proxy ──EpisodeRouter──► ReplayReplica x N ──(held elsewhere)──► its replica
                                                   │ first call of an episode
                                                   ▼
                                             EpisodeRegistry (1 replica)
```

Serve's proxy routes by URL and headers (:mod:`~replay_sim.scale.router`); each replica's ingress
is a :class:`~replay_sim.scale.gateway.Gateway` that reads the body (``_meta`` episodes), serves
what is its own and forwards the rest to the replica holding it.

:func:`build_app` builds it from :class:`ScaleSettings`; :func:`app_builder` is the same for a
``serve run`` config (``import_path: replay_sim.scale.deploy:app_builder``, ``args`` as the settings'
fields); :func:`run` starts (or joins) Ray, deploys and serves until interrupted, for
``replay-sim serve --ray``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, cast

import ray
from ray import serve
from ray.exceptions import RayActorError, RayError
from ray.serve.config import AutoscalingConfig
from ray.serve.deployment import Deployment
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.types import Message

from replay_sim.errors import ConfigError
from replay_sim.httpserver import DEFAULT_KEEP_ALIVE
from replay_sim.record.config import DEFAULT_SNAPSHOT_MB, DEFAULT_SNAPSHOTS
from replay_sim.record.instances import DEFAULT_MAX_INSTANCES, DEFAULT_POOL
from replay_sim.replay.options import (
    DEFAULT_SANDBOX_CALL_LIMIT,
    DEFAULT_SANDBOX_IDLE,
    Limits,
    MissDetail,
    MissPolicyName,
)
from replay_sim.resolve.runtime import configure_runtime
from replay_sim.resolve.snapshot import open_snapshot
from replay_sim.scale.gateway import DEFAULT_MAX_BODY, Gateway, ReplicaGone
from replay_sim.scale.registry import Holders
from replay_sim.scale.replica import ReplayReplica
from replay_sim.scale.router import live_replicas
from replay_sim.scale.wire import Envelope

__all__ = ["APP_NAME", "ScaleSettings", "app_builder", "build_app", "run"]

APP_NAME = "replay-sim"
"""The Serve application's name."""
ONE_LOOP = {
    "env_vars": {
        "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
        "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    }
}
"""Replicas run their code and their router (for forwarding) on the actor's own event loop: one
thread hop less per request (Ray Serve's documented latency settings)."""
ROUTER = "replay_sim.scale.router.EpisodeRouter"
"""The replica deployment's request router (imported by name in each process that calls it)."""


@dataclass(frozen=True)
class ScaleSettings:
    """How many replicas of which snapshot, and how they take load.

    Attributes:
        snapshot: The snapshot bundle; every node must hold the same bundle at this path.
        replicas: Replay replicas (the initial number when autoscaling).
        max_ongoing_requests: Requests one replica works on at once; more wait in the router
            for *that* replica (an episode never moves to a less busy one).
        autoscale_min: With ``autoscale_max``: Ray Serve autoscaling bounds (by ongoing requests).
        autoscale_max: See ``autoscale_min``.
        target_ongoing_requests: Autoscaling's target of ongoing requests per replica.
        replica_cpus: CPUs Ray reserves per replay replica.
        host: The interface Serve's HTTP proxy binds (also decides which Host headers are accepted).
        port: Its port.
        allowed_hosts: More Host names clients reach the replicas by (see ``serve --allowed-host``).
        token: The admin API's bearer token (required beyond loopback).
        miss: Miss policy: ``error``, ``nearest`` or ``sandbox`` (a snapshot is read-only: sandbox
            answers go to a side store next to each replica's bundle).
        config: The recorder config declaring the sandbox servers (``miss="sandbox"``); every
            replica builds its own instance pool from it and owns the instances of its episodes.
        sandbox_pool: Started instances kept ready per sandbox server, per replica.
        max_sandboxes: Live instances at most per replica.
        sandbox_timeout: Seconds a call may wait for an instance (``serve --sandbox-timeout``).
        sandbox_idle: Seconds without a call before an episode's instance is given back.
        sandbox_call_limit: Seconds one call to an instance may take at most.
        unconfined_sandboxes: Run instances without containment (``--unconfined-sandboxes``).
        sandbox_snapshots: State snapshots each replica's pool keeps at most (``--sandbox-snapshots``).
        sandbox_snapshot_mb: Their megabytes at most, per replica (``--sandbox-snapshot-mb``).
        miss_detail: How much a miss tells the client (``full``, ``reason``, ``none``).
        min_confidence: The operating point (``serve --min-confidence``; None: strict tiers).
        keep_alive: Seconds Serve's HTTP proxy keeps an idle connection open (past every common
            client's keep-alive; Serve's default is uvicorn's 5 s, httpx's very expiry).
        limits: Each replica's sessions, concurrency and body read time.
        max_body: The largest request body a replica accepts.
    """

    snapshot: str
    replicas: int = 2
    max_ongoing_requests: int = 256
    autoscale_min: int | None = None
    autoscale_max: int | None = None
    target_ongoing_requests: float = 64
    replica_cpus: float = 1
    host: str = "127.0.0.1"
    port: int = 8765
    allowed_hosts: tuple[str, ...] = ()
    token: str | None = None
    miss: str = MissPolicyName.ERROR.value
    miss_detail: str = MissDetail.FULL.value
    min_confidence: float | None = None
    keep_alive: float = DEFAULT_KEEP_ALIVE
    config: str | None = None
    sandbox_pool: int = DEFAULT_POOL
    max_sandboxes: int = DEFAULT_MAX_INSTANCES
    sandbox_timeout: float = 30.0
    sandbox_idle: float = DEFAULT_SANDBOX_IDLE
    sandbox_call_limit: float = DEFAULT_SANDBOX_CALL_LIMIT
    unconfined_sandboxes: bool = False
    sandbox_snapshots: int = DEFAULT_SNAPSHOTS
    sandbox_snapshot_mb: int = DEFAULT_SNAPSHOT_MB
    limits: Limits = field(default_factory=Limits)
    max_body: int = DEFAULT_MAX_BODY

    def check(self) -> None:
        """Refuse inconsistent settings.

        Raises:
            ConfigError: Naming the setting.
        """
        if self.replicas < 1:
            raise ConfigError("--replicas must be at least 1")
        if (self.autoscale_min is None) != (self.autoscale_max is None):
            raise ConfigError("give both --autoscale-min and --autoscale-max, or neither")
        low, high = self.autoscale_min, self.autoscale_max
        if low is not None and high is not None and not 0 < low <= self.replicas <= high:
            raise ConfigError(
                "autoscaling needs 1 <= --autoscale-min <= --replicas <= --autoscale-max, got "
                f"{low} <= {self.replicas} <= {high}"
            )
        if self.miss_detail not in tuple(MissDetail):
            raise ConfigError(f"unknown miss detail {self.miss_detail!r}: choose {', '.join(MissDetail)}")
        if self.miss == MissPolicyName.SANDBOX:
            if self.config is None:
                raise ConfigError(
                    "--miss sandbox needs --config FILE, the recorder config declaring sandboxes"
                )
        elif self.miss not in (MissPolicyName.ERROR, MissPolicyName.NEAREST):
            raise ConfigError(f"--miss {self.miss} records new answers; replicas serve a read-only snapshot")


@serve.ingress()
class _Replica:
    """The replica deployment: Serve's HTTP ingress and the replay, in one actor.

    Requests come from Serve's proxy (already routed by the URL and headers) or, forwarded, from
    another replica (:meth:`handle`). Its ASGI app is a :class:`Gateway` that serves locally what is
    this replica's and forwards the rest through a handle to the deployment itself.
    """

    async def __init__(  # type: ignore[misc]  # Serve awaits an async constructor
        self,
        snapshot: str,
        snapshot_id: str,
        app_options: dict[str, Any],
        registry: DeploymentHandle,
        max_body: int,
    ) -> None:
        configure_runtime()  # a replica is a process that exists to serve the replay
        me = serve.get_replica_context().replica_id
        self._me = me.unique_id
        self._max_body = max_body
        peers = serve.get_deployment_handle(me.deployment_id.name, me.deployment_id.app_name)
        self._peers = peers.options(stream=True)
        with contextlib.suppress(Exception):  # start its router now: the live replicas are known at once
            self._peers._init()

        async def claim(episode: str, replica: str) -> str:
            return str(await registry.claim.remote(episode, replica))

        self._replica, self._lifespan = await ReplayReplica.open(
            self._me, snapshot, snapshot_id, app_options, claim
        )

    def __serve_build_asgi_app__(self) -> Gateway:
        return Gateway(self._dispatch, live_replicas, replica=self._me, max_body=self._max_body)

    async def handle(self, envelope: Envelope) -> AsyncIterator[list[Message]]:
        """Answer a request another replica forwarded here."""
        async for batch in self._replica.handle(envelope):
            yield batch

    async def _dispatch(self, envelope: Envelope) -> AsyncIterator[list[Message]]:
        """Serve here what is not another replica's; forward the rest to its replica."""
        if envelope.target is None or envelope.target == self._me:
            async for batch in self._replica.handle(envelope):
                yield batch
            return
        stream = cast(DeploymentResponseGenerator[Any], self._peers.handle.remote(envelope))
        finished = False
        try:
            async for batch in stream:
                yield batch
            finished = True
        except RayError as error:
            if not _died(error):
                raise
            raise ReplicaGone(envelope.target) from error
        finally:
            if not finished:
                stream.cancel()

    def check_health(self) -> None:
        """Serve's health check: the replay app must still be running (else Serve replaces the replica)."""
        if not self._lifespan.running:
            raise RuntimeError("the replay app stopped")

    async def __del__(self) -> None:
        await self._lifespan.shutdown()


def build_app(settings: ScaleSettings) -> serve.Application:
    """The Serve application for ``settings`` (deploy it with ``serve.run``).

    Raises:
        ConfigError: Inconsistent settings.
        SnapshotError: The snapshot is missing or tampered with (checked here, then by every replica).
    """
    settings.check()
    snapshot = Path(settings.snapshot).resolve()
    snapshot_id = open_snapshot(snapshot).id
    autoscaling = None
    if settings.autoscale_min is not None and settings.autoscale_max is not None:
        autoscaling = AutoscalingConfig(
            min_replicas=settings.autoscale_min,
            initial_replicas=settings.replicas,
            max_replicas=settings.autoscale_max,
            target_ongoing_requests=settings.target_ongoing_requests,
        )
    app_options = {
        "miss": settings.miss,
        "miss_detail": settings.miss_detail,
        "min_confidence": settings.min_confidence,
        "sandboxes": None
        if settings.config is None
        else {
            "config": str(Path(settings.config).resolve()),
            "pool": {
                "pool": settings.sandbox_pool,
                "max_instances": settings.max_sandboxes,
                "unconfined": settings.unconfined_sandboxes,
                "snapshots": settings.sandbox_snapshots,
                "snapshot_mb": settings.sandbox_snapshot_mb,
            },
            "policy": {
                "sandbox_timeout": settings.sandbox_timeout,
                "sandbox_idle": settings.sandbox_idle,
                "sandbox_call_limit": settings.sandbox_call_limit,
            },
        },
        "host": settings.host,
        "allowed_hosts": tuple(settings.allowed_hosts),
        "token": settings.token,
        "limits": settings.limits,
    }
    quiet = {"enable_access_log": False, "log_level": "WARNING"}  # a log line per call costs CPU
    registry = _deployment(Holders).options(
        name="EpisodeRegistry",
        num_replicas=1,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=10_000,
        logging_config=quiet,
    )
    replicas = _deployment(_Replica).options(
        name="ReplayReplica",
        num_replicas=None if autoscaling else settings.replicas,
        autoscaling_config=autoscaling,
        max_ongoing_requests=settings.max_ongoing_requests,
        ray_actor_options={"num_cpus": settings.replica_cpus, "runtime_env": ONE_LOOP},
        request_router_config={"request_router_class": ROUTER},
        health_check_period_s=5,
        logging_config=quiet,
    )
    return replicas.bind(str(snapshot), snapshot_id, app_options, registry.bind(), settings.max_body)


def app_builder(args: dict[str, Any]) -> serve.Application:
    """Build the application from a ``serve run`` config's ``args`` (the :class:`ScaleSettings` fields).

    The admin token may come from ``REPLAY_SIM_TOKEN`` instead of ``args.token``.

    Raises:
        ConfigError: An unknown or missing argument.
    """
    known = {f.name for f in fields(ScaleSettings)}
    unknown = sorted(set(args) - known)
    if unknown:
        raise ConfigError(
            f"unknown replay-sim application args: {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    if "snapshot" not in args:
        raise ConfigError("the replay-sim application needs args.snapshot (a frozen snapshot bundle)")
    values = dict(args)
    if values.get("token") is None and os.environ.get("REPLAY_SIM_TOKEN"):
        values["token"] = os.environ["REPLAY_SIM_TOKEN"]
    if "limits" in values:
        values["limits"] = Limits(**values["limits"])
    if "allowed_hosts" in values:
        values["allowed_hosts"] = tuple(values["allowed_hosts"])
    return build_app(ScaleSettings(**values))


def run(
    settings: ScaleSettings,
    *,
    address: str | None = None,
    on_ready: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Deploy the application on Ray (a local one unless ``address``) and serve until interrupted.

    Args:
        settings: What to deploy.
        address: A running Ray cluster (``auto``, ``ray://…``, ``HOST:PORT``); None starts a local one.
        on_ready: Called with the base URL once every replica is up.
        stop: Set it to stop serving (else Ctrl-C or SIGTERM).
    """
    app = build_app(settings)  # refuse bad settings before starting Ray
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, logging_level=logging.WARNING, include_dashboard=False)
    stop = stop or threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        # Serve types keep_alive_timeout_s as int seconds: round up, never below the asked time.
        http = {"host": settings.host, "port": settings.port}
        serve.start(http_options={**http, "keep_alive_timeout_s": math.ceil(settings.keep_alive)})
        serve.run(app, name=APP_NAME, route_prefix="/")
        if on_ready is not None:
            on_ready(f"http://{_url_host(settings.host)}:{settings.port}")
        with contextlib.suppress(KeyboardInterrupt):
            while not stop.wait(1.0):
                pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        with contextlib.suppress(Exception):
            if started:  # the Ray started here goes, with Serve and the application
                serve.shutdown()
                ray.shutdown()
            else:  # a cluster that was there before stays: only the application goes
                serve.delete(APP_NAME)


def _died(error: BaseException) -> bool:
    """Whether a Ray error says the actor serving the call died or is unreachable (maybe wrapped)."""
    seen: BaseException | None = error
    for _ in range(8):  # a few wrappings deep (Ray task errors, Serve's own)
        if seen is None:
            return False
        if isinstance(seen, RayActorError):
            return True
        seen = getattr(seen, "cause", None) or seen.__cause__
    return False


def _deployment(cls: type) -> Deployment:
    """A Serve deployment of ``cls`` (options set by the caller)."""
    return cast(Deployment, serve.deployment(cls))


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def settings_dict(settings: ScaleSettings) -> dict[str, Any]:
    """The settings as ``serve run`` config ``args`` (JSON-ready)."""
    values = asdict(settings)
    values["allowed_hosts"] = list(settings.allowed_hosts)
    return values
