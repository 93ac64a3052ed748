"""The store stage: the SQLite store and its record types, JSONL interchange, frozen snapshots."""

from replay_sim.store.records import Origin, Recording, ServerRecord, utc_now
from replay_sim.store.store import DEFAULT_DB, Store

__all__ = ["DEFAULT_DB", "Origin", "Recording", "ServerRecord", "Store", "utc_now"]
