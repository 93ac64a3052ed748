"""Recording real MCP servers through the real `replay-sim record` CLI, over stdio and over HTTP.

Each case runs one scripted session three times against a fresh server state: directly, through
the stdio proxy and through the HTTP proxy. The store must hold every call with a result equal to
what the proxied client got (exactly) and to what the direct client got (after dropping volatile
fields), plus the server info and listings.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from recording_helpers import (
    BIN,
    ECHO_SERVER,
    NODE_BIN,
    PYTHON,
    Script,
    echo_http,
    proxy_http,
    proxy_stdio,
    run_script,
    stdio,
    step,
)

from replay_sim.canonical import canonical_json
from replay_sim.protocol import CALL_METHODS
from replay_sim.store import Store

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

_DATETIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[^\"\\]*")


@dataclass
class Case:
    """One real server, how to reset its state, and a scripted session."""

    name: str
    command: list[str]
    script: Script
    env: dict[str, str] = field(default_factory=dict)
    reset: Callable[[], None] = lambda: None
    volatile: Callable[[str], str] = lambda text: text


def _git_repo(path: Path) -> Path:
    env = {
        "GIT_AUTHOR_DATE": "2026-01-02T03:04:05Z",
        "GIT_COMMITTER_DATE": "2026-01-02T03:04:05Z",
        "HOME": str(path.parent),
        "PATH": "/usr/bin:/bin",
    }
    path.mkdir()
    for args in (
        ["init", "-q", "-b", "main"],
        ["config", "user.email", "test@example.com"],
        ["config", "user.name", "Test"],
    ):
        subprocess.run(["git", *args], cwd=path, check=True, env=env)
    (path / "README.md").write_text("hello\n")
    subprocess.run(["git", "add", "README.md"], cwd=path, check=True, env=env)
    subprocess.run(["git", "commit", "-q", "-m", "first commit"], cwd=path, check=True, env=env)
    (path / "README.md").write_text("hello\nworld\n")  # an unstaged change for git_diff_unstaged
    return path


def _cases(tmp: Path) -> list[Case]:
    repo = _git_repo(tmp / "repo")
    memory = tmp / "memory.jsonl"
    files = tmp / "files"

    def reset_memory() -> None:
        memory.unlink(missing_ok=True)

    def reset_files() -> None:
        shutil.rmtree(files, ignore_errors=True)
        files.mkdir()
        (files / "seed.txt").write_text("seed\n")

    listings: Script = [("tools/list", {})]
    return [
        Case(
            "time",
            [str(BIN / "mcp-server-time"), "--local-timezone", "UTC"],
            [
                *listings,
                step(
                    "convert_time", source_timezone="Europe/Paris", time="12:00", target_timezone="Asia/Tokyo"
                ),
                step("convert_time", source_timezone="America/New_York", time="23:30", target_timezone="UTC"),
                step("convert_time", source_timezone="Mars/Olympus", time="12:00", target_timezone="UTC"),
                step("get_current_time", timezone="UTC"),
            ],
            volatile=lambda text: _DATETIME.sub("<datetime>", text),
        ),
        Case(
            "git",
            [str(BIN / "mcp-server-git"), "--repository", str(repo)],
            [
                *listings,
                step("git_status", repo_path=str(repo)),
                step("git_log", repo_path=str(repo), max_count=5),
                step("git_show", repo_path=str(repo), revision="HEAD"),
                step("git_branch", repo_path=str(repo), branch_type="local"),
                step("git_diff_unstaged", repo_path=str(repo)),
                step("git_show", repo_path=str(repo), revision="no-such-revision"),
            ],
        ),
        Case(
            "everything",
            [str(NODE_BIN / "mcp-server-everything")],
            [
                *listings,
                ("resources/list", {}),
                ("resources/templates/list", {}),
                ("prompts/list", {}),
                step("echo", message="hello, world"),
                step("get-sum", a=2, b=3.5),
                step("get-annotated-message", messageType="success", includeImage=False),
                step("get-structured-content", location="Chicago"),
                step("get-tiny-image"),
                step("trigger-long-running-operation", duration=0.2, steps=2),
                ("resources/read", {"uri": "demo://resource/static/document/features.md"}),
                ("prompts/get", {"name": "simple-prompt"}),
                ("prompts/get", {"name": "args-prompt", "arguments": {"city": "Paris", "state": "IDF"}}),
                (
                    "completion/complete",
                    {
                        "ref": {"type": "ref/prompt", "name": "completable-prompt"},
                        "argument": {"name": "department", "value": "E"},
                    },
                ),
                step("no-such-tool"),
            ],
        ),
        Case(
            "memory",
            [str(NODE_BIN / "mcp-server-memory")],
            [
                *listings,
                step(
                    "create_entities",
                    entities=[{"name": "Ada", "entityType": "person", "observations": ["math"]}],
                ),
                step(
                    "create_entities",
                    entities=[{"name": "Babbage", "entityType": "person", "observations": []}],
                ),
                step(
                    "create_relations", relations=[{"from": "Ada", "to": "Babbage", "relationType": "knows"}]
                ),
                step("add_observations", observations=[{"entityName": "Ada", "contents": ["wrote notes"]}]),
                step("read_graph"),
                step("search_nodes", query="notes"),
                step("open_nodes", names=["Ada"]),
            ],
            env={"MEMORY_FILE_PATH": str(memory)},
            reset=reset_memory,
        ),
        Case(
            "filesystem",
            [str(NODE_BIN / "mcp-server-filesystem"), str(files)],
            [
                *listings,
                step("list_allowed_directories"),
                step("write_file", path=str(files / "a.txt"), content="alpha\nbeta\n"),
                step("read_text_file", path=str(files / "a.txt")),
                step("edit_file", path=str(files / "a.txt"), edits=[{"oldText": "beta", "newText": "gamma"}]),
                step("create_directory", path=str(files / "sub")),
                step("list_directory", path=str(files)),
                step("search_files", path=str(files), pattern="*.txt"),
                step("read_text_file", path=str(files / "missing.txt")),
                step("read_text_file", path="/etc/passwd"),
            ],
            reset=reset_files,
        ),
    ]


def _comparable(answer: dict[str, Any] | None, error: dict[str, Any] | None = None) -> dict[str, Any]:
    if error is not None:
        return {"error": {"code": error["code"], "message": error["message"]}}
    assert answer is not None
    return answer


def _check_store(db: Path, case: Case, proxied: list[dict[str, Any]], direct: list[dict[str, Any]]) -> None:
    with Store(db, readonly=True) as store:
        server = store.server(case.name)
        assert server is not None and server.info["name"], "server info is recorded"
        recorded = store.recordings(case.name)
        expected = [(i, m, p) for i, (m, p) in enumerate(case.script) if m in CALL_METHODS]
        assert [(r.method, r.params) for r in recorded] == [(m, p) for _, m, p in expected]
        assert len({r.session for r in recorded}) == 1, "one store session per client session"
        assert [r.seq for r in recorded] == list(range(1, len(recorded) + 1))
        for rec, (i, _, _) in zip(recorded, expected, strict=True):
            got = _comparable(rec.result, rec.error)
            assert canonical_json(got) == canonical_json(proxied[i]), f"call {i}: recording != proxied answer"
            assert case.volatile(canonical_json(got)) == case.volatile(canonical_json(direct[i])), f"call {i}"
        listings = store.listings(case.name)
        for i, (method, _) in enumerate(case.script):
            if method.endswith("/list"):
                assert canonical_json(listings[method]) == canonical_json(direct[i]), method


@pytest.mark.parametrize("name", ["time", "git", "everything", "memory", "filesystem"])
async def test_a_real_server_is_recorded_exactly_through_the_stdio_and_http_proxies(
    tmp_path: Path, name: str
) -> None:
    case = next(c for c in _cases(tmp_path) if c.name == name)
    env_options = [option for key, value in case.env.items() for option in ("-e", f"{key}={value}")]

    case.reset()
    direct = await run_script(stdio(case.command[0], *case.command[1:], env=case.env or None), case.script)
    assert any("error" not in answer and not answer.get("isError") for answer in direct)

    case.reset()
    db_stdio = tmp_path / "stdio.db"
    proxied = await run_script(proxy_stdio(db_stdio, name, case.command, *env_options), case.script)
    _check_store(db_stdio, case, proxied, direct)

    case.reset()
    db_http = tmp_path / "http.db"
    async with proxy_http(db_http, "--name", name, *env_options, "--", *case.command) as (base, _):
        proxied = await run_script(f"{base}/mcp/{name}", case.script)
    _check_store(db_http, case, proxied, direct)


async def test_progress_notifications_are_forwarded_and_recorded_with_their_call(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    from mcp import Client

    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    target = proxy_stdio(db, "everything", [NODE_BIN / "mcp-server-everything"])
    with anyio.fail_after(60):
        async with Client(target, mode="legacy", cache=None) as client:
            await client.call_tool(
                "trigger-long-running-operation", {"duration": 0.2, "steps": 2}, progress_callback=on_progress
            )
    assert [p for p, _, _ in seen] == [1.0, 2.0]
    with Store(db, readonly=True) as store:
        (rec,) = store.recordings("everything")
    progress = [n for n in rec.notifications if n["method"] == "notifications/progress"]
    assert [n["params"]["progress"] for n in progress] == [1, 2]
    assert all("progressToken" not in n["params"] for n in progress)


async def test_a_streamable_http_upstream_is_recorded(tmp_path: Path) -> None:
    script: Script = [
        ("tools/list", {}),
        ("prompts/list", {}),
        ("tools/call", {"name": "echo", "arguments": {"text": "über"}}),
        ("tools/call", {"name": "add", "arguments": {"a": 1, "b": 2.5}}),
        ("resources/read", {"uri": "echo://item/7"}),
        ("prompts/get", {"name": "paint", "arguments": {"colour": "green"}}),
        (
            "completion/complete",
            {"ref": {"type": "ref/prompt", "name": "paint"}, "argument": {"name": "colour", "value": "g"}},
        ),
    ]
    case = Case("echo", [], script)
    async with echo_http() as url:
        direct = await run_script(url, script)
        db = tmp_path / "h.db"
        target = stdio(BIN / "replay-sim", "record", "--db", db, "--name", "echo", "--url", url)
        proxied = await run_script(target, script)
    _check_store(db, case, proxied, direct)
    assert PYTHON and ECHO_SERVER.is_file()
