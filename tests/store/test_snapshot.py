"""Snapshots: frozen, verifiable, tamper-evident bundles (real store, real index build)."""

from __future__ import annotations

import ast
import hashlib
import json
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import faiss
import numpy as np
import pytest

from replay_sim.errors import ConfigError, SnapshotError, StoreError
from replay_sim.replay.factory import open_replay
from replay_sim.resolve import snapshot as served_snapshot
from replay_sim.resolve.calibration import MatchConfig
from replay_sim.resolve.snapshot import freeze, match_config
from replay_sim.store import Store, snapshot

REPLAY_SIM = [sys.executable, "-m", "replay_sim"]


def _store(path: Path, texts: list[str]) -> Path:
    with Store(path) as store:
        store.put_listing(
            "notes",
            "tools/list",
            {
                "tools": [
                    {
                        "name": "search",
                        "inputSchema": {"type": "object", "properties": {"query": {"type": "string"}}},
                    }
                ]
            },
        )
        for n, text in enumerate(texts):
            store.record_call(
                "notes",
                "tools/call",
                {"name": "search", "arguments": {"query": text}},
                result={"content": [{"type": "text", "text": f"hit {n}"}]},
                recorded_at=f"2026-11-29T14:00:0{n}Z",
            )
    return path


@pytest.fixture
def frozen(tmp_path: Path) -> snapshot.Snapshot:
    return freeze(_store(tmp_path / "a.db", ["red apples", "green pears"]), tmp_path / "snap")


def test_a_frozen_bundle_verifies_and_is_read_only(frozen: snapshot.Snapshot) -> None:
    assert frozen.id.startswith("snap-")
    assert snapshot.verify(frozen.path).id == frozen.id
    assert frozen.manifest["counts"] == {"calls": 2, "servers": 0}
    assert frozen.manifest["embedding_model"]
    assert not frozen.store_path.stat().st_mode & stat.S_IWUSR
    with Store(frozen.store_path, readonly=True) as store:
        assert [r.arguments["query"] for r in store.recordings()] == ["red apples", "green pears"]


def test_the_same_recordings_frozen_twice_get_the_same_id(tmp_path: Path, frozen: snapshot.Snapshot) -> None:
    again = freeze(tmp_path / "a.db", tmp_path / "snap2")
    assert again.id == frozen.id


def test_a_tampered_store_is_refused(frozen: snapshot.Snapshot) -> None:
    frozen.store_path.chmod(0o644)
    conn = sqlite3.connect(frozen.store_path)
    conn.execute("UPDATE calls SET result = '{\"content\":[]}' WHERE id = 1")
    conn.commit()
    conn.close()
    with pytest.raises(SnapshotError, match=r"store\.db is modified"):
        snapshot.verify(frozen.path)


def test_a_removed_index_file_is_refused(frozen: snapshot.Snapshot) -> None:
    victim = next(p for p in frozen.index_dir.rglob("*") if p.is_file())
    victim.unlink()
    with pytest.raises(SnapshotError, match="missing"):
        snapshot.verify(frozen.path)


def test_freeze_refuses_to_overwrite(tmp_path: Path, frozen: snapshot.Snapshot) -> None:
    with pytest.raises(SnapshotError, match="already exists"):
        freeze(tmp_path / "a.db", frozen.path)


def test_diff_lists_changed_and_added_calls(tmp_path: Path, frozen: snapshot.Snapshot) -> None:
    b = freeze(_store(tmp_path / "b.db", ["red apples", "green pears", "blue plums"]), tmp_path / "snap-b")
    result = snapshot.diff(frozen.path, b.path)
    assert len(result.added) == 1 and not result.removed and not result.changed
    assert snapshot.diff(frozen.path, frozen.path).identical


def test_cli_freeze_verify_inspect_diff(tmp_path: Path) -> None:
    db = _store(tmp_path / "a.db", ["one"])
    out = subprocess.run(
        [*REPLAY_SIM, "snapshot", "freeze", "--db", str(db), "--out", str(tmp_path / "s")],
        check=True,
        capture_output=True,
        text=True,
    )
    snap_id = out.stdout.strip()
    verified = subprocess.run(
        [*REPLAY_SIM, "snapshot", "verify", str(tmp_path / "s")], check=True, capture_output=True, text=True
    )
    assert verified.stdout.strip() == f"{snap_id} ok"
    inspected = subprocess.run(
        [*REPLAY_SIM, "snapshot", "inspect", str(tmp_path / "s")], check=True, capture_output=True, text=True
    )
    assert snap_id in inspected.stdout
    same = subprocess.run([*REPLAY_SIM, "snapshot", "diff", str(tmp_path / "s"), str(tmp_path / "s")])
    assert same.returncode == 0
    missing = subprocess.run(
        [*REPLAY_SIM, "snapshot", "verify", str(tmp_path)], capture_output=True, text=True
    )
    assert missing.returncode == 1 and "not a snapshot" in missing.stderr


def test_a_snapshot_is_served_with_the_matching_config_it_was_frozen_with(tmp_path: Path) -> None:
    config = MatchConfig.from_dict(
        {"defaults": {"floor": 0.95}, "tools": {"notes/search": {"free_text": ["query"]}}}
    )
    frozen = freeze(_store(tmp_path / "a.db", ["red apples"]), tmp_path / "snap", config=config)
    assert match_config(frozen) == config
    assert frozen.id != freeze(tmp_path / "a.db", tmp_path / "plain").id  # the config is part of the id
    assert open_replay(snapshot=frozen.path).resolver.config == config
    with pytest.raises(ConfigError, match="frozen with"):
        open_replay(snapshot=frozen.path, match_config=MatchConfig())


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*REPLAY_SIM, *args], capture_output=True, text=True)


def test_the_store_stage_freezes_with_any_injected_index_builder(tmp_path: Path) -> None:
    def build(store: Store, folder: Path) -> tuple[str, dict]:
        (folder / "vectors.bin").write_bytes(b"x" * len(store.recordings()))
        return "fake-model", {"floor": 1}

    frozen = snapshot.freeze(_store(tmp_path / "a.db", ["red apples"]), tmp_path / "snap", build)
    assert frozen.manifest["embedding_model"] == "fake-model"
    assert frozen.matching_config == {"floor": 1}
    assert snapshot.verify(frozen.path).id == frozen.id
    assert (frozen.index_dir / "vectors.bin").read_bytes() == b"x"


def test_the_store_stage_imports_no_later_stage() -> None:
    package = Path(snapshot.__file__).parent
    later = ("replay_sim.resolve", "replay_sim.replay", "replay_sim.record", "replay_sim.cli")
    found = []
    for source in package.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            found += [f"{source.name}: {name}" for name in names if name.startswith(later)]
    assert found == []


def test_freezing_a_missing_store_writes_nothing(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no such recording store"):
        freeze(tmp_path / "typo.db", tmp_path / "snap")
    assert not (tmp_path / "snap").exists()


def test_freeze_onto_a_file_or_under_one_is_a_one_line_error(tmp_path: Path) -> None:
    db = _store(tmp_path / "a.db", ["one"])
    (tmp_path / "taken").write_text("not a folder")
    onto = _run("snapshot", "freeze", "--db", str(db), "--out", str(tmp_path / "taken"))
    assert onto.returncode == 1 and onto.stderr.count("\n") == 1
    assert f"{tmp_path / 'taken'}: already exists" in onto.stderr
    under = _run("snapshot", "freeze", "--db", str(db), "--out", str(tmp_path / "taken" / "snap"))
    assert under.returncode == 1 and under.stderr.count("\n") == 1, under.stderr
    assert f"{tmp_path / 'taken' / 'snap'}: cannot create the snapshot folder" in under.stderr
    assert (tmp_path / "taken").read_text() == "not a folder"


def test_freeze_of_a_mistyped_store_is_a_one_line_error(tmp_path: Path) -> None:
    failed = _run("snapshot", "freeze", "--db", str(tmp_path / "typo.db"), "--out", str(tmp_path / "s"))
    assert failed.returncode == 1 and failed.stderr.count("\n") == 1
    assert "typo.db: no such recording store" in failed.stderr
    assert not (tmp_path / "s").exists() and not (tmp_path / "typo.db").exists()


def _rewrite_two_vectors(frozen: snapshot.Snapshot) -> None:
    """What an attacker does to change semantic answers: swap two recordings' vectors, fix the manifest."""
    (part_file,) = frozen.index_dir.glob("*.faiss")
    index = faiss.read_index(str(part_file))
    ids = faiss.vector_to_array(index.id_map).astype(np.int64)
    vectors = np.stack([index.reconstruct(int(i)) for i in ids])
    swapped = faiss.IndexIDMap2(faiss.IndexFlatIP(vectors.shape[1]))
    swapped.add_with_ids(vectors[[1, 0]], ids)
    part_file.chmod(0o644)
    faiss.write_index(swapped, str(part_file))
    manifest = json.loads(frozen.manifest_path.read_text())
    name = part_file.relative_to(frozen.path).as_posix()
    manifest["files"][name] = hashlib.sha256(part_file.read_bytes()).hexdigest()
    frozen.manifest_path.chmod(0o644)
    frozen.manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def test_rewritten_index_vectors_are_refused_even_with_the_manifest_hash_fixed(
    frozen: snapshot.Snapshot,
) -> None:
    _rewrite_two_vectors(frozen)
    with pytest.raises(SnapshotError, match="index"):
        snapshot.verify(frozen.path)


def test_the_snapshot_id_covers_the_index_so_equal_ids_mean_equal_vectors(
    tmp_path: Path, frozen: snapshot.Snapshot
) -> None:
    assert frozen.manifest["index_sha256"]
    again = freeze(tmp_path / "a.db", tmp_path / "snap2")
    assert again.manifest["index_sha256"] == frozen.manifest["index_sha256"] and again.id == frozen.id


def test_a_bundle_store_carries_no_embedding_cache_a_query_could_be_answered_from(
    tmp_path: Path, embedder: object
) -> None:
    db = _store(tmp_path / "a.db", ["red apples", "green pears"])
    with Store(db) as store:  # a cache filled by `index build` or a served query
        store.cache_embeddings("any-model", {"sha": b"\0" * 8})
    frozen = freeze(db, tmp_path / "snap")
    assert frozen.id == freeze(_store(tmp_path / "b.db", ["red apples", "green pears"]), tmp_path / "s2").id
    frozen.store_path.chmod(0o644)
    with Store(frozen.store_path) as store:
        assert store.cached_embeddings("any-model", ["sha"]) == {}
        store.cache_embeddings("any-model", {"sha": b"\1" * 8})  # smuggled in, manifest hash fixed
    _fix_file_hash(frozen, frozen.store_path)
    with pytest.raises(SnapshotError, match="embedding"):
        snapshot.verify(frozen.path)


def _fix_file_hash(frozen: snapshot.Snapshot, path: Path) -> None:
    """Rewrite the manifest's hash of a tampered file, as an attacker would."""
    manifest = json.loads(frozen.manifest_path.read_text())
    name = path.relative_to(frozen.path).as_posix()
    manifest["files"][name] = hashlib.sha256(path.read_bytes()).hexdigest()
    frozen.manifest_path.chmod(0o644)
    frozen.manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def test_diff_reports_snapshots_of_the_same_calls_matched_differently(tmp_path: Path) -> None:
    db = _store(tmp_path / "a.db", ["red apples"])
    plain = freeze(db, tmp_path / "plain")
    strict = freeze(db, tmp_path / "strict", config=MatchConfig.from_dict({"defaults": {"floor": 0.97}}))
    result = snapshot.diff(plain.path, strict.path)
    assert result.settings == ["matching_config"] and not result.identical


def test_a_snapshot_served_with_another_index_folder_is_refused(
    tmp_path: Path, frozen: snapshot.Snapshot
) -> None:
    other = tmp_path / "other-index"
    other.mkdir()
    with pytest.raises(ConfigError, match=rf"its own index .*{frozen.id}.*drop --index-dir"):
        open_replay(snapshot=frozen.path, index_dir=other)
    assert open_replay(snapshot=frozen.path, index_dir=frozen.index_dir).snapshot == frozen.id  # its own
    run = subprocess.run(
        [*REPLAY_SIM, "serve", "--snapshot", str(frozen.path), "--index-dir", str(other), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1 and run.stderr.count("\n") == 1, run.stderr
    assert "drop --index-dir" in run.stderr


def _resign(frozen: snapshot.Snapshot) -> str:
    """Rewrite the manifest as a forger would: file hashes, index hash and id made to match the bundle."""
    manifest = json.loads(frozen.manifest_path.read_text())
    files = snapshot._file_hashes(frozen.path)
    files.pop(snapshot.MANIFEST)
    manifest["files"] = files
    manifest["index_sha256"] = snapshot._index_hash(files)
    manifest["id"] = snapshot._snapshot_id(
        manifest["content_sha256"],
        manifest["embedding_model"],
        manifest["matching_config"],
        manifest["meta_sha256"],
        manifest["index_sha256"],
    )
    frozen.manifest_path.chmod(0o644)
    frozen.manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return str(manifest["id"])


def test_a_bundle_whose_index_reads_a_file_outside_it_is_refused(
    tmp_path: Path, frozen: snapshot.Snapshot
) -> None:
    (part_file,) = frozen.index_dir.glob("*.faiss")
    outside = tmp_path / "outside.faiss"
    outside.write_bytes(part_file.read_bytes())
    index_manifest = frozen.index_dir / "manifest.json"
    entries = json.loads(index_manifest.read_text())
    entries["partitions"][0]["file"] = "../../outside.faiss"
    frozen.index_dir.chmod(0o755)
    index_manifest.chmod(0o644)
    index_manifest.write_text(json.dumps(entries))
    part_file.chmod(0o644)
    part_file.unlink()
    _resign(frozen)  # every hash of the bundle matches: only outside.faiss is not covered by the id
    for opening in (served_snapshot.open_snapshot, lambda path: open_replay(snapshot=path)):
        with pytest.raises(SnapshotError, match=r"names file '\.\./\.\./outside\.faiss'.*tampered"):
            opening(frozen.path)
    run = _run("snapshot", "verify", str(frozen.path))
    assert run.returncode == 1 and "outside.faiss" in run.stderr and run.stderr.count("\n") == 1


def test_a_bundle_file_that_is_a_symbolic_link_is_refused(tmp_path: Path, frozen: snapshot.Snapshot) -> None:
    (part_file,) = frozen.index_dir.glob("*.faiss")
    outside = tmp_path / "outside.faiss"
    outside.write_bytes(part_file.read_bytes())  # the same bytes: every hash still matches
    frozen.index_dir.chmod(0o755)
    part_file.chmod(0o644)
    part_file.unlink()
    part_file.symlink_to(outside)
    with pytest.raises(SnapshotError, match=rf"{part_file.name} is a symbolic link"):
        snapshot.verify(frozen.path)
