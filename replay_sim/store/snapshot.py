"""Frozen snapshots: a read-only bundle an evaluator can cite by id.

A bundle is a folder holding ``store.db`` (written with ``VACUUM INTO``), the vector index built
from it (``index/``) and ``manifest.json``. The snapshot id is a hash over the recorded content
(the store's JSONL export), the embedding model id, the matching config, the store's meta values
(the redaction rules; the tools' learned effects, kept so replays need not learn them) and the index
files (the vectors semantic answers are decided by), so one id always gives the same
answers: the same recordings frozen twice get the same id, and any change to them — or a tampered
file, even with its hash in the manifest rewritten — is detected. The index build is deterministic
for a given model build; a store frozen with another torch or CPU may get other vectors, and then
another id. The bundle's store carries no embedding cache: query vectors are always computed by the
model, never read from a table the id does not cover.

The store stage knows nothing of indexes or matching: :func:`freeze` is given the function that
builds the index (replay-sim's is wired in :mod:`replay_sim.resolve.snapshot`), and a snapshot's
matching config is plain JSON data here. :func:`verify` checks every file of the bundle (none may be
a symbolic link); that the index reads no other file is checked where index manifests are known,
by :func:`replay_sim.resolve.snapshot.verify`, which every server of a snapshot calls. Every failure
to write or read a bundle is a :class:`~replay_sim.errors.SnapshotError` naming the path.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replay_sim.errors import SnapshotError, StoreError
from replay_sim.redaction import RULES_META_KEY
from replay_sim.store import Store, utc_now
from replay_sim.store.database import drop_embedding_cache
from replay_sim.store.interchange import export_lines

__all__ = ["Snapshot", "SnapshotDiff", "diff", "freeze", "verify"]

MANIFEST = "manifest.json"
STORE_FILE = "store.db"
INDEX_DIR = "index"
FORMAT = 3  # 2: the id covers the index; the bundle store has no embedding cache. 3: and its meta

IndexBuilder = Callable[[Store, Path], tuple[str, dict[str, Any]]]
"""Builds the vector index of a (frozen, read-only) store into a folder; returns the embedding model
id and the matching config, as JSON data, that the snapshot is served with."""
Keeper = Callable[[Store], None]
"""Writes what the bundle's store keeps besides its recordings (the tools' learned effects) into the
copy, before it is hashed: the id covers every meta value."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A verified snapshot bundle."""

    path: Path
    id: str
    manifest: dict[str, Any]

    @property
    def store_path(self) -> Path:
        """The bundle's SQLite store (open it with ``Store(path, readonly=True)``)."""
        return self.path / STORE_FILE

    @property
    def index_dir(self) -> Path:
        """The bundle's vector index folder."""
        return self.path / INDEX_DIR

    @property
    def manifest_path(self) -> Path:
        """The bundle's ``manifest.json``."""
        return self.path / MANIFEST

    @property
    def matching_config(self) -> dict[str, Any]:
        """The matching config the snapshot was frozen with (and must be served with), as JSON data."""
        config: dict[str, Any] = self.manifest["matching_config"]
        return config


@dataclass(frozen=True, slots=True)
class SnapshotDiff:
    """What differs between two snapshots: recorded calls (by call key and result), and the settings
    that decide how calls are matched (embedding model, matching config, redaction rules, index)."""

    added: list[str]
    removed: list[str]
    changed: list[str]
    settings: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        """True when both snapshots answer every call the same way (their ids are equal)."""
        return not (self.added or self.removed or self.changed or self.settings)


def content_hash(store: Store) -> str:
    """sha256 over the store's recorded content (its canonical JSONL export)."""
    digest = hashlib.sha256()
    for line in export_lines(store):
        digest.update(line.encode("utf-8"))
    return digest.hexdigest()


def _snapshot_id(content: str, model: str, config: dict[str, Any], meta: str, index: str) -> str:
    material = json.dumps(
        {"content": content, "model": model, "config": config, "meta": meta, "index": index}, sort_keys=True
    )
    return "snap-" + hashlib.sha256(material.encode("utf-8")).hexdigest()[:16]


def _meta_hash(store: Store) -> str:
    """sha256 over every meta value of a store: the redaction rules, the kept tool effects, ….

    What a replay reads besides the recordings, so the id pins it: kept effects rewritten in a
    bundle (its file hashes fixed) change the id.
    """
    return hashlib.sha256(json.dumps(store.metas(), sort_keys=True).encode("utf-8")).hexdigest()


def _index_hash(files: dict[str, str]) -> str:
    """sha256 over the index folder's files (names and content hashes, from :func:`_file_hashes`)."""
    prefix = INDEX_DIR + "/"
    listed = {name: sha for name, sha in files.items() if name.startswith(prefix)}
    return hashlib.sha256(json.dumps(listed, sort_keys=True).encode("utf-8")).hexdigest()


def _file_hashes(folder: Path) -> dict[str, str]:
    hashes: dict[str, str] = {}
    for path in folder.rglob("*"):
        if path.is_symlink():  # its target may lie outside the bundle, and change after it is hashed
            raise SnapshotError(
                f"{folder}: {path.relative_to(folder).as_posix()} is a symbolic link; a bundle holds its "
                "files itself — the bundle was tampered with, re-freeze it"
            )
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        hashes[path.relative_to(folder).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


def freeze(
    db: str | Path, out: str | Path, build_index: IndexBuilder, keep: Keeper | None = None
) -> Snapshot:
    """Write a read-only snapshot bundle of a store.

    Args:
        db: The store to freeze (it must exist).
        out: The bundle folder to create; it must not exist yet.
        build_index: Builds the vector index into the bundle and says which embedding model and
            matching config it used (see :data:`IndexBuilder`).
        keep: Writes what the bundle's store keeps besides its recordings (see :data:`Keeper`).

    Returns:
        The new snapshot.

    Raises:
        SnapshotError: ``out`` exists already or cannot be written.
        StoreError: The store is missing or cannot be read.
    """
    out = Path(out)
    if out.exists():
        raise SnapshotError(f"{out}: already exists; choose a new path (snapshots are never overwritten)")
    with Store(db, readonly=True) as source:  # a missing store is refused before anything is written
        _make_folder(out)
        try:
            source.copy_to(out / STORE_FILE)
            if keep is not None:
                with Store(out / STORE_FILE) as copy:
                    keep(copy)
                    copy.conn.execute("PRAGMA journal_mode=DELETE")  # read as one file, as copied
            manifest = _finish(Path(db), out, build_index)
        except BaseException:
            shutil.rmtree(out, ignore_errors=True)
            raise
    return Snapshot(out, str(manifest["id"]), manifest)


def _make_folder(out: Path) -> None:
    try:
        out.mkdir(parents=True)
    except OSError as exc:
        raise SnapshotError(
            f"{out}: cannot create the snapshot folder: {exc.strerror or exc}; choose a writable path"
        ) from exc


def _finish(db: Path, out: Path, build_index: IndexBuilder) -> dict[str, Any]:
    """Index the copied store, write the manifest and make the bundle read-only."""
    try:
        with Store(out / STORE_FILE, readonly=True) as frozen:
            content = content_hash(frozen)
            (out / INDEX_DIR).mkdir()
            model, matching = build_index(frozen, out / INDEX_DIR)  # reads the copied embedding cache
            counts = {"calls": len(frozen.recordings()), "servers": len(frozen.servers())}
            redaction = frozen.meta(RULES_META_KEY)
            meta = _meta_hash(frozen)
        drop_embedding_cache(out / STORE_FILE)  # the id does not cover it: a served query never reads it
        files = _file_hashes(out)
        index = _index_hash(files)
        manifest = {
            "format": FORMAT,
            "id": _snapshot_id(content, model, matching, meta, index),
            "content_sha256": content,
            "index_sha256": index,
            "meta_sha256": meta,
            "embedding_model": model,
            "matching_config": matching,
            "redaction": redaction,
            "created_at": utc_now(),
            "source": str(db),
            "counts": counts,
            "files": files,
        }
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        for path in out.rglob("*"):
            if path.is_file():
                path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    except OSError as exc:
        where = exc.filename or out
        raise SnapshotError(f"{where}: cannot write the snapshot: {exc.strerror or exc}") from exc
    return manifest


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest of a bundle, without verifying anything."""
    manifest_path = Path(path) / MANIFEST
    try:
        manifest: dict[str, Any] = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise SnapshotError(
            f"{path}: not a snapshot (no {MANIFEST}); create one with `replay-sim snapshot freeze`"
        ) from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise SnapshotError(f"{manifest_path}: unreadable manifest: {exc}") from exc
    if manifest.get("format") != FORMAT:
        raise SnapshotError(f"{manifest_path}: snapshot format {manifest.get('format')!r}, expected {FORMAT}")
    return manifest


def verify(path: str | Path) -> Snapshot:
    """Check a bundle against its manifest: every file hash, the content and index hashes, and the id.

    The id is recomputed from what the bundle holds, so a file rewritten together with its hash in
    the manifest is refused too.

    Raises:
        SnapshotError: Naming the first file or hash that does not match.
    """
    path = Path(path)
    manifest = read_manifest(path)
    try:
        on_disk = _file_hashes(path)
    except OSError as exc:
        raise SnapshotError(f"{exc.filename or path}: unreadable: {exc.strerror or exc}") from exc
    on_disk.pop(MANIFEST, None)
    for name in sorted(set(manifest["files"]) | set(on_disk)):
        if manifest["files"].get(name) != on_disk.get(name):
            state = (
                "missing"
                if name not in on_disk
                else ("unexpected" if name not in manifest["files"] else "modified")
            )
            raise SnapshotError(f"{path}: {name} is {state}; the bundle was tampered with — re-freeze it")
    try:
        with Store(path / STORE_FILE, readonly=True) as store:
            content = content_hash(store)
            meta = _meta_hash(store)
            cached = store.embedding_cache_size()
    except StoreError as exc:
        raise SnapshotError(f"{path}: store unreadable: {exc}") from exc
    if cached:
        raise SnapshotError(
            f"{path}: {STORE_FILE} holds {cached} cached embeddings, which a frozen bundle never has; "
            "the bundle was tampered with — re-freeze it"
        )
    index = _index_hash(on_disk)
    if index != manifest.get("index_sha256"):
        raise SnapshotError(
            f"{path}: the {INDEX_DIR}/ files do not match the manifest's index hash; "
            "the bundle was tampered with — re-freeze it"
        )
    expected = _snapshot_id(content, manifest["embedding_model"], manifest["matching_config"], meta, index)
    if (
        content != manifest["content_sha256"]
        or meta != manifest.get("meta_sha256")
        or expected != manifest["id"]
    ):
        raise SnapshotError(
            f"{path}: content, index and settings do not hash to manifest id {manifest['id']}; "
            "the bundle was tampered with — re-freeze it"
        )
    return Snapshot(path, manifest["id"], manifest)


def _answers(path: Path) -> dict[str, str]:
    with Store(path / STORE_FILE, readonly=True) as store:
        answers: dict[str, list[str]] = {}
        for rec in store.recordings():
            answer = json.dumps({"result": rec.result, "error": rec.error}, sort_keys=True)
            answers.setdefault(f"{rec.server} {rec.method} {rec.name} {rec.key[:12]}", []).append(answer)
    return {key: json.dumps(values) for key, values in answers.items()}


_SETTINGS = {
    "embedding_model": "embedding_model",
    "matching_config": "matching_config",
    "redaction": "redaction",
    "index": "index_sha256",
}


def diff(a: str | Path, b: str | Path) -> SnapshotDiff:
    """Compare two verified snapshots: recorded answers call key by call key, and matching settings.

    ``settings`` names what else decides answers and differs: ``embedding_model``,
    ``matching_config``, ``redaction``, ``index`` (the vectors; alone, it means the same
    recordings were embedded differently, e.g. by another model build).
    """
    first, second = verify(a), verify(b)
    left, right = _answers(first.path), _answers(second.path)
    return SnapshotDiff(
        added=sorted(set(right) - set(left)),
        removed=sorted(set(left) - set(right)),
        changed=sorted(k for k in set(left) & set(right) if left[k] != right[k]),
        settings=[name for name, key in _SETTINGS.items() if first.manifest[key] != second.manifest[key]],
    )
