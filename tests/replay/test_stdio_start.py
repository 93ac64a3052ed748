"""A ``serve --stdio`` start answers from its start table before the MCP SDK loads, then hands over.

Every test runs the real CLI in a subprocess over real pipes, on a store whose index and start table
were built as ``replay-sim index build`` builds them.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from replay_helpers import build_store, text_result

from replay_sim.replay.stdio.start import START_TABLE, StartTable, request_key
from replay_sim.replay.stdio.start import table as start_table
from replay_sim.replay.stdio.start.write import write_start_table
from replay_sim.resolve.build import build_index
from replay_sim.resolve.embedding import SentenceTransformerEmbedder
from replay_sim.resolve.tooleffects import keep_effects
from replay_sim.store import ServerRecord, Store

# The CLI as `python -m replay_sim` runs it, telling on stderr (at exit) whether the MCP SDK had
# been imported at each write to fd 1 — the start's answers (the replay writes to a duplicate of
# it) — and, last, at exit.
_PROBE = """
import atexit, os, runpy, sys
written = []
real_write = os.write
def write(fd, data):
    if fd == 1:
        written.append("mcp" in sys.modules)
    return real_write(fd, data)
os.write = write
said = lambda: print("SDK_LOADED_AT_WRITES " + repr(written + ["mcp" in sys.modules]), file=sys.stderr)
atexit.register(said)
sys.argv = ["replay-sim", *sys.argv[1:]]
runpy.run_module("replay_sim", run_name="__main__")
"""


def _request(id_: int, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": id_,
        "method": method,
        **({"params": params} if params is not None else {}),
    }


_OPENING = [
    _request(
        1,
        "initialize",
        {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    ),
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
]


def _call(id_: int, name: str, **arguments: Any) -> dict[str, Any]:
    return _request(id_, "tools/call", {"name": name, "arguments": arguments})


def _indexed(store: Store, index_dir: Path, embedder: SentenceTransformerEmbedder) -> None:
    """Index the store and write its start table, as ``replay-sim index build`` does."""
    build_index(store, embedder=embedder, directory=index_dir)
    keep_effects(store)
    path = store.path
    store.close()
    write_start_table(path, index_dir)


@pytest.fixture
def demo(tmp_path: Path, embedder: SentenceTransformerEmbedder) -> tuple[Path, Path]:
    """The shared demo store (stateful ``counter``/``increment``), indexed, with its start table."""
    db, index_dir = tmp_path / "r.db", tmp_path / "index"
    _indexed(build_store(db), index_dir, embedder)
    return db, index_dir


def _serve(
    db: Path,
    index_dir: Path,
    lines: list[dict[str, Any] | bytes],
    server: str = "demo",
    *,
    pipelined: bool = True,
) -> tuple[list[dict[str, Any]], str, list[bool]]:
    """Serve ``lines`` — written at once, or each once the one before is answered — and return the
    answers in the order written, stderr, and whether the SDK was loaded at each write of the start
    and, last, at exit."""
    command = [sys.executable, "-c", textwrap.dedent(_PROBE), "serve", "--stdio", "--server", server]
    command += ["--db", str(db), "--index-dir", str(index_dir)]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    answers: list[dict[str, Any]] = []
    expected = 0
    for at, line in enumerate(lines):
        process.stdin.write((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n")
        expected += isinstance(line, bytes) or "id" in line
        if pipelined and at < len(lines) - 1:
            continue
        process.stdin.flush()
        while len(answers) < expected:
            answer = process.stdout.readline()
            assert answer, process.stderr.read().decode()
            answers.append(json.loads(answer))
    process.stdin.close()
    assert process.wait(timeout=120) == 0
    stderr = process.stderr.read().decode()
    (said,) = [line for line in stderr.splitlines() if line.startswith("SDK_LOADED_AT_WRITES ")]
    return answers, stderr, json.loads(said.removeprefix("SDK_LOADED_AT_WRITES ").lower())


def _by_id(answers: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Answers by request id: the replay answers requests concurrently, in any order."""
    return {json.dumps(a.get("id")): a for a in answers}


def _without_table(index_dir: Path, tmp_path: Path) -> Path:
    bare = tmp_path / "index-without-table"
    shutil.copytree(index_dir, bare)
    (bare / START_TABLE).unlink()
    return bare


def test_the_start_table_keeps_only_calls_whose_answer_does_not_depend_on_the_session(
    demo: tuple[Path, Path],
) -> None:
    _, index_dir = demo
    with sqlite3.connect(index_dir / START_TABLE) as conn:
        kept = dict(conn.execute("SELECT key, anytime FROM answers WHERE server='demo'").fetchall())
        opened = {m for (m,) in conn.execute("SELECT method FROM openings WHERE version='2025-06-18'")}

    def key(method: str, params: dict[str, Any]) -> str:
        found = request_key("demo", {"method": method, "params": params})
        assert found is not None
        return found[1]

    assert kept == {
        key("tools/call", {"name": "echo", "arguments": {"message": "hello"}}): 1,
        key("resources/read", {"uri": "file:///readme.md"}): 1,
        key("prompts/get", {"name": "greet", "arguments": {"who": "Ada"}}): 1,
        # counter is recorded twice, once from the initial state: that one answers it there
        key("tools/call", {"name": "counter", "arguments": {}}): 1,
    }  # not increment (it changes state), the recorded error, nor the call with notifications
    assert opened == {
        "initialize",
        "tools/list",
        "resources/list",
        "resources/templates/list",
        "prompts/list",
    }


def test_initialize_listings_and_exact_hits_are_answered_before_the_sdk_loads_with_the_replays_bytes(
    demo: tuple[Path, Path], tmp_path: Path
) -> None:
    db, index_dir = demo
    lines: list[dict[str, Any] | bytes] = [
        *_OPENING,
        _request(2, "tools/list"),
        _request(3, "resources/list"),
        _call(4, "echo", message="hello"),
        _request(5, "resources/read", {"uri": "file:///readme.md"}),
        _request(6, "prompts/get", {"name": "greet", "arguments": {"who": "Ada"}}),
        _call(7, "counter"),
    ]
    fast, stderr, loaded = _serve(db, index_dir, lines)
    assert loaded == [False] * 8, stderr  # every answer the start's: the MCP SDK was never imported
    slow, _, _ = _serve(db, _without_table(index_dir, tmp_path), lines)
    assert _by_id(fast) == _by_id(slow)
    assert fast[-1]["result"]["content"][0]["text"] == "0"
    assert fast[3]["result"]["_meta"]["replay-sim/match"]["status"] == "exact"


def test_what_the_start_cannot_answer_is_handed_over_and_the_session_goes_on_as_if_replayed_whole(
    demo: tuple[Path, Path], tmp_path: Path
) -> None:
    db, index_dir = demo
    lines: list[dict[str, Any] | bytes] = [
        *_OPENING,
        _call(2, "counter"),  # the start's
        _call(3, "echo", message="boom"),  # a recorded error: the replay's from here on
        _call(4, "echo", message="hello"),
        _call(5, "increment"),  # changes state
        _call(6, "counter"),  # after the increment: "1"
        b"{not json",
        _request(7, "ping"),
    ]  # each answered exactly: none waits for the embedding model (which a miss's text may)
    fast, stderr, loaded = _serve(db, index_dir, lines, pipelined=False)  # as an agent loop calls
    assert loaded == [False, False, True], stderr  # initialize and the first counter: the start's
    slow, _, _ = _serve(db, _without_table(index_dir, tmp_path), lines, pipelined=False)
    assert _by_id(fast) == _by_id(slow)
    texts = {
        a["id"]: a["result"]["content"][0]["text"] for a in fast if "result" in a and "content" in a["result"]
    }
    assert (texts[2], texts[4], texts[5], texts[6]) == ("0", "hello", "ok", "1")
    assert "warning" not in stderr, stderr


def test_a_call_recorded_more_than_once_from_the_initial_state_is_the_starts_only_as_the_first_call(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    db, index_dir = tmp_path / "r.db", tmp_path / "index"
    store = Store(db)
    store.put_server(ServerRecord("kb", {"name": "kb", "version": "1"}, {"tools": {}}, "2025-06-18"))
    read_only = {"readOnlyHint": True}
    tools = [
        {"name": n, "inputSchema": {"type": "object"}, "annotations": read_only} for n in ("latest", "about")
    ]
    store.put_listing("kb", "tools/list", {"tools": tools})
    # Which of `latest`'s two recordings answers is decided by the calls before it (none: the oldest).
    for session, tool, text in (("s-1", "latest", "A"), ("s-2", "latest", "A"), ("s-3", "about", "kb 1")):
        opened = store.start_session("kb", session)
        call = {"name": tool, "arguments": {}}
        store.record_call("kb", "tools/call", call, result=text_result(text), session=opened)
    _indexed(store, index_dir, embedder)
    first, stderr, loaded = _serve(db, index_dir, [*_OPENING, _call(2, "latest")], "kb")
    assert loaded == [False, False, False], stderr
    second, stderr, loaded = _serve(db, index_dir, [*_OPENING, _call(2, "about"), _call(3, "latest")], "kb")
    assert loaded == [False, False, True], stderr  # `about` is the start's; `latest` the replay's
    assert second[1]["result"]["content"][0]["text"] == "kb 1"
    assert second[2]["result"] == first[1]["result"]  # the oldest recording, either way


def test_index_build_again_leaves_a_current_table_alone_and_rewrites_a_stale_one(
    demo: tuple[Path, Path],
) -> None:
    db, index_dir = demo
    table = index_dir / START_TABLE
    written = table.stat().st_mtime_ns
    assert write_start_table(db, index_dir) == 4 and table.stat().st_mtime_ns == written
    with Store(db) as store:
        store.record_call(
            "demo", "tools/call", {"name": "echo", "arguments": {"message": "hi"}}, result=text_result("hi")
        )
    assert write_start_table(db, index_dir) == 5 and table.stat().st_mtime_ns != written


def test_a_table_the_store_has_moved_past_is_not_used_and_says_why(demo: tuple[Path, Path]) -> None:
    db, index_dir = demo
    with Store(db) as store:
        store.record_call(
            "demo",
            "tools/call",
            {"name": "echo", "arguments": {"message": "new"}},
            result=text_result("new"),
        )
    answers, stderr, loaded = _serve(db, index_dir, [*_OPENING, _call(2, "echo", message="new")])
    assert "is not used: the store was written since it was" in stderr
    assert loaded == [True], stderr  # the replay answered everything
    assert answers[1]["result"]["content"][0]["text"] == "new"


def test_a_table_written_by_other_code_is_not_used(
    demo: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    db, index_dir = demo
    monkeypatch.setattr(start_table, "code_digest", lambda: "other code")
    table, why = StartTable.open(db, index_dir, "demo")
    assert table is None and "written by other replay-sim code" in why


def test_options_checked_at_start_are_checked_before_the_start_answers(demo: tuple[Path, Path]) -> None:
    db, index_dir = demo
    command = [
        sys.executable,
        "-m",
        "replay_sim",
        "serve",
        "--stdio",
        "--server",
        "demo",
        "--miss",
        "sandbox",
    ]
    done = subprocess.run(
        [*command, "--db", str(db), "--index-dir", str(index_dir)],
        input=json.dumps(_OPENING[0]) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert "--miss sandbox needs --config" in done.stderr


def test_a_store_written_while_the_start_serves_is_seen(demo: tuple[Path, Path]) -> None:
    db, index_dir = demo
    table, why = StartTable.open(db, index_dir, "demo")
    assert table is not None, why
    try:
        assert table.current()
        with Store(db) as store:
            store.record_call(
                "other",
                "tools/call",
                {"name": "ping", "arguments": {"n": 2}},
                result=text_result("2"),
            )
        assert not table.current()
    finally:
        table.close()


def test_a_client_that_leaves_after_the_start_answered_everything_never_loads_the_replay(
    demo: tuple[Path, Path],
) -> None:
    db, index_dir = demo
    answers, stderr, loaded = _serve(db, index_dir, [*_OPENING, _call(2, "echo", message="hello")])
    assert [a["id"] for a in answers] == [1, 2] and loaded == [False, False, False], stderr
