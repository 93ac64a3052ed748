"""What a new user meets first, as they meet it (issue 31, item 4): ``serve --help`` grouped, one output
flag spelling, a typed ``serving()``, free and named ports, quiet stderr off a terminal, a recorder that
says what to use instead of an episode URL, ``serve --ray --port 0`` refused with a hint, and
``index build`` saying what it wrote."""

from __future__ import annotations

import contextlib
import inspect
import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import httpx2
import pytest
from click.testing import CliRunner
from recording_helpers import ECHO_SERVER, PYTHON, proxy_http
from replay_helpers import build_store

import replay_sim
from replay_sim.cli import cli
from replay_sim.cli.serve_options import SERVE_GROUPS

REPLAY_SIM = [sys.executable, "-m", "replay_sim"]


def test_serve_help_lists_its_options_under_one_heading_per_concern() -> None:
    shown = CliRunner().invoke(cli, ["serve", "--help"], terminal_width=200).output
    headings = [
        line[:-1] for line in shown.splitlines() if line and not line[0].isspace() and line[-1] == ":"
    ]
    assert headings == [*SERVE_GROUPS, "Options"]  # the groups in order, then what no group names: --help
    sections = dict(zip(headings, re.split(r"^\S.*:$", shown, flags=re.M)[1:], strict=True))
    assert "--miss-detail" in sections["Misses and sandboxes"]
    assert "--max-episodes" in sections["Episodes, latency and faults"]
    assert "--max-concurrent" in sections["Limits"]
    assert "--access-log" in sections["Observability"]
    assert "--port" in sections["Serving"]
    assert sections["Options"].split() == ["-h,", "--help", "Show", "this", "message", "and", "exit."]


def test_every_serve_option_is_in_exactly_one_group() -> None:
    command = cli.get_command(click.Context(cli), "serve")
    assert command is not None
    names = [p.name for p in command.params if not getattr(p, "hidden", False)]
    grouped = [name for group in SERVE_GROUPS.values() for name in group]
    assert sorted(grouped) == sorted(n for n in names if n != "help")


def test_export_writes_to_out_and_still_takes_the_former_output_flag_unlisted(tmp_path: Path) -> None:
    build_store(tmp_path / "r.db").close()
    for flag in ("--out", "-o", "--output"):
        target = tmp_path / f"export{flag}.jsonl"
        done = CliRunner().invoke(cli, ["export", "--db", str(tmp_path / "r.db"), flag, str(target)])
        assert done.exit_code == 0, done.output
        assert target.read_text().count("\n") > 5
    shown = CliRunner().invoke(cli, ["export", "--help"]).output
    assert "--out" in shown and "--output" not in shown and "-o," not in shown
    for verb in (["merge"], ["snapshot", "freeze"]):
        assert "--out" in CliRunner().invoke(cli, [*verb, "--help"]).output


def test_serving_takes_every_option_as_a_typed_keyword_with_the_replays_defaults() -> None:
    public = inspect.signature(replay_sim.serving).parameters
    assert all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in public.values())
    assert all(p.annotation is not inspect.Parameter.empty for p in public.values())
    door = importlib_serving()
    for source in (inspect.signature(door).parameters, inspect.signature(replay_sim.open_replay).parameters):
        for name, parameter in source.items():
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                continue
            assert name in public, name
            assert public[name].default == parameter.default, name


def importlib_serving() -> Any:
    """The HTTP door's ``serving()``, wherever the package keeps it (found from the public ``Serving``)."""
    return sys.modules[replay_sim.Serving.__module__].serving


def test_serve_on_a_taken_port_says_which_option_picks_another(tmp_path: Path) -> None:
    build_store(tmp_path / "r.db").close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        command = [*REPLAY_SIM, "serve", "--db", str(tmp_path / "r.db"), "--port", port]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1
    (line,) = [x for x in done.stderr.splitlines() if "error" in x]
    assert f"127.0.0.1:{port}" in line and "--port" in line and "--port 0" in line


def test_serve_ray_refuses_port_0_with_a_hint(tmp_path: Path) -> None:
    (tmp_path / "snap").mkdir()
    done = CliRunner().invoke(cli, ["serve", "--ray", "--snapshot", str(tmp_path / "snap"), "--port", "0"])
    assert done.exit_code == 2
    assert "--ray needs a fixed port" in done.output and "--port 8765" in done.output


def test_index_build_says_what_it_wrote_without_saying_index_twice(tmp_path: Path, embedder: Any) -> None:
    build_store(tmp_path / "r.db").close()
    arguments = ["index", "build", "--db", str(tmp_path / "r.db"), "--index-dir", str(tmp_path / "index")]
    done = CliRunner().invoke(cli, arguments)
    assert done.exit_code == 0, done.output
    assert "index index" not in done.stdout
    assert re.search(r"^indexed \d+ calls in \d+ partitions into .*index \(", done.stdout, re.M), done.stdout


def test_loading_the_model_draws_no_progress_bar_on_a_stderr_that_is_no_terminal() -> None:
    code = "import replay_sim; print(replay_sim.SentenceTransformerEmbedder().encode(['hello']).shape)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Loading weights" not in done.stderr and "it/s" not in done.stderr, done.stderr


@pytest.mark.anyio
async def test_the_recorder_answers_an_episode_url_with_what_to_use_instead(tmp_path: Path) -> None:
    recorder = proxy_http(tmp_path / "r.db", "--name", "echo", "--", PYTHON, ECHO_SERVER)
    async with recorder as (base, _), httpx2.AsyncClient() as client:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        answer = await client.post(f"{base}/episodes/ep-1/mcp/echo", json=body)
    assert answer.status_code == 404
    message = answer.json()["error"]["message"]
    assert "/mcp/echo" in message and "x-replay-episode" in message.lower(), message


@pytest.mark.slow
def test_demo_once_runs_while_8765_is_taken() -> None:
    with socket.socket() as taken:
        with contextlib.suppress(OSError):  # already taken by someone else: the same test
            taken.bind(("127.0.0.1", 8765))
        done = subprocess.run([*REPLAY_SIM, "demo", "--once"], capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr
    assert "semantic hit" in done.stdout and not json.dumps(done.stderr).count("Traceback")
