"""Snapshots served by replay-sim: frozen with its vector index, served with their matching config.

The store stage writes and verifies bundles (:mod:`replay_sim.store.snapshot`) without knowing
how an index is built or what a matching config means; this module supplies both.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from replay_sim.errors import SnapshotError, VectorIndexError
from replay_sim.resolve.build import build_index
from replay_sim.resolve.calibration import MatchConfig
from replay_sim.resolve.confidence.learning import learn as learn_confidence
from replay_sim.resolve.embedding import CachedEmbedder, default_embedder
from replay_sim.resolve.index import MANIFEST, partition_file
from replay_sim.resolve.schemas import RecordedSchemas
from replay_sim.resolve.tooleffects import keep_effects
from replay_sim.store import Store
from replay_sim.store import snapshot as bundle
from replay_sim.store.interchange import fold_in
from replay_sim.store.snapshot import Snapshot

__all__ = ["build_snapshot_index", "freeze", "match_config", "open_snapshot", "verify"]


def build_snapshot_index(
    store: Store,
    directory: Path,
    config: MatchConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[str, dict[str, Any]]:
    """Build a snapshot's index (the :data:`~replay_sim.store.snapshot.IndexBuilder` replay-sim uses).

    Args:
        store: The frozen (read-only) store; cached embeddings are read from it.
        directory: The bundle's index folder.
        config: The matching config to record (defaults when None).
        progress: Called with (calls indexed, calls to index) as the index is built.

    Returns:
        ``(embedding model id, matching config as JSON data)``.
    """
    config = config or MatchConfig()
    embedder = CachedEmbedder(default_embedder(), store)
    build_index(store, RecordedSchemas(store, config), embedder, directory, progress=progress)
    # In the index folder: the snapshot id covers it. A snapshot's model never changes (its store
    # is read-only), so its leave-one-out examples are not kept: learned from every recording.
    learn_confidence(store, directory, config, full=True, keep=False)
    return embedder.model_id, config.as_dict()


def freeze(
    db: str | Path,
    out: str | Path,
    *,
    config: MatchConfig | None = None,
    fold: Sequence[str | Path] = (),
    progress: Callable[[int, int], None] | None = None,
) -> Snapshot:
    """Write a read-only snapshot bundle of a store, with replay-sim's vector index.

    The tools' learned effects are kept in the bundle's store (:func:`keep_effects`), so its
    replays read them instead of learning them on every start; the id covers them.

    Args:
        db: The store to freeze (it must exist).
        out: The bundle folder to create; it must not exist yet.
        config: The matching config the snapshot is served with (defaults when None).
        fold: More stores whose calls the bundle takes in, sessions kept whole (a served
            snapshot's sandbox answers, ``<bundle>.sandbox.db``); calls ``db`` has already are
            skipped. ``db`` itself is not changed.
        progress: Called with (calls indexed, calls to index) as the bundle's index is built.

    Returns:
        The new snapshot.

    Raises:
        SnapshotError: ``out`` exists already or cannot be written.
        StoreError: The store (or a store to fold in) is missing or cannot be read.
        VectorIndexError: The index cannot be built.
    """

    def keep(copy: Store) -> None:
        for path in fold:
            fold_in(copy, path)
        keep_effects(copy, config=config)

    return bundle.freeze(db, out, partial(build_snapshot_index, config=config, progress=progress), keep)


def match_config(snapshot: Snapshot) -> MatchConfig:
    """The matching config a snapshot was frozen with (and must be served with).

    Raises:
        ConfigError: The manifest's matching config is malformed (names the manifest).
    """
    return MatchConfig.from_dict(snapshot.matching_config, str(snapshot.manifest_path))


def verify(path: str | Path) -> Snapshot:
    """Verify a bundle and the files its index reads: a snapshot serves only what its id covers.

    :func:`replay_sim.store.snapshot.verify` checks every file of the bundle against the id; this
    also checks that each partition the index manifest names is one of those files (its own name in
    the bundle's ``index/``), so no file outside the bundle decides an answer.

    Raises:
        SnapshotError: The bundle is missing or tampered with, or its index names a file it does
            not hold (names the bundle and the file).
    """
    opened = bundle.verify(path)
    manifest = opened.index_dir / MANIFEST
    try:
        partitions = json.loads(manifest.read_text(encoding="utf-8")).get("partitions", [])
        files = [partition_file(manifest, entry) for entry in partitions]
    except (OSError, ValueError, AttributeError) as exc:
        raise SnapshotError(f"{manifest}: unreadable index manifest ({exc}); re-freeze the bundle") from exc
    except VectorIndexError as exc:
        raise SnapshotError(f"{opened.path}: {exc}; the bundle was tampered with — re-freeze it") from exc
    for name in files:
        if f"{bundle.INDEX_DIR}/{name}" not in opened.manifest["files"]:
            raise SnapshotError(
                f"{opened.path}: its index names {bundle.INDEX_DIR}/{name}, which the bundle does not hold; "
                "re-freeze it"
            )
    return opened


def open_snapshot(path: str | Path) -> Snapshot:
    """Verify a bundle (:func:`verify`) and return it, ready to serve (the replay server's entry point)."""
    return verify(path)
