"""replay-sim: record real MCP servers, index the recordings, replay them offline.

The public API is listed in ``__all__``; the CLI (``replay-sim``) is a thin layer over it::

    from replay_sim import Store, Resolver, open_replay, create_app

    replay = open_replay("cache/replay.db")          # or snapshot="snapshots/v1"
    app = create_app(replay)                          # ASGI: /mcp/<server>, /api, /, /metrics

    with serving(snapshot="snapshots/v1") as sim:     # or `async with`: served in this process
        episode = sim.episode(seed=7)                 # episode.url("git"), .mcp_servers_json()

    serving("cache/replay.db", miss="sandbox", config="record.toml")  # misses answered by sandboxes
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replay_sim.errors import (
    ConfigError,
    EpisodeError,
    InterchangeError,
    ReplaySimError,
    SnapshotError,
    StoreError,
    UpstreamError,
    VectorIndexError,
)

if TYPE_CHECKING:
    from replay_sim.canonical import call_key, canonical_json
    from replay_sim.protocol import EPISODE_HEADER, EPISODE_META_KEY, MATCH_META_KEY
    from replay_sim.record.config import RecorderConfig, UpstreamSpec
    from replay_sim.record.config_file import load_config
    from replay_sim.record.http import record_http
    from replay_sim.record.recorder import Recorder, record_stdio, recording
    from replay_sim.redaction import Redactor
    from replay_sim.replay.core.misses import MissPolicy
    from replay_sim.replay.core.provenance import Match, match_of
    from replay_sim.replay.core.replay import Replay
    from replay_sim.replay.factory import open_replay
    from replay_sim.replay.http.app import create_app
    from replay_sim.replay.http.serving import EpisodeHandle, ReplayServer, Serving
    from replay_sim.replay.options import Limits, MissPolicyName
    from replay_sim.replay.policies.instances import SandboxPool
    from replay_sim.replay.policies.miss import Forward
    from replay_sim.replay.shaping.faults import FaultKind, Faults, Latency
    from replay_sim.resolve.build import build_index
    from replay_sim.resolve.calibration import MatchConfig
    from replay_sim.resolve.embedding import CachedEmbedder, Embedder, SentenceTransformerEmbedder
    from replay_sim.resolve.resolution import Candidate, FieldDiff, Resolution, Tier
    from replay_sim.resolve.resolver import Resolver
    from replay_sim.resolve.runtime import configure_runtime
    from replay_sim.resolve.snapshot import freeze, open_snapshot, verify
    from replay_sim.resolve.vectors import VectorIndex
    from replay_sim.store import Origin, Recording, ServerRecord, Store
    from replay_sim.store.interchange import export_jsonl, import_jsonl, merge
    from replay_sim.store.snapshot import Snapshot

# The public names load on first use (PEP 562), so a command — `serve --stdio` above all — imports
# only what it runs: the MCP SDK, FastAPI, numpy and faiss cost a second before the first answer.
_LAZY: dict[str, tuple[str, str]] = {
    "call_key": ("replay_sim.canonical", "call_key"),
    "canonical_json": ("replay_sim.canonical", "canonical_json"),
    "EPISODE_HEADER": ("replay_sim.protocol", "EPISODE_HEADER"),
    "EPISODE_META_KEY": ("replay_sim.protocol", "EPISODE_META_KEY"),
    "MATCH_META_KEY": ("replay_sim.protocol", "MATCH_META_KEY"),
    "RecorderConfig": ("replay_sim.record.config", "RecorderConfig"),
    "UpstreamSpec": ("replay_sim.record.config", "UpstreamSpec"),
    "load_config": ("replay_sim.record.config", "load_config"),
    "record_http": ("replay_sim.record.http", "record_http"),
    "Recorder": ("replay_sim.record.recorder", "Recorder"),
    "record_stdio": ("replay_sim.record.recorder", "record_stdio"),
    "recording": ("replay_sim.record.recorder", "recording"),
    "Redactor": ("replay_sim.redaction", "Redactor"),
    "Limits": ("replay_sim.replay.http.admission", "Limits"),
    "create_app": ("replay_sim.replay.http.app", "create_app"),
    "open_replay": ("replay_sim.replay.factory", "open_replay"),
    "FaultKind": ("replay_sim.replay.shaping.faults", "FaultKind"),
    "Faults": ("replay_sim.replay.shaping.faults", "Faults"),
    "Latency": ("replay_sim.replay.shaping.faults", "Latency"),
    "MissPolicy": ("replay_sim.replay.policies.miss", "MissPolicy"),
    "MissPolicyName": ("replay_sim.replay.policies.miss", "MissPolicyName"),
    "Match": ("replay_sim.replay.core.provenance", "Match"),
    "match_of": ("replay_sim.replay.core.provenance", "match_of"),
    "Replay": ("replay_sim.replay.core.replay", "Replay"),
    "EpisodeHandle": ("replay_sim.replay.http.serving", "EpisodeHandle"),
    "ReplayServer": ("replay_sim.replay.http.serving", "ReplayServer"),
    "Serving": ("replay_sim.replay.http.serving", "Serving"),
    "build_index": ("replay_sim.resolve.build", "build_index"),
    "MatchConfig": ("replay_sim.resolve.calibration", "MatchConfig"),
    "CachedEmbedder": ("replay_sim.resolve.embedding", "CachedEmbedder"),
    "Embedder": ("replay_sim.resolve.embedding", "Embedder"),
    "SentenceTransformerEmbedder": ("replay_sim.resolve.embedding", "SentenceTransformerEmbedder"),
    "Candidate": ("replay_sim.resolve.resolution", "Candidate"),
    "FieldDiff": ("replay_sim.resolve.resolution", "FieldDiff"),
    "Resolution": ("replay_sim.resolve.resolution", "Resolution"),
    "Tier": ("replay_sim.resolve.resolution", "Tier"),
    "Resolver": ("replay_sim.resolve.resolver", "Resolver"),
    "configure_runtime": ("replay_sim.resolve.runtime", "configure_runtime"),
    "freeze": ("replay_sim.resolve.snapshot", "freeze"),
    "open_snapshot": ("replay_sim.resolve.snapshot", "open_snapshot"),
    "verify": ("replay_sim.resolve.snapshot", "verify"),
    "VectorIndex": ("replay_sim.resolve.vectors", "VectorIndex"),
    "Origin": ("replay_sim.store", "Origin"),
    "Recording": ("replay_sim.store", "Recording"),
    "ServerRecord": ("replay_sim.store", "ServerRecord"),
    "Store": ("replay_sim.store", "Store"),
    "export_jsonl": ("replay_sim.store.interchange", "export_jsonl"),
    "import_jsonl": ("replay_sim.store.interchange", "import_jsonl"),
    "merge": ("replay_sim.store.interchange", "merge"),
    "Snapshot": ("replay_sim.store.snapshot", "Snapshot"),
}


def __getattr__(name: str) -> Any:
    found = _LAZY.get(name)
    if found is None:
        raise AttributeError(f"module 'replay_sim' has no attribute {name!r}")
    value = getattr(importlib.import_module(found[0]), found[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def serving(
    db: str | Path | None = None,
    *,
    snapshot: str | Path | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    miss: MissPolicyName | str = "error",
    miss_detail: str = "full",
    min_confidence: float | None = None,
    config: str | Path | RecorderConfig | None = None,
    sandboxes: SandboxPool | None = None,
    sandbox_pool: int | None = None,
    max_sandboxes: int | None = None,
    sandbox_timeout: float = 30.0,
    sandbox_idle: float | None = 5.0,
    sandbox_call_limit: float | None = 120.0,
    unconfined_sandboxes: bool = False,
    forward: Forward | None = None,
    llm_url: str | None = None,
    llm_model: str | None = None,
    llm_api_key: str | None = None,
    index_dir: str | Path | None = None,
    match_config: MatchConfig | None = None,
    redactor: Redactor | None = None,
    latency: Latency | str | None = None,
    faults: Faults | str | list[str] | None = None,
    max_episodes: int = 100_000,
    episode_idle_timeout: float | None = 600.0,
    limits: Limits | None = None,
    token: str | None = None,
    keep_alive: float = 75.0,
    log_level: str = "warning",
    access_log: bool = False,
    wait_ready: bool = True,
    ready_timeout: float = 600.0,
) -> Serving:
    """Serve a replay over HTTP in this process while a ``with`` or ``async with`` block runs.

    ``with serving(snapshot="snapshots/v1") as sim:`` enters once the replay is ready (its index
    loaded, as ``GET /api/ready`` says); ``sim.url`` is where it listens and ``sim.episode()``
    makes an episode whose URLs a rollout's MCP client takes. Every option of ``replay-sim serve``
    that applies to one process is a keyword here.

    Args:
        db: The recording store (default ``cache/replay.db``; ignored with ``snapshot``).
        snapshot: A snapshot bundle (verified first; its id is cited and draws the faults).
        host: Interface to bind (loopback by default).
        port: TCP port (0, the default: one the OS picks; read it from ``sim.url``).
        miss: Miss policy: ``error``, ``nearest``, ``live`` (needs ``forward``), ``sandbox`` (needs
            ``config``) or ``synthesize`` (needs ``llm_url``).
        miss_detail: How much a miss tells the agent: ``full`` (the nearest recordings and the
            arguments in which they differ), ``reason`` (no argument values) or ``none``.
        min_confidence: The operating point: answers whose learned confidence reaches it are
            served, others go to the miss policy (None: the strict tiers decide).
        config: The recorder config declaring the sandbox servers (``sandbox = true``), or its path;
            with ``miss="sandbox"`` the record side's instance pool is built from it here and
            injected into the replay, as ``serve --miss sandbox --config`` does.
        sandboxes: Where the ``sandbox`` miss policy takes instances of the real servers, built
            elsewhere (instead of from ``config``); with another ``miss``, its servers' misses are
            still answered by sandboxes.
        sandbox_pool: Started instances kept ready per sandbox server (None: the CLI's default).
        max_sandboxes: Live instances at most, across servers (None: the CLI's default).
        sandbox_timeout: Seconds a call may wait for a sandbox instance before it is a miss.
        sandbox_idle: Seconds after which an idle episode's instance is given back (None: never); its
            next call rebuilds its state on a fresh one.
        sandbox_call_limit: Seconds one call to a sandbox instance may take at most, progress or not.
        unconfined_sandboxes: Run the instances built from ``config`` without containment
            (``serve --unconfined-sandboxes``).
        forward: How the ``live`` miss policy reaches the real servers.
        llm_url: OpenAI-compatible endpoint (miss policy ``synthesize``).
        llm_model: Model name for ``llm_url``.
        llm_api_key: Bearer token for ``llm_url``, if it needs one.
        index_dir: Where the vector index lives (refused with ``snapshot``, which has its own).
        match_config: Per-tool matching overrides (free text, thresholds, read-only tools).
        redactor: The redaction rules and secret values the recordings were made with, beyond the
            rules the store records.
        latency: ``none`` (default), ``recorded``, ``fixed:MS`` or ``scale:F``, or a ``Latency``.
        faults: Which tool calls fail on purpose: a ``Faults``, or ``--faults`` values (``"0.05"``,
            ``"git/git_log=0.2:timeout,error"``, a TOML file).
        max_episodes: Live episodes at most; one more is refused, none evicted.
        episode_idle_timeout: Seconds after which an idle episode expires (None: never).
        limits: Every other bound (sessions, concurrency, body time); its episode bounds are
            ``max_episodes`` and ``episode_idle_timeout``.
        token: The admin API's bearer token (required beyond loopback).
        keep_alive: Seconds an idle HTTP connection is kept open.
        log_level: uvicorn's log level.
        access_log: One log line per HTTP request (off: a trainer's rollouts make thousands).
        wait_ready: Enter the block only once the replay is ready (the index loaded; the embedding
            model is loaded by the first call that needs it). False: as soon as it listens.
        ready_timeout: Seconds ``wait_ready`` waits before failing.

    Returns:
        A context manager yielding a :class:`ReplayServer` (``sim.url``, ``sim.episode()``).

    Raises:
        ConfigError: ``miss="sandbox"`` without a config declaring sandboxes, inconsistent options,
            an address that cannot be bound, or a replay not ready within ``ready_timeout``.
        SnapshotError: The snapshot is missing or tampered with.
        StoreError: The store does not exist or cannot be opened.
    """
    from replay_sim.record.config import RecorderConfig
    from replay_sim.record.config_file import load_config
    from replay_sim.record.instances import DEFAULT_MAX_INSTANCES, DEFAULT_POOL

    serve = importlib.import_module(_LAZY["Serving"][0]).serving  # the HTTP door's serving()
    if miss == "sandbox" and sandboxes is None:
        if config is None:
            raise ConfigError(
                'serving(miss="sandbox") needs config=, the recorder config declaring sandboxes'
            )
        from replay_sim.record.instances.building import (
            sandbox_pool as build_sandbox_pool,  # the CLI's wiring, on use
        )

        recorder = config if isinstance(config, RecorderConfig) else load_config(config)
        hidden = [
            p for p in (index_dir, snapshot, None if isinstance(config, RecorderConfig) else config) if p
        ]
        sandboxes = build_sandbox_pool(
            recorder,
            pool=DEFAULT_POOL if sandbox_pool is None else sandbox_pool,
            max_instances=DEFAULT_MAX_INSTANCES if max_sandboxes is None else max_sandboxes,
            store=None if snapshot is not None else (db or "cache/replay.db"),
            hidden=hidden,  # what no instance may see: the store's folder, the index, the config
            unconfined=unconfined_sandboxes,
        )
    return serve(  # type: ignore[no-any-return]
        db,
        snapshot=snapshot, host=host, port=port, miss=miss, latency=latency, faults=faults,
        max_episodes=max_episodes, episode_idle_timeout=episode_idle_timeout, limits=limits,
        token=token, miss_detail=miss_detail, keep_alive=keep_alive, log_level=log_level,
        access_log=access_log, wait_ready=wait_ready, ready_timeout=ready_timeout,
        redactor=redactor, forward=forward, sandboxes=sandboxes, sandbox_timeout=sandbox_timeout,
        sandbox_idle=sandbox_idle, sandbox_call_limit=sandbox_call_limit, llm_url=llm_url,
        llm_model=llm_model, llm_api_key=llm_api_key,
        index_dir=index_dir, match_config=match_config, min_confidence=min_confidence,
    )  # fmt: skip


__all__ = [
    "EPISODE_HEADER",
    "EPISODE_META_KEY",
    "MATCH_META_KEY",
    "CachedEmbedder",
    "Candidate",
    "ConfigError",
    "Embedder",
    "EpisodeError",
    "EpisodeHandle",
    "FaultKind",
    "Faults",
    "FieldDiff",
    "InterchangeError",
    "Latency",
    "Limits",
    "Match",
    "MatchConfig",
    "MissPolicy",
    "MissPolicyName",
    "Origin",
    "Recorder",
    "RecorderConfig",
    "Recording",
    "Redactor",
    "Replay",
    "ReplayServer",
    "ReplaySimError",
    "Resolution",
    "Resolver",
    "SentenceTransformerEmbedder",
    "ServerRecord",
    "Serving",
    "Snapshot",
    "SnapshotError",
    "Store",
    "StoreError",
    "Tier",
    "UpstreamError",
    "UpstreamSpec",
    "VectorIndex",
    "VectorIndexError",
    "build_index",
    "call_key",
    "canonical_json",
    "configure_runtime",
    "create_app",
    "export_jsonl",
    "freeze",
    "import_jsonl",
    "load_config",
    "match_of",
    "merge",
    "open_replay",
    "open_snapshot",
    "record_http",
    "record_stdio",
    "recording",
    "serving",
    "verify",
]
