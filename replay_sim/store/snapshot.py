"""Frozen snapshots: a read-only bundle an evaluator can cite by id.

A bundle is a folder holding ``store.db`` (written with ``VACUUM INTO``), the vector index built
from it (``index/``) and ``manifest.json``. The snapshot id is a hash over the recorded content
(the store's JSONL export), the embedding model id, the matching config and the redaction rules, so
the same recordings frozen twice get the same id, and any change to them — or a tampered file — is
detected.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from replay_sim.errors import SnapshotError, StoreError
from replay_sim.redaction import RULES_META_KEY
from replay_sim.resolve.calibration import MatchConfig
from replay_sim.store import Store, utc_now
from replay_sim.store.interchange import export_lines

__all__ = ["Snapshot", "SnapshotDiff", "diff", "freeze", "open_snapshot", "verify"]

MANIFEST = "manifest.json"
STORE_FILE = "store.db"
INDEX_DIR = "index"
FORMAT = 1

# Builds the vector index of a store into a folder; returns (embedding model id, matching config).
IndexBuilder = Callable[[Store, Path], tuple[str, dict[str, Any]]]


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
    def match_config(self) -> MatchConfig:
        """The matching config the snapshot was frozen with (and must be served with)."""
        return MatchConfig.from_dict(self.manifest["matching_config"], f"{self.path}/{MANIFEST}")


@dataclass(frozen=True, slots=True)
class SnapshotDiff:
    """What differs between the recorded calls of two snapshots (by call key and result)."""

    added: list[str]
    removed: list[str]
    changed: list[str]

    @property
    def identical(self) -> bool:
        """True when both snapshots answer every call the same way."""
        return not (self.added or self.removed or self.changed)


def content_hash(store: Store) -> str:
    """sha256 over the store's recorded content (its canonical JSONL export)."""
    digest = hashlib.sha256()
    for line in export_lines(store):
        digest.update(line.encode("utf-8"))
    return digest.hexdigest()


def _snapshot_id(content: str, model: str, config: dict[str, Any], redaction: Any) -> str:
    material = json.dumps(
        {"content": content, "model": model, "config": config, "redaction": redaction}, sort_keys=True
    )
    return "snap-" + hashlib.sha256(material.encode("utf-8")).hexdigest()[:16]


def _file_hashes(folder: Path) -> dict[str, str]:
    hashes: dict[str, str] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        hashes[path.relative_to(folder).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


def freeze(
    db: str | Path,
    out: str | Path,
    *,
    config: MatchConfig | None = None,
    build_index: IndexBuilder | None = None,
) -> Snapshot:
    """Write a read-only snapshot bundle of a store.

    Args:
        db: The store to freeze.
        out: The bundle folder to create; it must not exist yet.
        config: The matching config the snapshot is served with (defaults when None).
        build_index: Builds the vector index into the bundle; the default is replay-sim's index.

    Returns:
        The new snapshot.

    Raises:
        SnapshotError: ``out`` exists already.
        StoreError: The store cannot be read.
    """
    out = Path(out)
    if out.exists():
        raise SnapshotError(f"{out}: already exists; choose a new path (snapshots are never overwritten)")
    if build_index is None:
        from replay_sim.resolve.index import build_snapshot_index

        build_index = partial(build_snapshot_index, config=config)
    out.mkdir(parents=True)
    try:
        with Store(db, readonly=True) as source:
            source.copy_to(out / STORE_FILE)
        with Store(out / STORE_FILE, readonly=True) as frozen:
            content = content_hash(frozen)
            (out / INDEX_DIR).mkdir()
            model, matching = build_index(frozen, out / INDEX_DIR)
            counts = {"calls": len(frozen.recordings()), "servers": len(frozen.servers())}
            redaction = frozen.meta(RULES_META_KEY)
        manifest = {
            "format": FORMAT,
            "id": _snapshot_id(content, model, matching, redaction),
            "content_sha256": content,
            "embedding_model": model,
            "matching_config": matching,
            "redaction": redaction,
            "created_at": utc_now(),
            "source": str(Path(db)),
            "counts": counts,
            "files": _file_hashes(out),
        }
        (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    for path in out.rglob("*"):
        if path.is_file():
            path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    return Snapshot(out, str(manifest["id"]), manifest)


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
    """Check a bundle against its manifest: every file hash, the content hash and the id.

    Raises:
        SnapshotError: Naming the first file or hash that does not match.
    """
    path = Path(path)
    manifest = read_manifest(path)
    on_disk = _file_hashes(path)
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
            redaction = store.meta(RULES_META_KEY)
    except StoreError as exc:
        raise SnapshotError(f"{path}: store unreadable: {exc}") from exc
    expected = _snapshot_id(content, manifest["embedding_model"], manifest["matching_config"], redaction)
    if content != manifest["content_sha256"] or expected != manifest["id"]:
        raise SnapshotError(
            f"{path}: content hash does not match manifest id {manifest['id']}; the bundle was tampered with"
        )
    return Snapshot(path, manifest["id"], manifest)


def open_snapshot(path: str | Path) -> Snapshot:
    """Verify a bundle and return it, ready to serve (the replay server's entry point)."""
    return verify(path)


def _answers(path: Path) -> dict[str, str]:
    with Store(path / STORE_FILE, readonly=True) as store:
        answers: dict[str, list[str]] = {}
        for rec in store.recordings():
            answer = json.dumps({"result": rec.result, "error": rec.error}, sort_keys=True)
            answers.setdefault(f"{rec.server} {rec.method} {rec.name} {rec.key[:12]}", []).append(answer)
    return {key: json.dumps(values) for key, values in answers.items()}


def diff(a: str | Path, b: str | Path) -> SnapshotDiff:
    """Compare the recorded answers of two verified snapshots, call key by call key."""
    left, right = _answers(verify(a).path), _answers(verify(b).path)
    return SnapshotDiff(
        added=sorted(set(right) - set(left)),
        removed=sorted(set(left) - set(right)),
        changed=sorted(k for k in set(left) & set(right) if left[k] != right[k]),
    )
