"""``replay-sim forget``: recorded sessions taken back by origin, fingerprint, server and time."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from store_helpers import echo_call

from replay_sim.cli import cli
from replay_sim.errors import ConfigError
from replay_sim.resolve.build import build_index
from replay_sim.resolve.embedding import SentenceTransformerEmbedder
from replay_sim.resolve.tooleffects import EFFECTS_META_PREFIX, keep_effects
from replay_sim.store import Origin, Store
from replay_sim.store.changes import changes_since
from replay_sim.store.forget import Selection, forget
from replay_sim.store.sources import mark_session, session_sources


def _store(path: Path) -> Store:
    """Three ``echo`` sessions: live (2 calls, early), and two marked ``fp-aaaaaaaa``, ``fp-bbbbbbbb``."""
    store = Store(path)
    store.start_session("echo", "live-1", started_at="2024-01-01T00:00:00Z")
    echo_call(store, 1, "live-1")
    echo_call(store, 2, "live-1")
    for n, (session, mark) in enumerate((("sb-1", "fp-aaaaaaaa"), ("sb-2", "fp-bbbbbbbb")), 3):
        store.start_session("echo", session, started_at=f"2025-0{n}-01T00:00:00Z")
        mark_session(store, session, mark, {"server": "echo"})
        store.record_call(
            "echo", "tools/call", {"name": "echo", "arguments": {"n": n}},
            result={"content": [{"type": "text", "text": str(n)}]}, session=session, origin=Origin.SANDBOX,
        )  # fmt: skip
    return store


def test_a_dry_run_counts_what_a_fingerprint_would_take_back_and_removes_nothing(tmp_path: Path) -> None:
    with _store(tmp_path / "r.db") as store:
        found = forget(store, Selection(fingerprint="fp-aaaaaaaa"))
        assert found.sessions == ["sb-1"] and dict(found.calls) == {("echo", "sandbox"): 1}
        assert not found.done and "add --yes" in found.describe()
        assert len(store.recordings()) == 4


@pytest.mark.parametrize(
    ("selection", "left"),
    [
        (Selection(origin="sandbox"), ["live-1"]),
        (Selection(fingerprint="fp-bbbbbbbb"), ["live-1", "sb-1"]),
        (Selection(server="echo", until="2025-01-01"), ["sb-1", "sb-2"]),
        (Selection(since="2025-04-01"), ["live-1", "sb-1"]),
        (Selection(origin="live", server="other"), ["live-1", "sb-1", "sb-2"]),  # every criterion holds
    ],
)
def test_forget_removes_whole_sessions_matching_every_criterion(
    tmp_path: Path, selection: Selection, left: list[str]
) -> None:
    with _store(tmp_path / "r.db") as store:
        forget(store, selection, dry_run=False)
        assert sorted(s["id"] for s in store.sessions()) == left
        assert sorted({r.session for r in store.recordings()}) == left
        assert set(session_sources(store)) <= set(left)  # no mark outlives its session


def test_forget_refuses_a_selection_naming_nothing(tmp_path: Path) -> None:
    with _store(tmp_path / "r.db") as store, pytest.raises(ConfigError, match="at least one of"):
        forget(store, Selection(), dry_run=False)


def test_after_forget_the_kept_effects_and_the_index_are_rebuilt_from_what_is_left(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    with _store(tmp_path / "r.db") as store:
        keep_effects(store)
        index = build_index(store, embedder=embedder, directory=tmp_path / "index")
        assert sum(len(p) for p in index.partitions.values()) == 4
        forget(store, Selection(origin="sandbox"), dry_run=False)
        assert store.meta(EFFECTS_META_PREFIX + "echo") is None
        rebuilt = build_index(store, embedder=embedder, directory=tmp_path / "index")
        ids = {r.id for r in store.recordings()}
        assert sum(len(p) for p in rebuilt.partitions.values()) == len(ids) == 2


def test_the_forget_command_is_a_dry_run_unless_told_yes(tmp_path: Path) -> None:
    _store(tmp_path / "r.db").close()
    run = CliRunner().invoke
    dry = run(cli, ["forget", "--db", str(tmp_path / "r.db"), "--origin", "sandbox"])
    assert dry.exit_code == 0, dry.output
    assert dry.output.splitlines()[:2] == ["would remove 2 sessions, 2 calls", "  echo\tsandbox\t2"]
    listed = run(cli, ["sessions", "--db", str(tmp_path / "r.db")])
    assert "sb-1\techo\t2025-03-01T00:00:00Z\t1 calls\tfingerprint fp-aaaaaaaa" in listed.output
    done = run(cli, ["forget", "--db", str(tmp_path / "r.db"), "--origin", "sandbox", "--yes"])
    assert done.exit_code == 0 and done.output.startswith("removed 2 sessions, 2 calls")
    assert run(cli, ["forget", "--db", str(tmp_path / "r.db")]).exit_code == 1


def test_calls_removed_then_as_many_added_under_a_reused_id_change_everything(tmp_path: Path) -> None:
    with _store(tmp_path / "r.db") as store:
        mark, _ = changes_since(store, None)
        forget(store, Selection(fingerprint="fp-bbbbbbbb"), dry_run=False)  # the greatest id
        store.start_session("echo", "later")
        assert echo_call(store, 9, "later") == 4  # SQLite gives the removed id again
        _, appended = changes_since(store, mark)
        assert appended is None  # not "call 4 appended": a reader forgets everything it derived
