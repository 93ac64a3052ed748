"""The vector index of a store: one partition per (server, tool), tied to the store by a manifest.

Each recorded ``tools/call`` is embedded once (see :mod:`replay_sim.resolve.embedding`) as its *call
text* (:func:`call_text`). On disk an index is a folder: ``manifest.json`` (model, store
fingerprint, last indexed recording, partitions) and one ``<hash>.faiss`` file per partition
(:mod:`replay_sim.resolve.vectors`). A manifest whose fingerprint differs from the store's is
*stale*; :mod:`replay_sim.resolve.build` brings it up to date. Every failure to read or write the
folder is a :class:`~replay_sim.errors.VectorIndexError` naming the path.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np

from replay_sim.canonical import canonical_json
from replay_sim.errors import VectorIndexError
from replay_sim.resolve.layout import DEFAULT_INDEX_DIR, MANIFEST
from replay_sim.resolve.vectors import HNSW_THRESHOLD, FaissIndex
from replay_sim.store import Store

__all__ = ["DEFAULT_INDEX_DIR", "MANIFEST", "IndexSet", "call_text", "fields_token", "partition_file"]

MANIFEST_VERSION = 1
PARTITION_SUFFIX = ".faiss"


def call_text(arguments: dict[str, Any], free_text: Collection[str]) -> str:
    """The text embedded for a call: its free-text fields (sorted by name), else its canonical arguments."""
    fields = [f for f in sorted(free_text) if isinstance(arguments.get(f), str)]
    if fields:
        return "\n".join(arguments[f].strip() for f in fields)
    return canonical_json(arguments)


def fields_token(fields: Collection[str] | None) -> str:
    """How the manifest records a partition's free-text fields (a change means: re-embed it)."""
    return ",".join(sorted(fields or ()))


def _partition_file(key: tuple[str, str]) -> str:
    return hashlib.sha256("\x1f".join(key).encode()).hexdigest()[:20] + PARTITION_SUFFIX


def partition_file(manifest: Path, entry: dict[str, Any]) -> str:
    """The file a manifest's partition entry names, checked: the name its server and tool give it.

    A partition lives in the index folder under that one name, so a manifest naming any other
    file — ``../../outside.faiss``, an absolute path — never makes the index read it.

    Raises:
        VectorIndexError: The entry names another file (names the manifest and the entry).
    """
    key = (str(entry.get("server")), str(entry.get("tool")))
    expected = _partition_file(key)
    if entry.get("file") != expected:
        raise VectorIndexError(
            f"{manifest}: partition {key[0]}/{key[1]} names file {entry.get('file')!r}, not its own "
            f"{expected!r} in the index folder; rebuild the index with `replay-sim index build`"
        )
    return expected


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
        """Write partitions, then the manifest, then remove partition files it no longer names.

        The manifest is replaced atomically, so a reader never sees a mix of old and new.

        Raises:
            VectorIndexError: The folder cannot be created or written (names it).
        """
        if self.directory is None:
            return
        folder = self.directory
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for key, part in self.partitions.items():
                path = folder / _partition_file(key)
                part.write(path.with_name(path.name + ".tmp"))
                os.replace(path.with_name(path.name + ".tmp"), path)
            tmp = folder / (MANIFEST + ".tmp")
            tmp.write_text(json.dumps(self.manifest(), indent=1), encoding="utf-8")
            os.replace(tmp, folder / MANIFEST)
            self._remove_unreferenced(folder)
        except OSError as exc:
            raise VectorIndexError(
                f"{folder}: cannot write the index: {exc.strerror or exc}; "
                "choose a writable folder (--index-dir)"
            ) from exc

    def _remove_unreferenced(self, folder: Path) -> None:
        """Delete partition files (and leftovers of interrupted writes) the manifest does not name."""
        kept = {_partition_file(key) for key in self.partitions}
        for path in folder.iterdir():
            name = path.name
            partition = name.endswith(PARTITION_SUFFIX) or name.endswith(PARTITION_SUFFIX + ".tmp")
            if path.is_file() and partition and name not in kept:
                path.unlink()

    @classmethod
    def load(cls, directory: Path, hnsw_threshold: int = HNSW_THRESHOLD) -> IndexSet:
        """Read a persisted index.

        Raises:
            VectorIndexError: The directory has no readable manifest or a partition file is missing.
        """
        path = Path(directory) / MANIFEST
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise VectorIndexError(f"{path}: no index here; build it with `replay-sim index build`") from exc
        except (OSError, ValueError) as exc:
            raise VectorIndexError(
                f"{path}: unreadable index manifest ({exc}); rebuild with `replay-sim index build`"
            ) from exc
        if manifest.get("version") != MANIFEST_VERSION:
            raise VectorIndexError(
                f"{path}: index format {manifest.get('version')}, expected {MANIFEST_VERSION}; rebuild it"
            )
        index = cls(Path(directory), manifest["model"], int(manifest["dimension"]), hnsw_threshold)
        index.fingerprint, index.last_id, index.last_key = (
            manifest["fingerprint"],
            manifest["last_id"],
            manifest["last_key"],
        )
        for entry in manifest["partitions"]:
            file = Path(directory) / partition_file(path, entry)
            if not file.is_file():
                raise VectorIndexError(
                    f"{file}: partition of {entry['server']}/{entry['tool']} is missing; rebuild the index"
                )
            key = (entry["server"], entry["tool"])
            index.partitions[key] = FaissIndex.read(file, index.dimension, hnsw_threshold)
            index.fields[key] = entry.get("fields", "")
        return index

    def is_current(self, store: Store) -> bool:
        """True when the index covers exactly the store's current recordings."""
        return self.fingerprint == store.fingerprint()
