"""JSONL import/export: the interchange contract of DESIGN.md."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from replay_sim.errors import InterchangeError
from replay_sim.store import Origin, ServerRecord, Store
from replay_sim.store.interchange import export_jsonl, import_jsonl, merge

REPLAY_SIM = [sys.executable, "-m", "replay_sim"]


def _populate(store: Store) -> None:
    store.put_server(
        ServerRecord(
            "git", {"name": "mcp-git", "version": "1.0"}, {"tools": {"listChanged": False}}, "2025-11-25"
        )
    )
    store.put_listing(
        "git", "tools/list", {"tools": [{"name": "git_log", "inputSchema": {"type": "object"}}]}
    )
    session = store.start_session("git", "s-1", "2026-11-29T14:00:00Z")
    store.record_call(
        "git",
        "tools/call",
        {"name": "git_log", "arguments": {"repo_path": "/r", "max_count": 2.0}},
        result={"content": [{"type": "text", "text": "commit ünïcode"}], "isError": False},
        session=session,
        latency_ms=9.5,
        recorded_at="2026-11-29T14:00:01Z",
        notifications=[{"method": "notifications/message", "params": {"level": "info", "data": "x"}}],
    )
    store.record_call(
        "git",
        "tools/call",
        {"name": "git_nope", "arguments": {}},
        error={"code": -32602, "message": "Unknown tool: git_nope"},
        session=session,
        recorded_at="2026-11-29T14:00:02Z",
    )


def _export(store: Store) -> str:
    out = io.StringIO()
    export_jsonl(store, out)
    return out.getvalue()


def test_export_import_export_is_byte_identical(tmp_path: Path) -> None:
    with Store(tmp_path / "a.db") as a:
        _populate(a)
        first = _export(a)
    (tmp_path / "a.jsonl").write_text(first, encoding="utf-8")
    with Store(tmp_path / "b.db") as b:
        counts = import_jsonl(b, tmp_path / "a.jsonl")
        second = _export(b)
    assert counts == {"server": 1, "listing": 1, "call": 2, "duplicate": 0}
    assert second == first


def test_exported_lines_follow_the_design_format(tmp_path: Path) -> None:
    with Store(tmp_path / "a.db") as a:
        _populate(a)
        lines = [json.loads(line) for line in _export(a).splitlines()]
    assert [line["type"] for line in lines] == ["server", "listing", "call", "call"]
    call = lines[2]
    assert call["params"] == {"name": "git_log", "arguments": {"repo_path": "/r", "max_count": 2.0}}
    assert call["result"]["content"][0]["text"] == "commit ünïcode"
    assert (call["session"], call["seq"], call["latency_ms"], call["error"]) == ("s-1", 1, 9.5, None)
    assert lines[3]["error"]["code"] == -32602 and lines[3]["result"] is None


def test_imported_calls_without_origin_are_marked_import(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(
        json.dumps(
            {
                "type": "call",
                "server": "t",
                "method": "tools/call",
                "params": {"name": "x"},
                "result": {"content": []},
            }
        )
        + "\n"
    )
    with Store(tmp_path / "r.db") as store:
        import_jsonl(store, path)
        assert store.recordings()[0].origin == Origin.IMPORT


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not JSON"),
        ("[1]", "expected a JSON object"),
        ('{"type":"call","method":"tools/call","result":{}}', "missing field 'server'"),
        ('{"type":"call","server":"t","method":"tools/call","params":{}}', "needs a result or an error"),
        ('{"type":"listing","server":"t","method":"tools/call","result":{}}', "not a listing method"),
        ('{"type":"bogus","server":"t"}', "unknown line type"),
    ],
)
def test_a_bad_line_names_file_and_line_and_imports_nothing(tmp_path: Path, line: str, message: str) -> None:
    good = json.dumps(
        {
            "type": "call",
            "server": "t",
            "method": "tools/call",
            "params": {"name": "x"},
            "result": {"content": []},
        }
    )
    path = tmp_path / "in.jsonl"
    path.write_text(good + "\n" + line + "\n")
    with Store(tmp_path / "r.db") as store:
        with pytest.raises(InterchangeError, match=rf"in\.jsonl:2: .*{message}"):
            import_jsonl(store, path)
        assert store.recordings() == []


def test_cli_round_trip_and_one_line_errors(tmp_path: Path) -> None:
    with Store(tmp_path / "a.db") as a:
        _populate(a)
    exported = tmp_path / "a.jsonl"
    subprocess.run([*REPLAY_SIM, "export", "--db", str(tmp_path / "a.db"), "-o", str(exported)], check=True)
    subprocess.run(
        [*REPLAY_SIM, "import", str(exported), "--db", str(tmp_path / "b.db")],
        check=True,
        capture_output=True,
    )
    again = subprocess.run(
        [*REPLAY_SIM, "export", "--db", str(tmp_path / "b.db")], check=True, capture_output=True, text=True
    )
    assert again.stdout == exported.read_text(encoding="utf-8")

    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    failed = subprocess.run(
        [*REPLAY_SIM, "import", str(bad), "--db", str(tmp_path / "c.db")], capture_output=True, text=True
    )
    assert failed.returncode == 1
    assert failed.stderr.strip().count("\n") == 0 and "bad.jsonl:1" in failed.stderr


def test_importing_twice_changes_nothing(tmp_path: Path) -> None:
    with Store(tmp_path / "a.db") as a:
        _populate(a)
        (tmp_path / "a.jsonl").write_text(_export(a), encoding="utf-8")
    with Store(tmp_path / "b.db") as b:
        import_jsonl(b, tmp_path / "a.jsonl")
        again = import_jsonl(b, tmp_path / "a.jsonl")
        assert (again["call"], again["duplicate"]) == (0, 2)
        assert len(b.recordings()) == 2


def test_merge_combines_stores_without_duplicates(tmp_path: Path) -> None:
    with Store(tmp_path / "a.db") as a:
        _populate(a)
    with Store(tmp_path / "b.db") as b:
        b.record_call(
            "time",
            "tools/call",
            {"name": "now", "arguments": {}},
            result={"content": []},
            recorded_at="2026-11-29T15:00:00Z",
        )
    counts = merge([tmp_path / "a.db", tmp_path / "b.db", tmp_path / "a.db"], tmp_path / "c.db")
    assert (counts["call"], counts["duplicate"]) == (3, 2)
    with Store(tmp_path / "c.db") as c:
        assert sorted(r.name for r in c.recordings()) == ["git_log", "git_nope", "now"]
        assert c.server("git") is not None
