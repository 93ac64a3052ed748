"""The store commands of the CLI: `sessions` and `stats` (real subprocesses, real files)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from recording_helpers import PYTHON, ROOT, proxy_stdio, run_script, step
from replay_helpers import build_store

from replay_sim.cli import cli
from replay_sim.resolve.embedding import DEFAULT_MODEL_ID
from replay_sim.resolve.snapshot import freeze
from replay_sim.resolve.static_embedding import STATIC_MODEL_ID
from replay_sim.store import Store

REPLAY_SIM = [sys.executable, "-m", "replay_sim"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*REPLAY_SIM, *args], capture_output=True, text=True)


def test_sessions_lists_sessions_and_shows_one(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    with Store(db) as store:
        session = store.start_session("echo", "s-abc")
        store.record_call(
            "echo",
            "tools/call",
            {"name": "echo", "arguments": {"x": 1}},
            result={"content": []},
            session=session,
        )
        store.record_call(
            "echo",
            "tools/call",
            {"name": "boom"},
            error={"code": -32603, "message": "crashed"},
            session=session,
        )
    listing = _run("sessions", "--db", str(db))
    assert listing.returncode == 0 and "s-abc\techo" in listing.stdout and "2 calls" in listing.stdout
    shown = _run("sessions", "--db", str(db), "s-abc")
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("1\t#1\ttools/call\techo") and lines[0].split("\t")[5] == "ok"
    assert lines[1].split("\t")[5] == "error"
    unknown = _run("sessions", "--db", str(db), "s-nope")
    assert unknown.returncode == 1 and "no session 's-nope'" in unknown.stderr


def test_stats_counts_calls_and_errors_per_tool(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    with Store(db) as store:
        for _ in range(3):
            store.record_call("echo", "tools/call", {"name": "echo"}, result={"content": []}, latency_ms=2.0)
        store.record_call(
            "echo", "tools/call", {"name": "echo"}, result={"content": [], "isError": True}, latency_ms=4.0
        )
    rows = json.loads(_run("stats", "--db", str(db), "--json").stdout)
    assert rows == [
        {
            "server": "echo",
            "method": "tools/call",
            "name": "echo",
            "origin": "live",
            "calls": 4,
            "errors": 1,
            "mean_latency_ms": 2.5,
            # One call, from one state (no session: the initial state), answered two ways.
            "effect": {
                "effect": "changes",
                "source": "evidence",
                "reason": "echo answered differently from one state (recordings 1, 4)",
                "witnesses": [],
                "contrary": [1, 4],
                "shown": 0,
            },
        }
    ]
    table = _run("stats", "--db", str(db)).stdout
    assert "echo\techo\tchanges: echo answered differently from one state" in table


def test_commands_on_a_missing_store_fail_with_one_line(tmp_path: Path) -> None:
    failed = _run("stats", "--db", str(tmp_path / "none.db"))
    assert failed.returncode == 1
    assert failed.stderr.count("\n") == 1 and "none.db: no such recording store" in failed.stderr


def test_every_reading_command_refuses_a_missing_store_and_creates_none(tmp_path: Path) -> None:
    typo = tmp_path / "typo.db"
    probes = tmp_path / "probes.jsonl"
    probes.write_text('{"id": "p1", "category": "c", "server": "s", "steps": []}\n')
    for args in (
        ["index", "build", "--db", str(typo), "--index-dir", str(tmp_path / "index")],
        ["eval", str(probes), "--db", str(typo), "--index-dir", str(tmp_path / "index")],
        ["stats", "--db", str(typo)],
        ["sessions", "--db", str(typo)],
        ["export", "--db", str(typo)],
        ["snapshot", "freeze", "--db", str(typo), "--out", str(tmp_path / "snap")],
    ):
        failed = _run(*args)
        assert failed.returncode == 1, args
        assert failed.stderr.count("\n") == 1 and "typo.db: no such recording store" in failed.stderr, args
        assert "precision" not in failed.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["probes.jsonl"]


def test_import_still_creates_the_store(tmp_path: Path) -> None:
    source = tmp_path / "one.jsonl"
    server = {"type": "server", "server": "echo", "info": {"name": "echo", "version": "1"}}
    line = {"type": "listing", "server": "echo", "method": "tools/list", "result": {"tools": []}}
    source.write_text(json.dumps(server) + "\n" + json.dumps(line) + "\n")
    done = _run("import", str(source), "--db", str(tmp_path / "new" / "r.db"))
    assert done.returncode == 0 and (tmp_path / "new" / "r.db").is_file()


def test_index_build_into_an_unwritable_folder_is_a_one_line_error(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    with Store(db) as store:
        store.put_listing("echo", "tools/list", {"tools": [{"name": "echo", "inputSchema": {}}]})
        store.record_call(
            "echo", "tools/call", {"name": "echo", "arguments": {"x": 1}}, result={"content": []}
        )
    (tmp_path / "taken").write_text("a file")
    failed = _run("index", "build", "--db", str(db), "--index-dir", str(tmp_path / "taken" / "index"))
    assert failed.returncode == 1
    said = [line for line in failed.stderr.splitlines() if not line.startswith("indexing: ")]  # progress
    assert len(said) == 1 and "Traceback" not in failed.stderr, failed.stderr
    assert f"{tmp_path / 'taken' / 'index'}: cannot write the index" in failed.stderr


def test_export_into_a_missing_folder_is_a_one_line_error(tmp_path: Path) -> None:
    Store(tmp_path / "r.db").close()
    failed = _run("export", "--db", str(tmp_path / "r.db"), "-o", str(tmp_path / "no" / "out.jsonl"))
    assert failed.returncode == 1 and failed.stderr.count("\n") == 1, failed.stderr
    assert f"{tmp_path / 'no' / 'out.jsonl'}: No such file or directory" in failed.stderr


def test_index_build_says_what_it_is_doing_when_not_on_a_terminal(tmp_path: Path, embedder: Any) -> None:
    build_store(tmp_path / "r.db").close()
    arguments = ["index", "build", "--db", str(tmp_path / "r.db"), "--index-dir", str(tmp_path / "index")]
    result = CliRunner().invoke(cli, arguments)  # the output is no terminal, as in a log or CI
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("indexing: ")]
    calls = Store(tmp_path / "r.db").recordings(method="tools/call")
    assert (
        lines[0] == f"indexing: {len(calls)} calls to index (loading the embedding model may take a minute)"
    )
    assert lines[-1] == f"indexing: {len(calls)}/{len(calls)} calls indexed"


def test_index_build_takes_the_opt_in_static_embedding_and_keeps_it_until_told_otherwise(
    tmp_path: Path, embedder: Any
) -> None:
    build_store(tmp_path / "r.db").close()
    build = ["index", "build", "--db", str(tmp_path / "r.db"), "--index-dir", str(tmp_path / "index")]
    manifest = tmp_path / "index" / "manifest.json"
    static = CliRunner().invoke(cli, [*build, "--embedding", "minilm-static"])
    assert static.exit_code == 0, static.output
    assert json.loads(manifest.read_text())["model"] == STATIC_MODEL_ID
    assert f"({STATIC_MODEL_ID};" in static.stdout
    with Store(tmp_path / "r.db") as store:
        store.record_call("demo", "tools/call", {"name": "echo", "arguments": {"message": "new"}})
    again = CliRunner().invoke(cli, build)  # no --embedding: the index's own
    assert again.exit_code == 0, again.output
    assert json.loads(manifest.read_text())["model"] == STATIC_MODEL_ID
    assert "; 1 embedded, 0 from cache)" in again.stdout  # extended, not rebuilt
    default = CliRunner().invoke(cli, [*build, "--embedding", "minilm"])
    assert default.exit_code == 0, default.output
    assert json.loads(manifest.read_text())["model"] == DEFAULT_MODEL_ID


def test_serve_snapshot_says_it_verified_the_bundle_and_which_id_it_serves(
    tmp_path: Path, embedder: Any
) -> None:
    build_store(tmp_path / "r.db").close()
    frozen = freeze(tmp_path / "r.db", tmp_path / "snap")  # the warmed default embedder
    command = [*REPLAY_SIM, "serve", "--stdio", "--server", "demo", "--snapshot", str(tmp_path / "snap")]
    ran = subprocess.run(command, input="", capture_output=True, text=True, timeout=120)  # then hangs up
    assert ran.returncode == 0, ran.stderr
    assert (
        f"replay-sim: verified snapshot {tmp_path / 'snap'}: serving {frozen.id}" in ran.stderr.splitlines()
    )


def test_stats_names_the_tools_of_unknown_effect_that_block_the_most_recorded_answers(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    counter = [PYTHON, ROOT / "fixtures" / "counter_server.py"]
    script = [
        step("double", x=2),
        step("get", key="a"),
        step("put", key="a", value="1"),
        step("get", key="b"),
    ]
    anyio.run(run_script, proxy_stdio(db, "counter", counter), script)
    table = _run("stats", "--db", str(db)).stdout
    blocking = table.split("tools of unknown effect blocking the most recorded answers")[1]
    assert "`read_only = true`" in blocking and "`sandbox = true`" in blocking
    # Three answers were recorded after `double` (get a, put, get b), one after `put` (get b).
    rows = [line.split("\t") for line in blocking.splitlines()[2:] if line]
    assert rows == [["counter", "double", "3"], ["counter", "put", "1"]]


@pytest.mark.parametrize(
    "option", ["--keep-alive", "--body-timeout", "--session-idle-timeout", "--sandbox-timeout"]
)
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_serve_refuses_a_number_of_seconds_that_is_not_finite_naming_the_option(
    option: str, value: str
) -> None:
    refused = CliRunner().invoke(cli, ["serve", option, value])
    assert refused.exit_code == 2
    assert f"Invalid value for '{option}': '{value}' is not a finite number of seconds" in refused.output
