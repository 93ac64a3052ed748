"""replay-sim: record real MCP servers, index the recordings, replay them offline.

The public API is listed in ``__all__``; the CLI (``replay-sim``) is a thin layer over it.
"""

from replay_sim.canonical import call_key, canonical_json
from replay_sim.errors import ReplaySimError, StoreError
from replay_sim.interchange import export_jsonl, import_jsonl
from replay_sim.resolver import Resolution, Resolver, Tier
from replay_sim.store import Origin, Recording, ServerRecord, Store

__all__ = [
    "Origin",
    "Recording",
    "ReplaySimError",
    "Resolution",
    "Resolver",
    "ServerRecord",
    "Store",
    "StoreError",
    "Tier",
    "call_key",
    "canonical_json",
    "export_jsonl",
    "import_jsonl",
]
