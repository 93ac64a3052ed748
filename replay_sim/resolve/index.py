"""The vector index: one faiss partition per (server, tool), persisted under ``index/``.

Each recorded ``tools/call`` is embedded once (see :mod:`replay_sim.resolve.embedding`) as its *call text*:
its free-text arguments, or its canonical arguments when the tool has none. A partition is exact
inner product (``IndexFlatIP``) while small and becomes HNSW above ``hnsw_threshold`` vectors.

On disk: ``manifest.json`` (model, store fingerprint, last indexed recording, partitions) and one
``<hash>.faiss`` file per partition. A manifest whose fingerprint differs from the store's is
*stale*; :func:`build_index` then embeds only recordings added since (or rebuilds from scratch
when the store is not the one the index was built from). faiss errors become :class:`IndexError_`
here and nowhere else.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import faiss
import numpy as np

from replay_sim.canonical import canonical_json
from replay_sim.errors import IndexError_
from replay_sim.resolve.calibration import MatchConfig
from replay_sim.resolve.embedding import CachedEmbedder, Embedder, default_embedder
from replay_sim.schema import ToolSchema, tool_schemas
from replay_sim.store import Store

__all__ = [
    "DEFAULT_INDEX_DIR",
    "FaissIndex",
    "IndexSet",
    "VectorIndex",
    "build_index",
    "build_snapshot_index",
    "call_text",
    "store_schemas",
]

DEFAULT_INDEX_DIR = Path("index")
HNSW_THRESHOLD = 20_000
MANIFEST_VERSION = 1
EXACT_ALLOWED_LIMIT = 4096  # below this, a filtered search scores the allowed ids exactly

# One query at a time is the resolver's workload: OpenMP fan-out only adds latency (measured 3x)
# on small machines; a server scales across requests instead.
faiss.omp_set_num_threads(1)


def call_text(arguments: dict[str, Any], free_text: Collection[str]) -> str:
    """The text embedded for a call: its free-text fields (sorted by name), else its canonical arguments."""
    fields = [f for f in sorted(free_text) if isinstance(arguments.get(f), str)]
    if fields:
        return "\n".join(arguments[f].strip() for f in fields)
    return canonical_json(arguments)


@contextmanager
def _translate(action: str, path: Path | str | None = None) -> Iterator[None]:
    try:
        yield
    except RuntimeError as exc:  # faiss raises RuntimeError for every C++ failure
        where = f"{path}: " if path else ""
        raise IndexError_(f"{where}cannot {action}: {exc}; rebuild with `replay-sim index build`") from exc


class VectorIndex(Protocol):
    """A searchable set of (recording id, unit vector) pairs."""

    kind: str

    def __len__(self) -> int: ...

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Add vectors under recording ids."""
        ...

    def search(
        self, vector: np.ndarray, k: int, allowed: Collection[int] | None = None
    ) -> list[tuple[int, float]]:
        """The ``k`` nearest ids by inner product (optionally only among ``allowed``), best first."""
        ...


class FaissIndex:
    """A :class:`VectorIndex` over faiss: flat inner product, or HNSW once it is large.

    Args:
        dimension: Vector length.
        hnsw_threshold: Convert to HNSW when more vectors than this are held.
        index: An existing ``IndexIDMap2`` (when loading).
    """

    def __init__(self, dimension: int, hnsw_threshold: int = HNSW_THRESHOLD, index: Any = None) -> None:
        self.dimension = dimension
        self.hnsw_threshold = hnsw_threshold
        self.index = index if index is not None else faiss.IndexIDMap2(faiss.IndexFlatIP(dimension))

    @property
    def kind(self) -> str:
        """``flat`` or ``hnsw``."""
        return "hnsw" if isinstance(faiss.downcast_index(self.index.index), faiss.IndexHNSW) else "flat"

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Add vectors; switches a flat partition to HNSW when it crosses the threshold."""
        with _translate("add vectors"):
            self.index.add_with_ids(
                np.ascontiguousarray(vectors, dtype=np.float32), np.asarray(ids, dtype=np.int64)
            )
            if self.kind == "flat" and len(self) > self.hnsw_threshold:
                self._to_hnsw()

    def _to_hnsw(self) -> None:
        ids = faiss.vector_to_array(self.index.id_map).astype(np.int64)
        vectors = self.index.index.reconstruct_n(0, len(self))
        hnsw = faiss.IndexHNSWFlat(self.dimension, 32, faiss.METRIC_INNER_PRODUCT)
        hnsw.hnsw.efConstruction = 40
        hnsw.hnsw.efSearch = 64
        index = faiss.IndexIDMap2(hnsw)
        index.add_with_ids(vectors, ids)
        self.index = index

    def vectors(self, ids: Collection[int]) -> np.ndarray:
        """The stored vectors of ``ids`` (each must be present)."""
        with _translate("read vectors"):
            return (
                np.stack([self.index.reconstruct(int(i)) for i in ids])
                if ids
                else np.zeros((0, self.dimension))
            )

    def search(
        self, vector: np.ndarray, k: int, allowed: Collection[int] | None = None
    ) -> list[tuple[int, float]]:
        """Nearest ids by cosine, best first; ties broken by lower id. Exact when ``allowed`` is small."""
        query = np.ascontiguousarray(vector, dtype=np.float32).reshape(1, -1)
        if allowed is not None:
            allowed = sorted(set(allowed))
            if not allowed:
                return []
            if len(allowed) <= EXACT_ALLOWED_LIMIT:
                scores = self.vectors(allowed) @ query[0]
                order = sorted(range(len(allowed)), key=lambda i: (-scores[i], allowed[i]))[:k]
                return [(allowed[i], float(scores[i])) for i in order]
        with _translate("search"):
            params = None
            if allowed is not None:
                selector = faiss.IDSelectorBatch(np.asarray(allowed, dtype=np.int64))
                params = faiss.SearchParameters(sel=selector)  # type: ignore[call-arg]
            scores, ids = self.index.search(query, min(k, max(len(self), 1)), params=params)
        found = [(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if i >= 0]
        return sorted(found, key=lambda p: (-p[1], p[0]))


def _partition_file(key: tuple[str, str]) -> str:
    return hashlib.sha256("\x1f".join(key).encode()).hexdigest()[:20] + ".faiss"


def _fields_token(fields: Collection[str]) -> str:
    return ",".join(sorted(fields))


class IndexSet:
    """All partitions of one store's index, with the manifest that ties them to the store.

    Args:
        directory: Where it is persisted (None: in memory only).
        model_id: Embedding model the vectors come from.
        dimension: Vector length.
        hnsw_threshold: Partition size above which HNSW replaces exact search.
    """

    def __init__(
        self, directory: Path | None, model_id: str, dimension: int, hnsw_threshold: int = HNSW_THRESHOLD
    ) -> None:
        self.directory = directory
        self.model_id = model_id
        self.dimension = dimension
        self.hnsw_threshold = hnsw_threshold
        self.partitions: dict[tuple[str, str], FaissIndex] = {}
        self.fields: dict[tuple[str, str], str] = {}
        self.fingerprint = ""
        self.last_id = 0
        self.last_key = ""

    def partition(self, server: str, tool: str) -> FaissIndex | None:
        """The partition of one tool, or None when nothing of it is indexed."""
        return self.partitions.get((server, tool))

    def search(
        self, server: str, tool: str, vector: np.ndarray, k: int, allowed: Collection[int] | None = None
    ) -> list[tuple[int, float]]:
        """Nearest recordings of one tool (see :meth:`FaissIndex.search`); empty if none are indexed."""
        part = self.partitions.get((server, tool))
        return [] if part is None else part.search(vector, k, allowed)

    def manifest(self) -> dict[str, Any]:
        """The manifest as written to ``manifest.json``."""
        return {
            "version": MANIFEST_VERSION,
            "model": self.model_id,
            "dimension": self.dimension,
            "fingerprint": self.fingerprint,
            "last_id": self.last_id,
            "last_key": self.last_key,
            "partitions": [
                {"server": s, "tool": t, "file": _partition_file((s, t)), "count": len(p), "kind": p.kind,
                 "fields": self.fields.get((s, t), "")}
                for (s, t), p in sorted(self.partitions.items())
            ],
        }  # fmt: skip

    def save(self) -> None:
        """Write partitions and then the manifest (atomically replaced, so readers never see a mix)."""
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        for key, part in self.partitions.items():
            path = self.directory / _partition_file(key)
            with _translate("write partition", path):
                faiss.write_index(part.index, str(path) + ".tmp")
            os.replace(str(path) + ".tmp", path)
        tmp = self.directory / "manifest.json.tmp"
        tmp.write_text(json.dumps(self.manifest(), indent=1), encoding="utf-8")
        os.replace(tmp, self.directory / "manifest.json")

    @classmethod
    def load(cls, directory: Path, hnsw_threshold: int = HNSW_THRESHOLD) -> IndexSet:
        """Read a persisted index.

        Raises:
            IndexError_: The directory has no readable manifest or a partition file is missing.
        """
        path = Path(directory) / "manifest.json"
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise IndexError_(f"{path}: no index here; build it with `replay-sim index build`") from exc
        except (OSError, ValueError) as exc:
            raise IndexError_(
                f"{path}: unreadable index manifest ({exc}); rebuild with `replay-sim index build`"
            ) from exc
        if manifest.get("version") != MANIFEST_VERSION:
            raise IndexError_(
                f"{path}: index format {manifest.get('version')}, expected {MANIFEST_VERSION}; rebuild it"
            )
        index = cls(Path(directory), manifest["model"], int(manifest["dimension"]), hnsw_threshold)
        index.fingerprint, index.last_id, index.last_key = (
            manifest["fingerprint"],
            manifest["last_id"],
            manifest["last_key"],
        )
        for entry in manifest["partitions"]:
            file = Path(directory) / entry["file"]
            if not file.is_file():
                raise IndexError_(
                    f"{file}: partition of {entry['server']}/{entry['tool']} is missing; rebuild the index"
                )
            with _translate("read partition", file):
                raw = faiss.read_index(str(file))
            key = (entry["server"], entry["tool"])
            index.partitions[key] = FaissIndex(index.dimension, hnsw_threshold, raw)
            index.fields[key] = entry.get("fields", "")
        return index

    def is_current(self, store: Store) -> bool:
        """True when the index covers exactly the store's current recordings."""
        return self.fingerprint == store.fingerprint()


def _same_store(index: IndexSet, store: Store) -> bool:
    """Whether ``store`` still holds what the index was built from (so it can be extended)."""
    if index.last_id == 0:
        return True
    recording = store.recording(index.last_id)
    return recording is not None and recording.key == index.last_key


def build_index(
    store: Store,
    schemas: Callable[[str, str], ToolSchema | None],
    embedder: Embedder,
    directory: Path | None = DEFAULT_INDEX_DIR,
    *,
    progress: Callable[[int, int], None] | None = None,
    hnsw_threshold: int = HNSW_THRESHOLD,
    batch: int = 512,
) -> IndexSet:
    """Bring the index of ``store`` up to date, embedding only what is new, and persist it.

    Args:
        store: The recording store.
        schemas: ``(server, tool) -> ToolSchema`` (decides each tool's free-text fields).
        embedder: Embeds call texts (pass a :class:`~replay_sim.resolve.embedding.CachedEmbedder`).
        directory: Index folder; None keeps the index in memory.
        progress: Called as ``progress(done, total)`` after each batch.
        hnsw_threshold: Partition size above which HNSW is used.
        batch: Recordings embedded per batch.

    Returns:
        The current index.
    """
    index: IndexSet | None = None
    if directory is not None and (Path(directory) / "manifest.json").exists():
        try:
            index = IndexSet.load(Path(directory), hnsw_threshold)
        except IndexError_:
            index = None  # unreadable: rebuilt below
        if index is not None and (
            index.model_id != embedder.model_id
            or index.dimension != embedder.dimension
            or not _same_store(index, store)
        ):
            index = None
    if index is None:
        index = IndexSet(
            None if directory is None else Path(directory),
            embedder.model_id,
            embedder.dimension,
            hnsw_threshold,
        )
    fingerprint = store.fingerprint()
    if index.fingerprint == fingerprint and index.fingerprint:
        return index

    # A tool whose free-text fields changed (new listing or config) is re-embedded from scratch.
    for key, token in list(index.fields.items()):
        schema = schemas(*key)
        if token != _fields_token(schema.free_text or () if schema else ()):
            del index.partitions[key], index.fields[key]
    redo = {k for k in _indexed_tools(store) if k not in index.partitions}
    upto = _max_id(store, fingerprint)  # recordings added while we build wait for the next update
    todo = [r for r in store.recordings(method="tools/call", after_id=index.last_id) if r.id <= upto]
    todo = [r for r in todo if (r.server, r.name) not in redo]
    for server, tool in sorted(redo):
        todo += [r for r in store.recordings(server, method="tools/call", name=tool) if r.id <= upto]
    total, done = len(todo), 0
    for start in range(0, total, batch):
        chunk = todo[start : start + batch]
        texts = []
        for rec in chunk:
            schema = schemas(rec.server, rec.name)
            texts.append(call_text(rec.arguments, schema.free_text or () if schema else ()))
        vectors = embedder.encode(texts)
        groups: dict[tuple[str, str], list[int]] = {}
        for i, rec in enumerate(chunk):
            groups.setdefault((rec.server, rec.name), []).append(i)
        for key, rows in groups.items():
            part = index.partitions.get(key)
            if part is None:
                part = index.partitions[key] = FaissIndex(index.dimension, hnsw_threshold)
                schema = schemas(*key)
                index.fields[key] = _fields_token(schema.free_text or () if schema else ())
            part.add(np.array([chunk[i].id for i in rows]), vectors[rows])
        done += len(chunk)
        if progress is not None:
            progress(done, total)
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


def store_schemas(store: Store, config: MatchConfig | None = None) -> Callable[[str, str], ToolSchema | None]:
    """``(server, tool) -> ToolSchema`` from the store's recorded ``tools/list`` (overrides applied)."""
    config = config or MatchConfig()
    cache: dict[str, dict[str, ToolSchema]] = {}

    def schema(server: str, tool: str) -> ToolSchema | None:
        if server not in cache:
            listing = store.listings(server).get("tools/list")
            cache[server] = {n: config.apply(server, s) for n, s in tool_schemas(listing).items()}
        return cache[server].get(tool)

    return schema


def build_snapshot_index(
    store: Store, directory: Path, config: MatchConfig | None = None
) -> tuple[str, dict[str, Any]]:
    """Build a snapshot's index (the :data:`replay_sim.store.snapshot.IndexBuilder` replay-sim uses).

    Args:
        store: The frozen (read-only) store; cached embeddings are read from it.
        directory: The bundle's index folder.
        config: The matching config to record (defaults when None).

    Returns:
        ``(embedding model id, matching config as JSON data)``.
    """
    config = config or MatchConfig()
    embedder = CachedEmbedder(default_embedder(), store)
    build_index(store, store_schemas(store, config), embedder, directory)
    return embedder.model_id, config.as_dict()
