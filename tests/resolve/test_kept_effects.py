"""Learned tool effects kept in the store: read back while nothing they were learned from moved."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from resolver_helpers import record_x, text, x_tool

from replay_sim.effects import Effect, Verdict
from replay_sim.errors import SnapshotError
from replay_sim.replay.factory import open_replay
from replay_sim.resolve import tooleffects
from replay_sim.resolve.calibration import MatchConfig, ToolOverride
from replay_sim.resolve.resolution import Tier
from replay_sim.resolve.resolver import Resolver
from replay_sim.resolve.schemas import RecordedSchemas
from replay_sim.resolve.snapshot import build_snapshot_index, freeze
from replay_sim.resolve.tooleffects import (
    EFFECTS_META_PREFIX,
    keep_effects,
    recorded_effects,
    remembered_effects,
)
from replay_sim.store import ServerRecord, Store, snapshot
from replay_sim.store.interchange import export_jsonl

RO = {"readOnlyHint": True}
KEY = EFFECTS_META_PREFIX + "srv"


def _store(path: Path) -> Store:
    """``get`` (read-only) seen unchanged around two ``put`` calls, ``tally`` numbering its calls."""
    store = Store(path)
    store.put_listing("srv", "tools/list", {"tools": [x_tool("get", RO), x_tool("put"), x_tool("tally", RO)]})
    record_x(store, "s1", "get", "k", "unset")
    record_x(store, "s1", "put", "k", "ok")
    record_x(store, "s1", "get", "k", "unset")
    record_x(store, "s1", "put", "j", "ok")  # two different calls: one alone would say little
    record_x(store, "s1", "get", "k", "unset")
    for n, x in enumerate(["a", "b", "a"], 1):
        record_x(store, "s2", "tally", x, f"#{n} {x}")
    return store


def _learned_only_by(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Count the servers whose effects are learned from the recordings (not read back)."""
    learned: list[str] = []
    real = tooleffects._learned

    def counting(store: Store, server: str, *args: Any) -> Any:
        learned.append(server)
        return real(store, server, *args)

    monkeypatch.setattr(tooleffects, "_learned", counting)
    return learned


def _effects(store: Store, config: MatchConfig | None = None) -> dict[str, Verdict]:
    return remembered_effects(store, "srv", RecordedSchemas(store, config), config)


def test_effects_learned_once_are_read_back_from_the_store_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    learned = _learned_only_by(monkeypatch)
    first = _effects(_store(tmp_path / "r.db"))
    assert first == recorded_effects(
        Store(tmp_path / "r.db"), "srv", RecordedSchemas(Store(tmp_path / "r.db"))
    )
    assert first["tally"].effect is Effect.CHANGES and first["tally"].contrary is not None
    assert first["put"].effect is Effect.NONE and first["put"].witnesses
    learned.clear()
    again = Store(tmp_path / "r.db")  # another process, later
    assert _effects(again) == first and learned == []
    assert Resolver(again, index_dir=None, semantic=False).lookup.effects("srv") == first
    assert learned == []


def test_kept_effects_are_learned_again_once_calls_are_recorded(tmp_path: Path) -> None:
    store = _store(tmp_path / "r.db")
    assert _effects(store)["put"].effect is Effect.NONE
    recorder = Store(tmp_path / "r.db")  # another connection adds what shows ``put`` changes state
    record_x(recorder, "s3", "get", "k", "unset")
    record_x(recorder, "s3", "put", "k", "ok")
    record_x(recorder, "s3", "get", "k", "set")
    assert _effects(store)["put"].effect is Effect.CHANGES
    assert Store(tmp_path / "r.db").meta(KEY)["verdicts"]["put"]["effect"] == "changes"
    # A server already running notices it on its next call, as before.
    resolver = Resolver(Store(tmp_path / "r.db"), index_dir=None, semantic=False)
    assert resolver.lookup.effect("srv", "put").effect is Effect.CHANGES


def test_kept_effects_follow_a_new_listing_and_the_matching_config(tmp_path: Path) -> None:
    store = _store(tmp_path / "r.db")
    assert _effects(store)["put"].effect is Effect.NONE
    config = MatchConfig(tools={"srv/put": ToolOverride(read_only=False)})
    assert (_effects(store, config)["put"].effect, _effects(store, config)["put"].source) == (
        Effect.CHANGES,
        "config",
    )
    assert _effects(store)["put"].effect is Effect.NONE
    store.put_listing(
        "srv", "tools/list", {"tools": [x_tool("get", RO), x_tool("put", {"readOnlyHint": False})]}
    )
    assert _effects(store)["put"].source == "annotation"
    store.put_listing("srv", "tools/list", {"tools": [x_tool("get", RO), x_tool("put"), x_tool("new")]})
    found = _effects(store)
    assert found["put"].effect is Effect.NONE and found["new"].effect is Effect.UNKNOWN


def test_kept_effects_learned_by_other_code_or_unreadable_are_learned_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(tmp_path / "r.db")
    first = _effects(store)
    learned = _learned_only_by(monkeypatch)
    kept = store.meta(KEY)
    store.set_meta(KEY, {**kept, "learner": "older code"})
    assert _effects(store) == first and learned == ["srv"]
    assert store.meta(KEY)["learner"] == kept["learner"]
    for broken in (
        {"calls": kept["calls"]},
        [1, 2],
        "x",
        {**kept, "verdicts": {"put": {**kept["verdicts"]["put"], "effect": "maybe"}}},
    ):
        store.set_meta(KEY, broken)
        assert _effects(store) == first
    assert learned == ["srv"] * 5


def test_a_read_only_store_learns_effects_without_keeping_them(tmp_path: Path) -> None:
    _store(tmp_path / "r.db").close()
    snapshot = Store(tmp_path / "r.db", readonly=True)
    assert _effects(snapshot)["tally"].effect is Effect.CHANGES
    assert snapshot.meta(KEY) is None


def test_effects_are_not_kept_while_another_process_writes_the_store(tmp_path: Path) -> None:
    store = _store(tmp_path / "r.db")
    other = sqlite3.connect(tmp_path / "r.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # holds the write lock
    try:
        assert _effects(store)["tally"].effect is Effect.CHANGES  # learned, never waiting for the lock
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert store.meta(KEY) is None
    assert _effects(store)["tally"].effect is Effect.CHANGES
    assert store.meta(KEY) is not None


def test_an_exact_hit_is_answered_alike_with_kept_and_learned_effects(tmp_path: Path) -> None:
    store = _store(tmp_path / "r.db")
    answers = []
    for _ in range(2):  # learned (and kept), then read back by a new resolver
        resolver = Resolver(Store(tmp_path / "r.db"), index_dir=None, semantic=False)
        trail = resolver.lookup.trail([])
        found = [resolver.resolve("srv", "tools/call", {"name": "tally", "arguments": {"x": "a"}}, trail)]
        resolver.advance(trail, found[0])
        found.append(resolver.resolve("srv", "tools/call", {"name": "tally", "arguments": {"x": "a"}}, trail))
        answers.append([(f.tier, f.recording.id if f.recording else None) for f in found])
    assert store.meta(KEY) is not None
    assert answers[0] == answers[1] and answers[0][0][0] is Tier.EXACT


def test_an_index_build_keeps_the_effects_so_the_next_replay_learns_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _store(tmp_path / "r.db").close()
    build = ["index", "build", "--db", str(tmp_path / "r.db"), "--index-dir", str(tmp_path / "index")]
    built = subprocess.run(
        [sys.executable, "-m", "replay_sim", *build],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    learned = _learned_only_by(monkeypatch)
    store = Store(tmp_path / "r.db")
    effects = Resolver(store, index_dir=None, semantic=False).lookup.effects("srv")
    assert learned == []
    assert effects == recorded_effects(store, "srv", RecordedSchemas(store))
    assert effects["tally"].effect is Effect.CHANGES and effects["put"].effect is Effect.NONE


def test_kept_effects_are_kept_for_every_server_and_left_alone_while_current(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(tmp_path / "r.db")
    store.record_call("other", "tools/call", {"name": "ping", "arguments": {}}, result=text("pong"))
    learned = _learned_only_by(monkeypatch)
    keep_effects(store)
    assert learned == ["other", "srv"]
    assert store.meta(EFFECTS_META_PREFIX + "other")["verdicts"].keys() == {"ping"}
    keep_effects(store)
    assert learned == ["other", "srv"]
    readonly = Store(tmp_path / "r.db", readonly=True)
    keep_effects(readonly)  # nothing to keep them in: not even learned
    assert learned == ["other", "srv"]


def test_a_frozen_snapshot_carries_the_kept_effects_its_replays_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _store(tmp_path / "r.db").close()
    config = MatchConfig(tools={"srv/put": ToolOverride(read_only=False)})
    frozen = freeze(tmp_path / "r.db", tmp_path / "snap", config=config)
    assert snapshot.verify(frozen.path).id == frozen.id  # kept before the bundle's files were hashed
    assert sorted(p.name for p in frozen.path.iterdir()) == ["index", "manifest.json", "store.db"]
    learned = _learned_only_by(monkeypatch)
    replay = open_replay(snapshot=frozen.path)
    effects = replay.resolver.lookup.effects("srv")
    assert learned == []
    assert effects["put"].source == "config" and effects["tally"].effect is Effect.CHANGES
    with Store(frozen.store_path, readonly=True) as bundled:
        assert effects == recorded_effects(bundled, "srv", RecordedSchemas(bundled, config), config)
    # The id covers them: a bundle frozen without them is another snapshot, and kept effects
    # rewritten in a bundle (its file hash fixed, as an attacker would) are refused.
    again = snapshot.freeze(
        tmp_path / "r.db", tmp_path / "unkept", partial(build_snapshot_index, config=config)
    )
    with Store(again.store_path, readonly=True) as unkept:
        assert unkept.meta(KEY) is None
    assert again.id != frozen.id
    frozen.store_path.chmod(0o644)
    with Store(frozen.store_path) as bundled:
        forged = bundled.meta(KEY)
        forged["verdicts"]["tally"] = forged["verdicts"]["put"]
        bundled.set_meta(KEY, forged)
        bundled.conn.execute("PRAGMA journal_mode=DELETE")  # one file again: only the meta differs
    manifest = json.loads(frozen.manifest_path.read_text())
    manifest["files"]["store.db"] = hashlib.sha256(frozen.store_path.read_bytes()).hexdigest()
    frozen.manifest_path.chmod(0o644)
    frozen.manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(SnapshotError, match="do not hash to manifest id"):
        snapshot.verify(frozen.path)


def test_calls_recorded_for_one_server_leave_the_effects_kept_for_another_current(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(tmp_path / "r.db")
    keep_effects(store)
    learned = _learned_only_by(monkeypatch)
    store.record_call("other", "tools/call", {"name": "ping", "arguments": {}}, result=text("pong"))
    assert _effects(store)["put"].effect is Effect.NONE
    assert learned == []  # srv's calls did not move: its kept verdicts are read back


def test_a_replay_serving_a_store_that_import_writes_reads_the_effects_the_import_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(tmp_path / "r.db")
    served = Resolver(store, index_dir=None, semantic=False)
    assert served.resolve("srv", "tools/call", {"name": "get", "arguments": {"x": "k"}}).tier is Tier.EXACT
    more = Store(tmp_path / "more.db")  # what shows ``put`` changes state, recorded elsewhere
    more.put_server(ServerRecord("srv", {"name": "srv", "version": "1"}, {}, None))  # an import declares it
    for session, tool, answer in (("s3", "get", "unset"), ("s3", "put", "ok"), ("s3", "get", "set")):
        record_x(more, session, tool, "k", answer)
    lines = tmp_path / "more.jsonl"
    with lines.open("w", encoding="utf-8") as out:
        export_jsonl(more, out)
    imported = subprocess.run(
        [sys.executable, "-m", "replay_sim", "import", str(lines), "--db", str(tmp_path / "r.db")],
        capture_output=True,
        text=True,
    )
    assert imported.returncode == 0, imported.stderr
    learned = _learned_only_by(monkeypatch)
    assert served.lookup.effect("srv", "put").effect is Effect.NONE  # not read since: still cached
    served.resolve("srv", "tools/call", {"name": "get", "arguments": {"x": "k"}})  # sees the commit
    assert served.lookup.effect("srv", "put").effect is Effect.CHANGES
    assert learned == []  # read back from what the import kept in its commit
