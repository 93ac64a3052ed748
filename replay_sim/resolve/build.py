"""Keeping a store's vector index current: the incremental build, and the index a resolver holds.

:func:`build_index` embeds only recordings added since the manifest's last one (or rebuilds from
scratch when the index belongs to another store or another model) and re-embeds a tool whose
free-text fields changed. :class:`LiveIndex` is what a resolver searches: the persisted index,
rebuilt when the store grows, or refused as stale when building is not allowed. Whether the store
grew is asked of the store's change counters (no query over the calls) on every search; only when
they moved is the store's fingerprint, a scan of the calls table, compared again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from replay_sim.errors import VectorIndexError
from replay_sim.resolve.embedding import CachedEmbedder, Embedder, default_embedder
from replay_sim.resolve.index import DEFAULT_INDEX_DIR, MANIFEST, IndexSet, call_text, fields_token
from replay_sim.resolve.schemas import RecordedSchemas
from replay_sim.resolve.vectors import HNSW_THRESHOLD, FaissIndex
from replay_sim.schema import ToolSchema
from replay_sim.store import Store

__all__ = ["LiveIndex", "build_index"]

Schemas = Callable[[str, str], ToolSchema | None]

WINDOW_BATCHES = 32
"""Batches whose texts are sorted by length together (a window of 16,384 recordings at 512)."""


def _same_store(index: IndexSet, store: Store) -> bool:
    """Whether ``store`` still holds what the index was built from (so it can be extended)."""
    if index.last_id == 0:
        return True
    recording = store.recording(index.last_id)
    if recording is None or recording.key != index.last_key:
        return False
    # Recordings taken back (`replay-sim forget`) leave vectors of calls that are gone: rebuilt.
    ((held,),) = store._query(
        "SELECT COUNT(*) FROM calls WHERE method = 'tools/call' AND id <= ?", (index.last_id,)
    )
    return sum(len(part) for part in index.partitions.values()) == held


def _existing(
    store: Store, embedder: Embedder, directory: Path | None, hnsw_threshold: int
) -> IndexSet | None:
    """The persisted index in ``directory`` if it can be extended for this store and model."""
    if directory is None or not (directory / MANIFEST).exists():
        return None
    try:
        index = IndexSet.load(directory, hnsw_threshold)
    except VectorIndexError:
        return None  # unreadable: rebuilt
    if index.model_id != embedder.model_id or index.dimension != embedder.dimension:
        return None
    return index if _same_store(index, store) else None


def build_index(
    store: Store,
    schemas: Schemas | None = None,
    embedder: Embedder | None = None,
    directory: Path | None = DEFAULT_INDEX_DIR,
    *,
    progress: Callable[[int, int], None] | None = None,
    hnsw_threshold: int = HNSW_THRESHOLD,
    batch: int = 512,
) -> IndexSet:
    """Bring the index of ``store`` up to date, embedding only what is new, and persist it.

    Args:
        store: The recording store.
        schemas: ``(server, tool) -> ToolSchema`` (decides each tool's free-text fields); the
            store's recorded schemas with the default matching config when None.
        embedder: Embeds call texts; the packaged model, cached in the store, when None.
        directory: Index folder; None keeps the index in memory. Partition files its new manifest
            no longer names are removed.
        progress: Called as ``progress(done, total)`` once the calls to embed are known (``done``
            0) and after each batch.
        hnsw_threshold: Partition size above which HNSW is used.
        batch: Recordings embedded per batch (and per progress step).

    Returns:
        The current index.

    Raises:
        VectorIndexError: The folder cannot be written.
    """
    directory = None if directory is None else Path(directory)
    schemas = schemas or RecordedSchemas(store)
    embedder = embedder or CachedEmbedder(default_embedder(), store)
    index = _existing(store, embedder, directory, hnsw_threshold) or IndexSet(
        directory, embedder.model_id, embedder.dimension, hnsw_threshold
    )
    fingerprint = store.fingerprint()
    if index.fingerprint == fingerprint and index.fingerprint:
        return index

    def free_text(server: str, tool: str) -> frozenset[str]:
        schema = schemas(server, tool)
        return (schema.free_text or frozenset()) if schema else frozenset()

    # A tool whose free-text fields changed (new listing or config) is re-embedded from scratch.
    for key, token in list(index.fields.items()):
        if token != fields_token(free_text(*key)):
            del index.partitions[key], index.fields[key]
    redo = {k for k in _indexed_tools(store) if k not in index.partitions}
    upto = _max_id(store, fingerprint)  # recordings added while we build wait for the next update
    todo = [r for r in store.recordings(method="tools/call", after_id=index.last_id) if r.id <= upto]
    todo = [r for r in todo if (r.server, r.name) not in redo]
    for server, tool in sorted(redo):
        todo += [r for r in store.recordings(server, method="tools/call", name=tool) if r.id <= upto]
    total, done = len(todo), 0
    if progress is not None:
        progress(0, total)  # before the first batch, which loads the model (a minute on a slow machine)
    # Texts are embedded shortest first within a window of recordings, so a batch pads little (the
    # model's cost is per padded token), and added to the partitions in recording order.
    window = batch * WINDOW_BATCHES
    for start in range(0, total, window):
        chunk = todo[start : start + window]
        texts = [call_text(r.arguments, free_text(r.server, r.name)) for r in chunk]
        order = sorted(range(len(chunk)), key=lambda i: len(texts[i]))
        vectors = np.empty((len(chunk), index.dimension), dtype=np.float32)
        for at in range(0, len(order), batch):
            rows = order[at : at + batch]
            vectors[rows] = embedder.encode([texts[i] for i in rows])
            done += len(rows)
            if progress is not None:
                progress(done, total)
        groups: dict[tuple[str, str], list[int]] = {}
        for i, rec in enumerate(chunk):
            groups.setdefault((rec.server, rec.name), []).append(i)
        for key, rows in groups.items():
            part = index.partitions.get(key)
            if part is None:
                part = index.partitions[key] = FaissIndex(index.dimension, hnsw_threshold)
                index.fields[key] = fields_token(free_text(*key))
            part.add(np.array([chunk[i].id for i in rows]), vectors[rows])
    last = store.recording(upto) if upto else None
    index.last_id, index.last_key = (last.id, last.key) if last else (0, "")
    index.fingerprint = fingerprint
    index.save()
    return index


def _max_id(store: Store, fingerprint: str) -> int:
    """The highest recording id covered by ``fingerprint`` (``calls:<count>:<max id>``)."""
    try:
        return int(fingerprint.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        found = store.recordings()
        return found[-1].id if found else 0


def _indexed_tools(store: Store) -> set[tuple[str, str]]:
    return {(row["server"], row["name"]) for row in store.stats() if row["method"] == "tools/call"}


class LiveIndex:
    """The index a resolver searches, current with its store.

    Args:
        store: The recording store.
        schemas: ``(server, tool) -> ToolSchema`` (see :func:`build_index`).
        directory: Where the index lives; None keeps it in memory.
        auto_build: Build or update a missing or stale index on first need; when False, a missing
            or stale index is a :class:`~replay_sim.errors.VectorIndexError`.
    """

    def __init__(
        self,
        store: Store,
        schemas: Schemas,
        directory: Path | None = DEFAULT_INDEX_DIR,
        *,
        auto_build: bool = True,
    ) -> None:
        self.store = store
        self.schemas = schemas
        self.directory = directory
        self.auto_build = auto_build
        self._index: IndexSet | None = None
        self._verified: tuple[int, int] | None = None  # the store's counters when last found current
        self._lock = threading.Lock()  # one build at a time; a search that needs it waits for it

    @property
    def loaded(self) -> bool:
        """Whether an index is held (it may still turn out stale)."""
        return self._index is not None

    def current(self, embedder: Embedder) -> IndexSet:
        """The index, brought up to date with ``embedder`` if needed and allowed.

        Raises:
            VectorIndexError: The index is missing or stale and ``auto_build`` is False.
        """
        index = self._index
        if index is not None and self._verified == self.store.version():
            return index
        with self._lock:
            counters = self.store.version()  # read before the fingerprint: a later commit moves them
            if self._index is None or not self._index.is_current(self.store):
                self._index = self._load_or_build(embedder)
            self._verified = counters
            return self._index

    def _load_or_build(self, embedder: Embedder) -> IndexSet:
        if not self.auto_build:
            index = IndexSet.load(Path(self.directory or DEFAULT_INDEX_DIR))
            if (index.model_id, index.dimension) != (embedder.model_id, embedder.dimension):
                raise VectorIndexError(
                    f"{self.directory}: index built with embedding model {index.model_id!r}, but queries "
                    f"are embedded with {embedder.model_id!r}: their cosines would mean nothing; rebuild "
                    "it with `replay-sim index build --embedding NAME` for the model you serve with"
                )
            if not index.is_current(self.store):
                raise VectorIndexError(
                    f"{self.directory}: index is stale for {self.store.path}; run `replay-sim index build`"
                )
            return index
        try:
            return build_index(self.store, self.schemas, embedder, self.directory)
        except VectorIndexError:
            if self.directory is None:
                raise
            # The folder is not writable (e.g. a read-only snapshot): keep the index in memory.
            return build_index(self.store, self.schemas, embedder, None)
