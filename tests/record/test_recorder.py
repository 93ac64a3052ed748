"""The recording proxy against the fixture server: sessions, failures, store errors, protocol eras."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from recording_helpers import (
    ECHO_SERVER,
    PYTHON,
    REPLAY_SIM,
    proxy_http,
    proxy_stdio,
    raw_client,
    raw_request,
    spawn,
)

from replay_sim import open_replay
from replay_sim.errors import ConfigError, UpstreamError
from replay_sim.record.config import DEFAULT_TIMEOUT, UpstreamSpec
from replay_sim.record.config_file import load_config
from replay_sim.record.recorder import Recorder, recording
from replay_sim.store import Store

pytestmark = pytest.mark.anyio

ECHO = UpstreamSpec(command=PYTHON, args=(str(ECHO_SERVER),))


async def test_each_client_session_gets_its_own_store_session_and_listings_are_recorded(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(60):
        async with recording(tmp_path / "r.db", {"echo": ECHO}) as recorder:
            for text in ("one", "two"):
                async with raw_client(recorder.server("echo")) as client:
                    await client.list_tools()
                    await client.list_resources()
                    await client.list_resource_templates()
                    await client.list_prompts()
                    await client.call_tool("echo", {"text": text})
                    await client.complete(
                        types.PromptReference(type="ref/prompt", name="paint"),
                        {"name": "colour", "value": "b"},
                    )
    with Store(tmp_path / "r.db", readonly=True) as store:
        sessions = store.sessions()
        assert [s["calls"] for s in sessions] == [2, 2]
        assert set(store.listings("echo")) == {
            "tools/list",
            "resources/list",
            "resources/templates/list",
            "prompts/list",
        }
        (server,) = store.servers()
        assert server.info == {"name": "echo", "version": "1.0.0"}
        assert server.instructions == "A deterministic fixture server."
        completion = store.recordings("echo", method="completion/complete")[0]
        assert completion.result == {"completion": {"values": ["blue"], "total": 1, "hasMore": False}}


async def test_every_advertised_listing_is_recorded_before_any_client_asks(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with recording(tmp_path / "r.db", {"echo": ECHO}):
            pass  # no client at all
    with Store(tmp_path / "r.db", readonly=True) as store:
        listings = store.listings("echo")
    assert set(listings) == {"tools/list", "resources/list", "resources/templates/list", "prompts/list"}
    assert "echo" in {tool["name"] for tool in listings["tools/list"]["tools"]}
    assert all("nextCursor" not in listing for listing in listings.values())


async def test_a_modern_era_client_is_served_and_its_envelope_is_not_forwarded(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with (
            recording(tmp_path / "m.db", {"echo": ECHO}) as recorder,
            Client(recorder.server("echo"), cache=None) as client,  # mode="auto": 2026-07-28
        ):
            assert client.protocol_version == "2026-07-28"
            assert client.server_info is not None and client.server_info.name == "echo"
            tools = await client.list_tools()
            result = await client.call_tool("add", {"a": 2, "b": 3}, meta={"replay-sim/episode": "ep-1"})
    assert [t.name for t in tools.tools][:2] == ["echo", "add"]
    assert result.structured_content == {"sum": 5}
    with Store(tmp_path / "m.db", readonly=True) as store:
        (rec,) = store.recordings("echo")
    assert rec.params == {"name": "add", "arguments": {"a": 2, "b": 3}}
    assert rec.result == {
        "content": [{"type": "text", "text": "5"}],
        "structuredContent": {"sum": 5},
        "isError": False,
    }


async def test_an_upstream_crash_mid_call_is_an_error_for_that_client_only(tmp_path: Path) -> None:
    db = tmp_path / "crash.db"
    with anyio.fail_after(90):
        async with (
            proxy_http(db, "--name", "echo", "--", PYTHON, ECHO_SERVER) as (base, _),
            raw_client(f"{base}/mcp/echo") as healthy,
            raw_client(f"{base}/mcp/echo") as doomed,
        ):
            assert (await healthy.call_tool("echo", {"text": "before"})).content[0].text == "before"
            with pytest.raises(MCPError) as caught:
                await doomed.call_tool("crash", {"after_progress": True})
            assert "crashing on request" in caught.value.error.message
            assert (await healthy.call_tool("echo", {"text": "after"})).content[0].text == "after"
            with pytest.raises(MCPError):
                await doomed.call_tool("echo", {"text": "too late"})
    with Store(db, readonly=True) as store:
        crash = store.recordings("echo", name="crash")[0]
        echoes = [r.arguments["text"] for r in store.recordings("echo", name="echo") if r.result]
    assert crash.result is None and crash.error is not None
    assert (
        crash.error["code"] == -32000 and "closed the connection during tools/call" in crash.error["message"]
    )
    assert [n["params"]["message"] for n in crash.notifications] == ["about to crash"]
    assert echoes == ["before", "after"]


async def test_a_stdio_clients_call_its_server_crashes_on_is_answered_and_recorded_as_that_error(
    tmp_path: Path,
) -> None:
    db = tmp_path / "crash.db"
    with anyio.fail_after(90):
        async with raw_client(proxy_stdio(db, "echo", [PYTHON, ECHO_SERVER])) as client:
            assert (await client.call_tool("echo", {"text": "before"})).content[0].text == "before"
            with pytest.raises(MCPError) as caught:  # a plain call, passed through
                await client.call_tool("crash", {"after_progress": True})
            assert "closed the connection during tools/call" in caught.value.error.message
            assert "crashing on request" in caught.value.error.message
    with Store(db, readonly=True) as store:
        crash = store.recordings("echo", name="crash")[0]
    assert crash.result is None and crash.error is not None
    assert crash.error["code"] == -32000 and "closed the connection" in crash.error["message"]
    assert [n["params"]["message"] for n in crash.notifications] == ["about to crash"]


async def test_an_upstream_that_never_starts_names_the_command_and_its_stderr(tmp_path: Path) -> None:
    missing = UpstreamSpec(command=str(tmp_path / "no-such-server"), args=("--flag",))
    with Store(tmp_path / "s.db") as store:
        with (
            anyio.fail_after(30),
            pytest.raises(UpstreamError, match="no-such-server --flag cannot be started"),
        ):
            async with Recorder(store, {"x": missing}):
                pass
        dies = UpstreamSpec(command=PYTHON, args=("-c", "import sys; sys.exit('fatal: no config file')"))
        with anyio.fail_after(30), pytest.raises(UpstreamError) as caught:
            async with Recorder(store, {"x": dies}):
                pass
        assert "did not initialise" in str(caught.value) and "fatal: no config file" in str(caught.value)
        hangs = UpstreamSpec(command=PYTHON, args=("-c", "import sys; sys.stdin.read()"), startup_timeout=1)
        with anyio.fail_after(30), pytest.raises(UpstreamError, match="did not answer initialize within 1s"):
            async with Recorder(store, {"x": hangs}):
                pass


async def test_the_cli_exits_non_zero_with_one_line_when_the_upstream_never_starts(tmp_path: Path) -> None:
    command = [
        REPLAY_SIM,
        "record",
        "--db",
        tmp_path / "c.db",
        "--",
        PYTHON,
        "-c",
        "import sys; sys.exit('boom!')",
    ]
    with anyio.fail_after(60):
        async with spawn(*command) as process:
            await process.process.wait()
            await process.wait_for(r"replay-sim: error: upstream command .* did not initialise.*boom!")
    assert process.process.returncode == 1


async def test_an_unreachable_http_upstream_is_an_upstream_error(tmp_path: Path) -> None:
    with anyio.fail_after(60), Store(tmp_path / "u.db") as store:
        # Port 9 (discard) on loopback: nothing listens there.
        spec = UpstreamSpec(url="http://127.0.0.1:9/mcp", startup_timeout=10)
        with pytest.raises(UpstreamError, match=r"http://127\.0\.0\.1:9/mcp"):
            async with Recorder(store, {"remote": spec}):
                pass


async def test_an_unknown_server_name_is_the_config_error_a_replay_gives_naming_the_known_ones(
    tmp_path: Path,
) -> None:
    db = tmp_path / "n.db"
    with anyio.fail_after(60):
        async with recording(db, {"echo": ECHO, "echo2": ECHO}) as recorder:
            with pytest.raises(ConfigError, match=r"no upstream named 'nope'.*echo, echo2") as recorded:
                recorder.server("nope")
    with pytest.raises(ConfigError, match=r"'nope'.*echo, echo2") as replayed:
        open_replay(db).server("nope")
    assert type(recorded.value) is type(replayed.value)


async def test_a_full_disk_is_a_clear_error_and_leaves_no_partial_row(tmp_path: Path) -> None:
    store = Store(tmp_path / "full.db")
    with anyio.fail_after(60):
        async with (
            recording(store, {"echo": ECHO}) as recorder,
            raw_client(recorder.server("echo")) as client,
        ):
            await client.call_tool("echo", {"text": "fits"})
            (pages,) = store.conn.execute("PRAGMA page_count").fetchone()
            store.conn.execute(f"PRAGMA max_page_count={pages}")
            answer = await raw_request(
                client, "tools/call", {"name": "echo", "arguments": {"text": "x" * 100_000}}
            )
            assert "could not record tools/call echo" in answer["error"]["message"]
            assert "disk is full" in answer["error"]["message"]
            store.conn.execute("PRAGMA max_page_count=1073741823")
            assert (await client.call_tool("echo", {"text": "fits again"})).content[0].text == "fits again"
    texts = [r.arguments["text"] for r in store.recordings("echo")]
    store.close()
    assert texts == ["fits", "fits again"]
    assert sqlite3.connect(tmp_path / "full.db").execute("PRAGMA integrity_check").fetchone() == ("ok",)


async def test_a_locked_store_is_a_clear_error_and_the_result_is_withheld(tmp_path: Path) -> None:
    store = Store(tmp_path / "locked.db")
    store.conn.execute("PRAGMA busy_timeout=50")
    with anyio.fail_after(60):
        async with (
            recording(store, {"echo": ECHO}) as recorder,
            raw_client(recorder.server("echo")) as client,
        ):
            await client.call_tool("echo", {"text": "first"})
            other = sqlite3.connect(tmp_path / "locked.db", isolation_level=None)
            other.execute("BEGIN IMMEDIATE")
            answer = await raw_request(
                client, "tools/call", {"name": "echo", "arguments": {"text": "blocked"}}
            )
            other.execute("ROLLBACK")
            other.close()
            assert "locked" in answer["error"]["message"] and "locked.db" in answer["error"]["message"]
    assert [r.arguments["text"] for r in store.recordings("echo")] == ["first"]
    store.close()


HANG_SERVER = ECHO_SERVER.parent / "hang_server.py"


async def test_a_hung_upstream_answers_the_client_with_an_error_naming_it_and_the_timeout(
    tmp_path: Path,
) -> None:
    db = tmp_path / "hang.db"
    with anyio.fail_after(60):
        async with raw_client(proxy_stdio(db, "hang", [PYTHON, HANG_SERVER], "--timeout", "1.5")) as client:
            with pytest.raises(MCPError) as caught:
                await client.call_tool("hang", {})
            assert caught.value.error.code == types.REQUEST_TIMEOUT
            message = caught.value.error.message
            assert "hang_server.py" in message and "1.5s" in message and "--timeout" in message
            # The connection is still good: the next call is answered and recorded.
            assert (await client.call_tool("quick", {})).content[0].text == "quick answer"
    with Store(db, readonly=True) as store:  # a timeout is not the server's answer: not recorded
        assert [r.name for r in store.recordings("hang")] == ["quick"]


async def test_a_modern_era_client_of_a_hung_upstream_gets_the_timeout_error_too(tmp_path: Path) -> None:
    spec = UpstreamSpec(command=PYTHON, args=(str(HANG_SERVER),), timeout=1.5)
    with anyio.fail_after(60):
        async with (
            recording(tmp_path / "modern.db", {"hang": spec}) as recorder,
            Client(recorder.server("hang"), cache=None) as client,  # 2026-07-28: calls run as rounds
        ):
            with pytest.raises(MCPError) as caught:
                await client.call_tool("hang", {})
            assert caught.value.error.code == types.REQUEST_TIMEOUT and "1.5s" in caught.value.error.message
            assert (await client.call_tool("quick", {})).content[0].text == "quick answer"


async def test_an_upstream_call_reporting_progress_outlives_the_timeout(tmp_path: Path) -> None:
    spec = UpstreamSpec(command=PYTHON, args=(str(HANG_SERVER),), timeout=3)
    with anyio.fail_after(60):
        async with (
            recording(tmp_path / "slow.db", {"hang": spec}) as recorder,
            raw_client(recorder.server("hang")) as client,
        ):
            # 15 progress notifications 0.3 s apart: 4.5 s in all, never 3 s without a sign of life.
            result = await client.call_tool("slow", {"steps": 15, "interval": 0.3})
    assert result.content[0].text == "done after 15 steps"


async def test_a_stdio_clients_call_reporting_progress_outlives_the_timeout_too(tmp_path: Path) -> None:
    db = tmp_path / "slow.db"
    with anyio.fail_after(60):
        async with raw_client(proxy_stdio(db, "hang", [PYTHON, HANG_SERVER], "--timeout", "1.5")) as client:
            # A plain call, passed through: 8 progress notifications 0.3 s apart, 2.4 s in all.
            result = await client.call_tool("slow", {"steps": 8, "interval": 0.3})
            assert result.content[0].text == "done after 8 steps"
    with Store(db, readonly=True) as store:
        (recorded,) = store.recordings("hang")
    assert [n["method"] for n in recorded.notifications] == ["notifications/progress"] * 8


def test_upstream_requests_time_out_after_a_minute_unless_configured(tmp_path: Path) -> None:
    assert UpstreamSpec(command="server").timeout == DEFAULT_TIMEOUT == 60
    config = tmp_path / "record.toml"
    config.write_text(
        '[servers.a]\ncommand = "a"\n[servers.b]\ncommand = "b"\ntimeout = 5\n'
        '[servers.c]\nurl = "http://127.0.0.1:1/mcp"\ntimeout = 0\n'
    )
    servers = load_config(config).servers
    assert (servers["a"].timeout, servers["b"].timeout, servers["c"].timeout) == (60, 5, None)


# -- the stdio pass-through -------------------------------------------------------------------

_RECORD_STDIO = """
import sys
from replay_sim.cli import main
from replay_sim.record import passthrough
relayed = []
answer = passthrough.PassThrough.answer
def counted(self, line):
    answered = answer(self, line)
    if answered is True:  # written to the stdio server at once, answered as its output is read
        relayed.append(line)
    elif answered is not None:  # through the session's forwarding: not expected of a stdio server
        answered.close()
        raise AssertionError(line)
    return answered
passthrough.PassThrough.answer = counted
if sys.argv[1] == "sdk":
    passthrough.PassThrough.answer = lambda self, line: None
sys.argv = ["replay-sim", "record", "--db", sys.argv[2], "--name", "echo", "--", sys.executable, sys.argv[3]]
try:
    main()
finally:
    sys.stderr.write(f"relayed {len(relayed)}\\n")
"""


def _record_over_stdio(db: Path, messages: list[dict[str, object]], mode: str) -> tuple[list[bytes], int]:
    """Drive ``replay-sim record -- echo_server`` by raw stdio lines: what it wrote, and the calls relayed."""
    import json
    import subprocess

    process = subprocess.Popen(
        [PYTHON, "-c", _RECORD_STDIO, mode, str(db), str(ECHO_SERVER)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
    )
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    written: list[bytes] = []
    for message in messages:
        process.stdin.write(json.dumps(message).encode() + b"\n")
        if "id" not in message:
            continue
        while True:  # notifications may come first; then the answer
            line = process.stdout.readline()
            written.append(line)
            if json.loads(line).get("id") == message["id"]:
                break
    process.stdin.close()
    process.wait(timeout=60)
    relayed = int(process.stderr.read().decode().split("relayed ")[-1].split()[0])
    return written, relayed


def test_plain_calls_pass_through_stdio_with_the_sdk_paths_bytes_and_rows(tmp_path: Path) -> None:
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    calls = [
        ("tools/call", {"name": "echo", "arguments": {"text": "héllo \u2028 ✓"}}),
        ("tools/call", {"name": "add", "arguments": {"a": 1.5, "b": 2}}),  # structuredContent
        ("tools/call", {"name": "progress", "arguments": {"steps": 2}}),  # log notifications relayed
        ("tools/call", {"name": "nope", "arguments": {}}),  # the server's error
        ("tools/call", {"name": "echo", "arguments": {"text": "long ✓ " * 60_000}}),  # > a pipe's buffer
        ("resources/read", {"uri": "echo://greeting"}),
        ("prompts/get", {"name": "paint", "arguments": {"colour": "blue"}}),
        (
            "completion/complete",
            {"ref": {"type": "ref/prompt", "name": "paint"}, "argument": {"name": "colour", "value": "b"}},
        ),
        (
            "tools/call",
            {"name": "echo", "arguments": {"text": "x"}, "_meta": {"progressToken": 5}},
        ),  # the SDK's
    ]
    messages: list[dict[str, object]] = [
        {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": "list", "method": "tools/list"},  # the session starts here
        *({"jsonrpc": "2.0", "id": i, "method": m, "params": p} for i, (m, p) in enumerate(calls, start=1)),
        {
            "jsonrpc": "2.0",
            "id": 2**70,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": "big id"}},
        },
    ]
    fast, relayed = _record_over_stdio(tmp_path / "fast.db", messages, "fast")
    sdk, none = _record_over_stdio(tmp_path / "sdk.db", messages, "sdk")
    assert (relayed, none) == (len(calls), 0)  # every plain call passed through, and only those
    assert fast == sdk
    assert fast[-1].startswith(b'{"jsonrpc":"2.0","id":1180591620717411303424,"result":')

    def rows(db: Path) -> list[tuple[object, ...]]:
        with sqlite3.connect(db) as conn:
            columns = "method, name, arguments, params, key, result, error, seq, origin, notifications"
            return conn.execute(f"SELECT {columns} FROM calls ORDER BY id").fetchall()

    assert rows(tmp_path / "fast.db") == rows(tmp_path / "sdk.db")


def test_pipelined_calls_are_each_answered_once_and_recorded_in_order(tmp_path: Path) -> None:
    import json
    import subprocess

    db = tmp_path / "pipelined.db"
    process = subprocess.Popen(
        [REPLAY_SIM, "record", "--db", str(db), "--name", "echo", "--", PYTHON, str(ECHO_SERVER)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        bufsize=0,
    )
    assert process.stdin is not None and process.stdout is not None
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    opening = [
        {"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": init},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": "list", "method": "tools/list"},
    ]
    calls = [
        {
            "jsonrpc": "2.0",
            "id": i,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": f"n{i}"}},
        }
        for i in range(40)
    ]
    # Everything in one write: the calls reach the recorder while the handshake is still under way.
    process.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in [*opening, *calls]))
    answers = {}
    while len(answers) < len(calls) + 2:
        message = json.loads(process.stdout.readline())
        assert message["id"] not in answers  # each answered once
        answers[message["id"]] = message
    process.stdin.close()
    assert process.wait(timeout=60) == 0
    for i in range(40):
        assert answers[i]["result"]["content"] == [{"type": "text", "text": f"n{i}"}]
    with Store(db, readonly=True) as store:
        recorded = store.recordings("echo")
    assert sorted(r.arguments["text"] for r in recorded) == sorted(f"n{i}" for i in range(40))
    assert [r.seq for r in recorded] == list(range(1, 41))


# -- group commits ----------------------------------------------------------------------------


def _call(i: int, **extra: object) -> dict[str, object]:
    params = {"name": "echo", "arguments": {"text": f"call {i}", **extra}}
    return {"server": "echo", "method": "tools/call", "params": params, "result": {"content": []}}


async def test_calls_answered_at_once_share_one_commit_and_each_returns_once_committed(
    tmp_path: Path,
) -> None:
    from replay_sim.record.commits import GroupCommit

    with Store(tmp_path / "group.db") as store:
        commits = GroupCommit(store, busy=lambda: True)  # other calls in flight: wait one instant for them
        ids: dict[int, int] = {}

        async def record(i: int) -> None:
            ids[i] = await commits.record(_call(i))
            # Returned only once committed: another connection sees the row.
            with sqlite3.connect(tmp_path / "group.db") as other:
                assert other.execute("SELECT COUNT(*) FROM calls WHERE id=?", (ids[i],)).fetchone() == (1,)

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(record, i)
        assert commits.transactions == 1
        assert sorted(ids.values()) == [r.id for r in store.recordings("echo")]

        alone = GroupCommit(store, busy=lambda: False)  # nothing else in flight: committed at once
        for i in range(3):
            await alone.record(_call(10 + i))
        assert alone.transactions == 3


async def test_a_call_that_cannot_be_recorded_fails_alone_in_its_group(tmp_path: Path) -> None:
    from replay_sim.errors import StoreError
    from replay_sim.record.commits import GroupCommit

    with Store(tmp_path / "group.db") as store:
        commits = GroupCommit(store, busy=lambda: True)
        outcomes: dict[int, object] = {}

        async def record(i: int) -> None:
            try:
                outcomes[i] = await commits.record(_call(i, bad={1, 2}) if i == 1 else _call(i))
            except StoreError as exc:
                outcomes[i] = exc

        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(record, i)
        assert isinstance(outcomes[1], StoreError)
        assert {r.arguments["text"] for r in store.recordings("echo")} == {"call 0", "call 2"}


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("tools/call", {"name": "echo", "arguments": {"text": "héllo \u2028 ✓", "n": 1.0, "b": [2.5, None]}}),
        ("tools/call", {"name": "Cafe\u0301", "arguments": {"z": 1, "a": {"y": True, "x": "e\u0301"}}}),
        ("tools/call", {"name": "echo", "_meta": {"k": 1}}),
        ("resources/read", {"uri": "file:///a b"}),
        ("prompts/get", {"name": "paint", "arguments": {"colour": "blue"}}),
        (
            "completion/complete",
            {"ref": {"type": "ref/prompt", "name": "p"}, "argument": {"name": "c", "value": "b"}},
        ),
    ],
)
def test_a_call_prepared_before_its_answer_has_the_columns_record_call_computes(
    tmp_path: Path, method: str, params: dict[str, object]
) -> None:
    from replay_sim.canonical import call_identity, call_key, canonical_json

    with Store(tmp_path / "prepared.db") as store:
        prepared = store.prepare_call("échos", method, params)
        name, arguments = call_identity(method, params)
        assert (prepared.name, prepared.arguments, prepared.key) == (
            name,
            canonical_json(arguments),
            call_key("échos", method, name, arguments),
        )
        first = store.record_call("échos", method, params, result={"content": []}, prepared=prepared)
        second = store.record_call("échos", method, params, result={"content": []})
        one, other = store.recording(first), store.recording(second)
        assert one is not None and other is not None
        assert (one.name, one.arguments, one.params, one.key) == (
            other.name,
            other.arguments,
            other.params,
            other.key,
        )
