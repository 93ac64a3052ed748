"""Snapshots: frozen, verifiable, tamper-evident bundles (real store, real index build)."""

from __future__ import annotations

import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from replay_sim.errors import ConfigError, SnapshotError
from replay_sim.replay.factory import open_replay
from replay_sim.resolve.calibration import MatchConfig
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
    return snapshot.freeze(_store(tmp_path / "a.db", ["red apples", "green pears"]), tmp_path / "snap")


def test_a_frozen_bundle_verifies_and_is_read_only(frozen: snapshot.Snapshot) -> None:
    assert frozen.id.startswith("snap-")
    assert snapshot.verify(frozen.path).id == frozen.id
    assert frozen.manifest["counts"] == {"calls": 2, "servers": 0}
    assert frozen.manifest["embedding_model"]
    assert not frozen.store_path.stat().st_mode & stat.S_IWUSR
    with Store(frozen.store_path, readonly=True) as store:
        assert [r.arguments["query"] for r in store.recordings()] == ["red apples", "green pears"]


def test_the_same_recordings_frozen_twice_get_the_same_id(tmp_path: Path, frozen: snapshot.Snapshot) -> None:
    again = snapshot.freeze(tmp_path / "a.db", tmp_path / "snap2")
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
        snapshot.freeze(tmp_path / "a.db", frozen.path)


def test_diff_lists_changed_and_added_calls(tmp_path: Path, frozen: snapshot.Snapshot) -> None:
    b = snapshot.freeze(
        _store(tmp_path / "b.db", ["red apples", "green pears", "blue plums"]), tmp_path / "snap-b"
    )
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
    frozen = snapshot.freeze(_store(tmp_path / "a.db", ["red apples"]), tmp_path / "snap", config=config)
    assert frozen.match_config == config
    assert (
        frozen.id != snapshot.freeze(tmp_path / "a.db", tmp_path / "plain").id
    )  # the config is part of the id
    assert open_replay(snapshot=frozen.path).resolver.config == config
    with pytest.raises(ConfigError, match="frozen with"):
        open_replay(snapshot=frozen.path, match_config=MatchConfig())
