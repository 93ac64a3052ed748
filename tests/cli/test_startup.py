"""A command imports only what it runs: ``serve --stdio`` answers without FastAPI, the recorder or torch."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from replay_helpers import build_store

from replay_sim.cli import COMMANDS, cli
from replay_sim.cli.progress import PERIOD_ENV
from replay_sim.resolve.build import build_index
from replay_sim.resolve.embedding import SentenceTransformerEmbedder

# Run the CLI as `python -m replay_sim` does, then say (on stderr, after serving) which of these
# modules the process imported: none is needed to replay exact hits over stdio.
_PROBE = """
import atexit, json, runpy, sys
HEAVY = (
    "fastapi", "torch", "sentence_transformers", "replay_sim.record.recorder", "replay_sim.replay.http.api"
)
said = lambda: print("IMPORTED " + json.dumps([m for m in HEAVY if m in sys.modules]), file=sys.stderr)
atexit.register(said)
sys.argv = ["replay-sim", *sys.argv[1:]]
runpy.run_module("replay_sim", run_name="__main__")
"""


def test_every_command_is_named_with_the_module_that_registers_it() -> None:
    for module in sorted(set(COMMANDS.values())):
        importlib.import_module(f"replay_sim.cli.{module}")
    assert set(cli.commands) == set(COMMANDS)
    for name, module in COMMANDS.items():
        assert cli.commands[name].callback.__module__ == f"replay_sim.cli.{module}", name  # type: ignore[union-attr]


def test_serve_stdio_answers_an_exact_hit_without_importing_fastapi_the_recorder_or_torch(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    store = build_store(tmp_path / "r.db")
    build_index(store, embedder=embedder, directory=tmp_path / "index")  # as `index build` does
    store.close()
    requests = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"message": "hello"}},
        },
    ]
    command = [sys.executable, "-c", textwrap.dedent(_PROBE), "serve", "--stdio", "--server", "demo"]
    done = subprocess.run(
        [*command, "--db", str(tmp_path / "r.db"), "--index-dir", str(tmp_path / "index")],
        input="".join(json.dumps(r) + "\n" for r in requests),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert [a["id"] for a in answers] == [1, 2]
    assert answers[1]["result"]["_meta"]["replay-sim/match"]["status"] == "exact"
    (imported,) = [line for line in done.stderr.splitlines() if line.startswith("IMPORTED ")]
    assert json.loads(imported.removeprefix("IMPORTED ")) == []


def test_import_says_how_far_it_is_in_lines_when_not_on_a_terminal(tmp_path: Path) -> None:
    lines = [{"type": "server", "server": "s", "info": {"name": "s", "version": "1"}, "capabilities": {}}]
    lines += [
        {
            "type": "call",
            "server": "s",
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"n": n}},
            "result": {"content": [{"type": "text", "text": str(n)}]},
        }
        for n in range(3000)
    ]
    jsonl = tmp_path / "calls.jsonl"
    jsonl.write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = subprocess.run(
        [sys.executable, "-m", "replay_sim", "import", str(jsonl), "--db", str(tmp_path / "r.db")],
        env={**os.environ, PERIOD_ENV: "0"},  # a line each time it is told, not each 2 s
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("importing: ")]
    size = f"{jsonl.stat().st_size / 1e6:.1f}"
    assert said and said[-1] == f"importing: {size}/{size} MB", done.stderr
    assert "imported 3000 calls" in done.stdout


def test_snapshot_freeze_says_how_far_its_index_is_in_lines_when_not_on_a_terminal(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    store = build_store(tmp_path / "r.db")
    index = build_index(store, embedder=embedder, directory=tmp_path / "index")  # embeddings cached: no model
    calls = sum(len(part) for part in index.partitions.values())
    store.close()
    freeze = ["snapshot", "freeze", "--db", str(tmp_path / "r.db"), "--out", str(tmp_path / "snap")]
    done = subprocess.run(
        [sys.executable, "-m", "replay_sim", *freeze],
        env={**os.environ, PERIOD_ENV: "0"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith("indexing the snapshot: ")]
    assert said and said[-1] == f"indexing the snapshot: {calls}/{calls} calls", done.stderr
