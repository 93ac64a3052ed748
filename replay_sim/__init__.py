"""replay-sim: record real MCP servers, index the recordings, replay them offline.

The public API is listed in ``__all__``; the CLI (``replay-sim``) is a thin layer over it::

    from replay_sim import Store, Resolver, open_replay, create_app

    replay = open_replay("cache/replay.db")          # or snapshot="snapshots/v1"
    app = create_app(replay)                          # ASGI: /mcp/<server>, /api, /, /metrics

    with serving(snapshot="snapshots/v1") as sim:     # or `async with`: served in this process
        episode = sim.episode(seed=7)                 # episode.url("git"), .mcp_servers_json()
"""

from replay_sim.canonical import call_key, canonical_json
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
from replay_sim.protocol import EPISODE_HEADER, EPISODE_META_KEY, MATCH_META_KEY
from replay_sim.record.config import RecorderConfig, UpstreamSpec, load_config
from replay_sim.record.http import record_http
from replay_sim.record.recorder import Recorder, record_stdio, recording
from replay_sim.redaction import Redactor
from replay_sim.replay.admission import Limits
from replay_sim.replay.app import create_app
from replay_sim.replay.factory import open_replay
from replay_sim.replay.faults import FaultKind, Faults, Latency
from replay_sim.replay.policies.miss import MissPolicy, MissPolicyName
from replay_sim.replay.provenance import Match, match_of
from replay_sim.replay.replay import Replay
from replay_sim.replay.serving import EpisodeHandle, ReplayServer, Serving, serving
from replay_sim.resolve.build import build_index
from replay_sim.resolve.calibration import MatchConfig
from replay_sim.resolve.embedding import CachedEmbedder, Embedder, SentenceTransformerEmbedder
from replay_sim.resolve.resolution import Candidate, FieldDiff, Resolution, Tier
from replay_sim.resolve.resolver import Resolver
from replay_sim.resolve.runtime import configure_runtime
from replay_sim.resolve.snapshot import freeze
from replay_sim.resolve.vectors import VectorIndex
from replay_sim.store import Origin, Recording, ServerRecord, Store
from replay_sim.store.interchange import export_jsonl, import_jsonl, merge
from replay_sim.store.snapshot import Snapshot, open_snapshot, verify

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
