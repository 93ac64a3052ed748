"""Latency and faults injected on purpose: parsed, drawn deterministically, rendered, counted.

Waiting goes through an injected ``sleep`` that records what it was asked and returns at once, so
no test waits on (or asserts about) the wall clock. The dropped connection is checked over real HTTP.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from replay_helpers import ACCEPT, build_store, initialize, text_result

from replay_sim import match_of
from replay_sim.errors import ConfigError
from replay_sim.listener import serving_in_thread
from replay_sim.replay.core.replay import Replay
from replay_sim.replay.http.app import create_app
from replay_sim.replay.shaping.faults import FaultKind, FaultRule, Faults, Latency
from replay_sim.resolve.resolver import Resolver

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeSleep:
    """An injected ``sleep``: records each delay and returns at once."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)


def _replay(path: Path, **options: Any) -> Replay:
    store = build_store(path)
    store.record_call(
        "other",
        "tools/call",
        {"name": "slowping", "arguments": {}},
        result=text_result("p"),
        latency_ms=120.0,
    )
    return Replay(store, resolver=Resolver(store, index_dir=None), **options)


def _text(result: types.CallToolResult) -> str:
    assert isinstance(result.content[0], types.TextContent)
    return result.content[0].text


# -- parsing ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "parsed", "recorded_120"),
    [
        ("none", Latency("none"), 0.0),
        ("recorded", Latency("recorded"), 0.12),
        ("fixed:250", Latency("fixed", 250), 0.25),
        ("scale:0.5", Latency("scale", 0.5), 0.06),
        ("FIXED:0", Latency("fixed", 0), 0.0),
    ],
)
def test_latency_specs(spec: str, parsed: Latency, recorded_120: float) -> None:
    assert Latency.parse(spec) == parsed
    assert parsed.seconds(120.0) == pytest.approx(recorded_120)
    assert parsed.seconds(None) == (0.25 if spec == "fixed:250" else 0.0)  # a miss has no recording


@pytest.mark.parametrize(
    "spec", ["", "slow", "fixed", "fixed:-1", "fixed:abc", "scale:nan", "recorded:3", "fixed:1e12"]
)
def test_a_bad_latency_spec_names_the_accepted_forms(spec: str) -> None:
    with pytest.raises(ConfigError, match="none, recorded, fixed:MS"):
        Latency.parse(spec)


def test_fault_specs_name_tools_rates_and_kinds(tmp_path: Path) -> None:
    faults = Faults.parse(["0.05", "git/git_log=0.2:timeout,error", "*/search=1:is-error", "git/*=0"])
    assert faults.rules["*/*"] == FaultRule(0.05)
    assert faults.rules["git/git_log"] == FaultRule(0.2, (FaultKind.TIMEOUT, FaultKind.ERROR))
    assert faults.rule("git", "git_log") == faults.rules["git/git_log"]
    assert faults.rule("git", "git_status") == FaultRule(0.0)  # server/* before */*
    assert faults.rule("web", "search") == FaultRule(1.0, (FaultKind.IS_ERROR,))
    assert faults.rule("web", "fetch") == FaultRule(0.05)
    assert faults.hold == 30.0 and bool(faults) and not Faults()
    table = tmp_path / "match.toml"
    table.write_text(
        '[defaults]\nfloor = 0.9\n\n[faults]\nrate = 0.1\nkinds = ["disconnect"]\nhold = 5\n\n'
        '[faults.tools."git/git_log"]\nrate = 0.5\n'
    )
    loaded = Faults.parse([str(table)])
    assert loaded.rules == {
        "*/*": FaultRule(0.1, (FaultKind.DISCONNECT,)),
        "git/git_log": FaultRule(0.5, (FaultKind.DISCONNECT,)),
    }
    assert loaded.hold == 5 and loaded.drops
    assert Faults.parse([str(table)], hold=9).hold == 9


@pytest.mark.parametrize(
    ("specs", "said"),
    [
        (["1.5"], "from 0 to 1"),
        (["git=0.1"], "<server>/<tool>"),
        (["0.1:explode"], "unknown fault kinds"),
        (["a/b/c=0.1"], "<server>/<tool>"),
    ],
)
def test_a_bad_fault_spec_says_what_is_wrong(specs: list[str], said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        Faults.parse(specs)


def test_a_bad_faults_table_or_hold_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown keys"):
        Faults.from_dict({"rate": 0.1, "often": True})
    with pytest.raises(ConfigError, match="0 to 3600"):
        Faults({"*/*": FaultRule(0.1)}, hold=7200)
    broken = tmp_path / "broken.toml"
    broken.write_text("[faults\n")
    with pytest.raises(ConfigError, match="cannot read"):
        Faults.load(broken)


# -- drawing -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("nope/echo=0.5", "no recorded server 'nope' (recorded: demo, other)"),
        ("nope/*=0.5", "no recorded server 'nope'"),
        ("demo/slowping=0.5", "no recorded tool 'slowping' on 'demo' (recorded: "),
        ("*/nope=0.5", "no recorded tool 'nope' on any server"),
    ],
)
def test_faults_naming_a_server_or_tool_nothing_recorded_are_refused(
    tmp_path: Path, spec: str, said: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"faults {spec.split('=')[0]!r}: {said}")):
        _replay(tmp_path / "r.db", faults=Faults.parse([spec]))


@pytest.mark.parametrize(
    "spec", ["demo/echo=0.5", "other/slowping=0.5", "*/slowping=0.5", "demo/*=0.5", "0.5"]
)
def test_faults_naming_recorded_tools_listed_or_only_called_are_accepted(tmp_path: Path, spec: str) -> None:
    assert _replay(tmp_path / "r.db", faults=Faults.parse([spec])).injector.faults


def test_faults_are_a_pure_function_of_basis_seed_tool_and_call_index() -> None:
    faults = Faults({"*/*": FaultRule(0.1)})
    draws = [faults.draw("snap-1", 7, "git", "git_log", i) for i in range(2000)]
    assert draws == [
        Faults({"*/*": FaultRule(0.1)}).draw("snap-1", 7, "git", "git_log", i) for i in range(2000)
    ]
    failed = [d for d in draws if d is not None]
    assert 140 < len(failed) < 260  # about 10 % (fixed by the hash: the same count on every run)
    assert set(failed) == set(FaultKind)
    assert draws != [faults.draw("snap-1", 8, "git", "git_log", i) for i in range(2000)]  # another seed
    assert draws != [faults.draw("snap-2", 7, "git", "git_log", i) for i in range(2000)]  # another snapshot
    assert all(Faults({"*/*": FaultRule(1.0)}).draw("s", 0, "a", "b", i) is not None for i in range(50))
    assert all(Faults({"*/*": FaultRule(0.0)}).draw("s", 0, "a", "b", i) is None for i in range(50))
    assert Faults({"a/b": FaultRule(1.0)}).draw("s", 0, "a", "c", 0) is None


# -- in the replay -----------------------------------------------------------------------------------------


async def test_fixed_latency_holds_each_answer_and_says_so_in_provenance(tmp_path: Path) -> None:
    sleep = FakeSleep()
    replay = _replay(tmp_path / "fixed.db", latency="fixed:250", sleep=sleep)
    async with Client(replay.server("demo"), mode="legacy") as client:
        result = await client.call_tool("echo", {"message": "hello"})
    assert sleep.asked == [0.25]
    match = match_of(result)
    assert match is not None and match.status == "exact" and match.latency_ms == 250.0
    assert (
        replay.metrics.delays == 1
        and "replay_sim_injected_delay_seconds_sum 0.250000" in replay.metrics.prometheus()
    )


async def test_recorded_latency_uses_each_recordings_own(tmp_path: Path) -> None:
    sleep = FakeSleep()
    replay = _replay(tmp_path / "recorded.db", latency=Latency("scale", 2.0), sleep=sleep)
    async with Client(replay.server("other"), mode="legacy") as client:
        slow = await client.call_tool("slowping", {})
        await client.call_tool("ping", {})  # recorded without a latency: not held
    assert sleep.asked == [pytest.approx(0.24)]
    assert match_of(slow).latency_ms == 240.0  # type: ignore[union-attr]


async def test_an_is_error_fault_answers_a_failed_tool_and_leaves_the_state_unchanged(tmp_path: Path) -> None:
    replay = _replay(
        tmp_path / "is_error.db", faults=Faults({"demo/increment": FaultRule(1.0, (FaultKind.IS_ERROR,))})
    )
    meta = {"replay-sim/episode": "faulty"}
    async with Client(replay.server("demo"), mode="legacy") as client:
        failed = await client.call_tool("increment", {}, meta=meta)
        read = await client.call_tool("counter", {}, meta=meta)
    assert failed.is_error and "injected fault (is_error)" in _text(failed)
    match = match_of(failed)
    assert match is not None and (match.status, match.fault, match.recording) == ("fault", "is_error", None)
    assert _text(read) == "0"  # the write never happened
    summary = replay.episodes.summary(replay.episodes.get("faulty"))  # type: ignore[arg-type]
    assert summary["tiers"] == {"exact": 1, "fault": 1} and summary["faults"] == {"is_error": 1}
    assert summary["calls"] == 2
    text = replay.metrics.prometheus()
    assert 'replay_sim_faults_total{server="demo",tool="increment",kind="is_error"} 1' in text
    assert 'tier="fault"' in text


async def test_an_error_fault_is_a_json_rpc_error_carrying_its_provenance(tmp_path: Path) -> None:
    replay = _replay(tmp_path / "error.db", faults=Faults.parse(["demo/echo=1:error"]))
    async with Client(replay.server("demo"), mode="legacy") as client:
        with pytest.raises(MCPError) as raised:
            await client.call_tool("echo", {"message": "hello"})
        assert _text(await client.call_tool("counter", {})) == "0"  # other tools answer
    assert raised.value.error.code == types.INTERNAL_ERROR
    match = match_of(raised.value)
    assert match is not None and match.fault == "error" and match.status == "fault"


async def test_a_timeout_fault_holds_the_answer_then_times_out(tmp_path: Path) -> None:
    sleep = FakeSleep()
    faults = Faults({"demo/echo": FaultRule(1.0, (FaultKind.TIMEOUT,))}, hold=45)
    replay = _replay(tmp_path / "timeout.db", faults=faults, latency="fixed:10", sleep=sleep)
    async with Client(replay.server("demo"), mode="legacy") as client:
        with pytest.raises(MCPError) as raised:
            await client.call_tool("echo", {"message": "hello"})
    assert sleep.asked == [45]
    assert raised.value.error.code == types.REQUEST_TIMEOUT and "45 s" in raised.value.error.message
    assert match_of(raised.value).latency_ms == 45_000  # type: ignore[union-attr]


async def test_a_disconnect_fault_off_http_is_a_connection_closed_error(tmp_path: Path) -> None:
    replay = _replay(tmp_path / "drop.db", faults=Faults.parse(["demo/echo=1:disconnect"]))
    async with Client(replay.server("demo"), mode="legacy") as client:
        with pytest.raises(MCPError) as raised:
            await client.call_tool("echo", {"message": "hello"})
    assert raised.value.error.code == types.CONNECTION_CLOSED


async def test_the_same_episode_gets_the_same_faults_on_every_run_and_another_seed_others(
    tmp_path: Path,
) -> None:
    faults = Faults.parse(["0.4:is_error"])

    async def run(path: Path, episode: str, seed: int) -> list[bool]:
        replay = _replay(path, faults=faults)
        replay.episodes.create(episode, seed)
        meta = {"replay-sim/episode": episode}
        async with Client(replay.server("demo"), mode="legacy") as client:
            return [
                (await client.call_tool("echo", {"message": "hello"}, meta=meta)).is_error for _ in range(30)
            ]

    first = await run(tmp_path / "one.db", "ep", 1)
    assert first == await run(tmp_path / "two.db", "ep", 1)  # another process, same store content
    assert first != await run(tmp_path / "three.db", "ep", 2)
    assert 3 < sum(first) < 25


def test_a_dropped_connection_over_http_closes_it_without_an_answer_and_the_server_goes_on(
    tmp_path: Path,
) -> None:
    replay = _replay(tmp_path / "http-drop.db", faults=Faults.parse(["demo/echo=1:disconnect"]))
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"message": "hello"}},
    }
    with serving_in_thread(create_app(replay)) as url:
        endpoint = f"{url}/episodes/drop/mcp/demo"
        with httpx2.Client(timeout=30) as http:
            opened = http.post(endpoint, json=initialize(), headers=ACCEPT)
            headers = ACCEPT | {
                "Mcp-Session-Id": opened.headers["mcp-session-id"],
                "MCP-Protocol-Version": "2025-11-25",
            }
            http.post(
                endpoint, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers
            )
            with pytest.raises(httpx2.TransportError):
                response = http.post(endpoint, json=body, headers=headers)
                response.read()
                assert "result" not in response.text and "error" not in response.text  # pragma: no cover
            tools = http.post(
                endpoint, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=headers
            )
            assert tools.status_code == 200 and "counter" in tools.text
        summary = httpx2.get(f"{url}/api/episodes/drop", timeout=30).json()
        assert summary["faults"] == {"disconnect": 1}

    async def modern() -> None:
        with serving_in_thread(create_app(replay)) as url:  # the SDK's own client sees the stream end
            async with Client(f"{url}/episodes/drop2/mcp/demo") as client:
                with pytest.raises(MCPError):
                    await client.call_tool("echo", {"message": "hello"})
                assert _text(await client.call_tool("counter", {})) == "0"

    anyio.run(modern)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--latency", "slow"], "fixed:MS"),
        (["--faults", "2"], "from 0 to 1"),
        (["--faults", "demo/echo=0.1:explode"], "unknown fault kinds"),
        (
            ["--faults", "nope/echo=0.5"],
            "faults 'nope/echo': no recorded server 'nope' (recorded: demo, other)",
        ),
        (["--faults", "demo/ech=0.5"], "faults 'demo/ech': no recorded tool 'ech' on 'demo'"),
    ],
)
def test_serve_refuses_a_bad_latency_or_fault_spec_in_one_line(
    tmp_path: Path, args: list[str], said: str
) -> None:
    build_store(tmp_path / "cli.db").close()
    command = [
        sys.executable,
        "-m",
        "replay_sim",
        "serve",
        "--db",
        str(tmp_path / "cli.db"),
        "--port",
        "0",
        *args,
    ]
    ran = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode != 0 and said in ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ("rate = true", "[faults]: field 'rate' must be a number from 0 to 1, not a boolean (True)"),
        ('rate = "0.5"', "[faults]: field 'rate' must be a number from 0 to 1, not a str ('0.5')"),
        ('rate = 0.5\nkinds = "error"', "[faults]: field 'kinds' must be an array of fault kind names"),
        ("rate = 0.5\nkinds = true", "[faults]: field 'kinds' must be an array of fault kind names"),
        ("rate = 0.5\nkinds = [1]", "[faults]: field 'kinds' must be an array of fault kind names"),
        ('[faults.tools."demo/echo"]\nrate = false', ".tools.\"demo/echo\": field 'rate' must be a number"),
        ('hold = "5"\nrate = 0.1', "[faults]: hold must be a number of seconds"),
    ],
)
def test_a_faults_table_is_typed_strictly_and_refused_in_one_line_naming_the_field(
    tmp_path: Path, table: str, said: str
) -> None:
    config = tmp_path / "faults.toml"
    config.write_text(f"[faults]\n{table}\n" if not table.startswith("[") else table + "\n")
    with pytest.raises(ConfigError) as refused:
        Faults.parse([str(config)])
    assert said in str(refused.value) and "\n" not in str(refused.value)
