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
    from replay_sim.record.config import RecorderConfig, UpstreamSpec, load_config
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
    config: str | Path | RecorderConfig | None = None,
    sandbox_pool: int | None = None,
    max_sandboxes: int | None = None,
    **options: Any,
) -> Serving:
    """Serve a replay over HTTP in this process (:func:`replay_sim.replay.http.serving.serving`).

    With ``miss="sandbox"``, ``config`` (the recorder config, or its path) names the sandbox
    servers: the record side's instance pool is built from it here and injected into the replay,
    the way ``serve --miss sandbox --config`` does.

    Args:
        db: The recording store (default ``cache/replay.db``; ignored with ``snapshot``).
        config: The recorder config declaring the sandbox servers (``sandbox = true``).
        sandbox_pool: Started instances kept ready per sandbox server (None: ``DEFAULT_POOL``).
        max_sandboxes: Live instances at most, across servers (None: ``DEFAULT_MAX_INSTANCES``).
        **options: Every other :func:`replay_sim.replay.http.serving.serving` option (``miss``,
            ``snapshot``, ``episode_idle_timeout`` …).

    Raises:
        ConfigError: ``miss="sandbox"`` without a config declaring sandboxes, or bad options.
    """
    from replay_sim.record.config import RecorderConfig, load_config
    from replay_sim.record.instances import DEFAULT_MAX_INSTANCES, DEFAULT_POOL
    from replay_sim.replay.http.serving import serving as _serving
    from replay_sim.replay.options import MissPolicyName

    if options.get("miss") == MissPolicyName.SANDBOX and "sandboxes" not in options:
        if config is None:
            raise ConfigError(
                'serving(miss="sandbox") needs config=, the recorder config declaring sandboxes'
            )
        from replay_sim.cli.sandboxes import sandbox_pool as build_sandbox_pool  # the CLI's wiring, on use

        recorder = config if isinstance(config, RecorderConfig) else load_config(config)
        options["sandboxes"] = build_sandbox_pool(
            recorder,
            pool=DEFAULT_POOL if sandbox_pool is None else sandbox_pool,
            max_instances=DEFAULT_MAX_INSTANCES if max_sandboxes is None else max_sandboxes,
        )
    return _serving(db, **options)


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
