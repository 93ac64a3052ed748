"""JSONL import/export: the interchange contract of DESIGN.md."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import tracemalloc
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
        json.dumps({"type": "server", "server": "t", "info": {"name": "t", "version": "1"}})
        + "\n"
        + json.dumps(
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


def test_line_separators_inside_recorded_text_round_trip(tmp_path: Path) -> None:
    odd = "a\u2028b\u2029c\x85d\rx\x0cy\x1c\x1d\x1e\u000bz"  # what str.splitlines splits on, all of it
    with Store(tmp_path / "a.db") as a:
        _populate(a)
        a.record_call(
            "git",
            "tools/call",
            {"name": "git_show", "arguments": {"rev": odd}},
            result={"content": [{"type": "text", "text": odd}]},
            recorded_at="2026-11-29T14:00:03Z",
        )
        first = _export(a)
    (tmp_path / "a.jsonl").write_text(first, encoding="utf-8")
    with Store(tmp_path / "b.db") as b:
        counts = import_jsonl(b, tmp_path / "a.jsonl")
        assert counts["call"] == 3
        assert b.recordings(name="git_show")[0].result == {"content": [{"type": "text", "text": odd}]}
        assert _export(b) == first


_GOOD_CALL = {"type": "call", "server": "t", "method": "tools/call", "params": {"name": "x"}, "result": {}}


def _with(base: dict[str, object], **changes: object) -> str:
    return json.dumps(base | changes)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (_with({"type": "server", "server": "t"}, info="mcp-git"), "field 'info': must be an object"),
        (
            _with({"type": "server", "server": "t", "info": {"name": 7}}),
            "field 'info': its 'name' must be a string",
        ),
        (
            _with({"type": "server", "server": "t", "info": {"name": "g", "icons": [{"src": 1}]}}),
            "field 'info': not an MCP Icon",
        ),
        (
            _with({"type": "server", "server": "t", "info": {"name": "g", "version": "1"}}, capabilities=[]),
            "field 'capabilities': must be an object",
        ),
        (
            _with({"type": "listing", "server": "t", "method": "tools/list"}, result="git_log"),
            "field 'result': must be an object",
        ),
        (
            _with({"type": "listing", "server": "t", "method": "tools/list"}, result={"tools": "git_log"}),
            "field 'result': a tools/list result holds 'tools', an array of objects",
        ),
        (_with(_GOOD_CALL, params={"name": "x", "arguments": "a=1"}), "field 'params.arguments'"),
        (_with(_GOOD_CALL, params={"name": 7}), "field 'params.name': must be a string"),
        (_with(_GOOD_CALL, params=[]), "field 'params': must be an object"),
        (_with(_GOOD_CALL, result="ok"), "field 'result': must be an object"),
        (_with(_GOOD_CALL, result=None, error={"code": "x"}), "field 'error': a JSON-RPC error"),
        (_with(_GOOD_CALL, latency_ms=1e12), "field 'latency_ms': must be milliseconds from 0 to 86400000"),
        (_with(_GOOD_CALL, latency_ms=-1), "field 'latency_ms'"),
        (_with(_GOOD_CALL, latency_ms=True), "field 'latency_ms'"),
        (_with(_GOOD_CALL)[:-1] + ',"latency_ms":Infinity}', "Infinity is not JSON"),
        (_with(_GOOD_CALL)[:-1] + ',"latency_ms":1e999}', "too large for a double"),
        (_with(_GOOD_CALL, result={"v": float("nan")}), "NaN is not JSON"),
        (_with(_GOOD_CALL, seq=-1), "field 'seq'"),
        (_with(_GOOD_CALL, seq=2**64), "field 'seq'"),
        (_with(_GOOD_CALL, session=""), "field 'session': must be a non-empty string"),
        (_with(_GOOD_CALL, recorded_at="yesterday"), "field 'recorded_at': must be an ISO-8601 time"),
        (_with(_GOOD_CALL, origin="mine"), "field 'origin': must be one of live, import"),
        (_with(_GOOD_CALL, notifications={"method": "x"}), "field 'notifications'"),
        (_with(_GOOD_CALL, method="tools/list"), "field 'method': 'tools/list' is not a recorded call"),
        (_with(_GOOD_CALL, server=["t"]), "field 'server': must be a non-empty string"),
        (_with(_GOOD_CALL, reslt={}), "unknown field 'reslt' in a call line"),
        ('{"type":"call","result":' + "[" * 5000 + "]" * 5000 + "}", "nested deeper than 128 levels"),
        ('{"type":"call","result":' + "[" * 200 + "]" * 200 + "}", "nested deeper than 128 levels"),
    ],
)
def test_a_line_of_the_wrong_shape_is_refused_naming_line_and_field(
    tmp_path: Path, line: str, message: str
) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(_with(_GOOD_CALL) + "\n" + line + "\n", encoding="utf-8")
    with Store(tmp_path / "r.db") as store:
        with pytest.raises(InterchangeError, match=rf"in\.jsonl:2: .*{re.escape(message)}"):
            import_jsonl(store, path)
        assert store.recordings() == [] and store.servers() == []


def test_a_line_that_is_not_utf8_is_refused_by_its_number(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes((_with(_GOOD_CALL) + "\n").encode() * 2 + b'{"type":"\xff"}\n')
    with Store(tmp_path / "r.db") as store, pytest.raises(InterchangeError, match=r"in\.jsonl:3: not UTF-8"):
        import_jsonl(store, path)


def test_a_wrongly_shaped_import_leaves_the_store_serving(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text(_with(_GOOD_CALL) + "\n", encoding="utf-8")
    declared = tmp_path / "declared.jsonl"
    declared.write_text(
        _with({"type": "server", "server": "t", "info": {"name": "t", "version": "1"}}) + "\n"
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        _with({"type": "server", "server": "t", "info": {"name": "t", "version": "1"}})
        + "\n"
        + _with({"type": "listing", "server": "t", "method": "tools/list"}, result="git_log")
        + "\n",
        encoding="utf-8",
    )
    db = str(tmp_path / "r.db")
    for file in (declared, good):
        subprocess.run([*REPLAY_SIM, "import", str(file), "--db", db], check=True, capture_output=True)
    failed = subprocess.run([*REPLAY_SIM, "import", str(bad), "--db", db], capture_output=True, text=True)
    assert failed.returncode == 1
    assert failed.stderr.strip().count("\n") == 0, failed.stderr
    assert "bad.jsonl:2: field 'result'" in failed.stderr
    with Store(db, readonly=True) as store:
        assert [s.name for s in store.servers()] == ["t"] and store.listings("t") == {}
        assert len(store.recordings()) == 1


def test_import_reads_the_file_as_a_stream(tmp_path: Path) -> None:
    text = "x" * 200_000
    path = tmp_path / "big.jsonl"
    with path.open("w", encoding="utf-8") as out:
        out.write(_with({"type": "server", "server": "t", "info": {"name": "t", "version": "1"}}) + "\n")
        for n in range(60):  # 12 MB of lines
            out.write(
                _with(_GOOD_CALL, params={"name": "x", "arguments": {"n": n}}, result={"t": text}) + "\n"
            )
    with Store(tmp_path / "r.db") as store:
        tracemalloc.start()
        try:
            counts = import_jsonl(store, path)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert counts["call"] == 60
    assert peak < 4_000_000, peak  # a few lines' worth, not the file's 12 MB


# -- issue 29, item 5: every line checked before anything is written ------------------------------

_SERVER_T = {"type": "server", "server": "t", "info": {"name": "t", "version": "1"}}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            _with(_GOOD_CALL, method=["tools/call"]),
            "field 'method': must be a non-empty string, got an array",
        ),
        (_with(_GOOD_CALL, method={"a": 1}), "field 'method': must be a non-empty string, got an object"),
        (
            _with({"type": "listing", "server": "t", "result": {"tools": []}}, method=["tools/list"]),
            "field 'method': must be a non-empty string, got an array",
        ),
    ],
)
def test_a_method_that_is_not_a_string_is_a_one_line_error_not_a_traceback(
    tmp_path: Path, line: str, message: str
) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(_with(_SERVER_T) + "\n" + line + "\n", encoding="utf-8")
    with (
        Store(tmp_path / "r.db") as store,
        pytest.raises(InterchangeError, match=rf"in\.jsonl:2: {re.escape(message)}"),
    ):
        import_jsonl(store, path)
    failed = subprocess.run(
        [*REPLAY_SIM, "import", str(path), "--db", str(tmp_path / "cli.db")], capture_output=True, text=True
    )
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    assert failed.stderr.strip().count("\n") == 0 and "in.jsonl:2: field 'method'" in failed.stderr


def test_a_call_for_a_server_no_line_declares_is_refused_naming_its_line(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    other = _with(_GOOD_CALL, server="ghost")
    path.write_text("\n".join([_with(_SERVER_T), _with(_GOOD_CALL), other, _with(_GOOD_CALL)]) + "\n")
    with Store(tmp_path / "r.db") as store:
        with pytest.raises(InterchangeError, match=r"in\.jsonl:3: field 'server': 'ghost' is not declared"):
            import_jsonl(store, path)
        assert store.recordings() == [] and store.servers() == []


def test_a_call_for_a_server_the_store_holds_needs_no_server_line(tmp_path: Path) -> None:
    declared, calls = tmp_path / "servers.jsonl", tmp_path / "calls.jsonl"
    declared.write_text(_with(_SERVER_T) + "\n")
    calls.write_text(_with(_GOOD_CALL) + "\n")
    with Store(tmp_path / "r.db") as store:
        import_jsonl(store, declared)
        assert import_jsonl(store, calls)["call"] == 1


def test_a_server_line_after_its_calls_still_declares_it(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(_with(_GOOD_CALL) + "\n" + _with(_SERVER_T) + "\n")
    with Store(tmp_path / "r.db") as store:
        assert import_jsonl(store, path)["call"] == 1


def test_a_bad_last_line_is_found_before_the_store_is_written_or_locked(tmp_path: Path) -> None:
    """Every line is checked first: a store another writer holds locked still gets the line's error."""
    path = tmp_path / "in.jsonl"
    path.write_text(_with(_SERVER_T) + "\n" + _with(_GOOD_CALL) + "\n" + _with(_GOOD_CALL, seq=-1) + "\n")
    db = tmp_path / "r.db"
    Store(db).close()
    with (
        Store(db) as writer,
        Store(db, timeout=0.05) as store,
        writer.transaction("hold the lock"),
        pytest.raises(InterchangeError, match=r"in\.jsonl:3: field 'seq'"),
    ):
        import_jsonl(store, path)
    with Store(db, readonly=True) as store:
        assert store.recordings() == [] and store.servers() == []
