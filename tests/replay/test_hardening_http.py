"""Hardening of the replay server's HTTP side (issue 13): Nagle, bounded misses, the admin API's Host
checks and token, bounded sessions, work and body reads, ids past SQLite's range."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from replay_helpers import ACCEPT, initialize, make_replay, payload, raw_session

from replay_sim import listener
from replay_sim.errors import ConfigError
from replay_sim.listener import listen, serving_in_thread
from replay_sim.replay.http.admission import MAX_PEEK_BYTES
from replay_sim.replay.http.app import create_app
from replay_sim.replay.observe.metrics import Metrics, MissRecord
from replay_sim.replay.options import Limits

BIN = Path(sys.executable).parent
INIT = initialize()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    replay = make_replay(tmp_path_factory.mktemp("hardening") / "replay.db")
    with serving_in_thread(create_app(replay)) as url:
        yield url, replay


def _address(url: str) -> tuple[str, int]:
    host, port = url.rsplit("/", 1)[-1].rsplit(":", 1)
    return host, int(port)


def _server_side(client: socket.socket) -> socket.socket:
    """This process's end of ``client``'s connection (the servers under test run in this process)."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            if sock.type == socket.SOCK_STREAM and sock.getpeername() == client.getsockname():
                return sock
        except OSError:
            pass
        sock.close()
    raise AssertionError("no server-side socket for the connection")


def _nodelay(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


# -- 1. Nagle --------------------------------------------------------------------------------------


def test_connections_the_replay_server_accepts_send_without_waiting_for_acks(served: tuple[str, Any]) -> None:
    with socket.create_connection(_address(served[0]), timeout=30) as client:
        client.sendall(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert client.recv(4096).startswith(b"HTTP/1.1 200")
        with _server_side(client) as accepted:
            assert _nodelay(accepted)


def test_connections_accepted_from_the_shared_listener_by_asyncio_are_tcp_nodelay() -> None:
    """The recorder's HTTP face and the replay server both serve from :func:`listen` through asyncio."""

    async def main() -> int:
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.set_result(_nodelay(writer.get_extra_info("socket")))
            writer.close()

        sock = listen("127.0.0.1", 0)
        server = await asyncio.start_server(on_connection, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
            try:
                return await asyncio.wait_for(accepted, 30)
            finally:
                writer.close()

    assert asyncio.run(main())


# -- 3. misses kept bounded ------------------------------------------------------------------------


def test_a_miss_keeps_a_few_kilobytes_of_its_arguments_and_says_how_big_they_were() -> None:
    metrics = Metrics()
    huge = "x" * 4_000_000
    candidate = {
        "recording": 1,
        "score": 0.5,
        "differences": [{"field": "q", "recorded": "a", "requested": huge}],
    }
    miss = MissRecord(
        0.0, "demo", "tools/call", "echo", {"q": huge, "list": list(range(10_000))}, "miss", "r"
    )
    metrics.record_miss(MissRecord(**{**miss.as_dict(), "candidates": [candidate]}))
    (kept,) = metrics.recent_misses()
    assert len(json.dumps(kept)) < 32_000
    assert kept["arguments"]["q"].endswith("[truncated: 4000000 characters]")
    assert kept["arguments"]["list"][-1].endswith("more items]")
    assert "4000000 characters" in kept["candidates"][0]["differences"][0]["requested"]


def test_the_misses_endpoint_answers_a_bounded_body_however_big_the_missed_calls(tmp_path: Path) -> None:
    replay = make_replay(tmp_path / "big.db")
    with serving_in_thread(create_app(replay)) as url:

        async def main() -> None:
            async with httpx2.AsyncClient(timeout=60) as http:
                headers = await raw_session(http, f"{url}/mcp/demo")
                for i in range(6):
                    big = {"message": f"{i}" + "y" * 1_000_000}
                    body = {
                        "jsonrpc": "2.0",
                        "id": i + 1,
                        "method": "tools/call",
                        "params": {"name": "echo", "arguments": big},
                    }
                    reply = payload(await http.post(f"{url}/mcp/demo", json=body, headers=headers))
                    assert reply["result"]["isError"] is True

        anyio.run(main)
        response = httpx2.get(f"{url}/api/misses?limit=1000", timeout=60)
        assert response.status_code == 200
        misses = response.json()
        assert len(misses) == 6 and len(response.content) < 200_000
        assert misses[0]["arguments"]["message"].endswith("[truncated: 1000001 characters]")


# -- 4. the admin API: Host checks, token ---------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/api/recordings"), ("GET", "/api/recordings/1"), ("DELETE", "/api/episodes/ep"), ("GET", "/")],
)
def test_the_admin_api_and_dashboard_refuse_a_rebound_host_name(
    served: tuple[str, Any], method: str, path: str
) -> None:
    response = httpx2.request(method, f"{served[0]}{path}", headers={"Host": "evil.example"}, timeout=30)
    assert response.status_code == 421
    assert "allowed-host" in response.text


def test_the_admin_api_refuses_requests_from_another_sites_page(served: tuple[str, Any]) -> None:
    response = httpx2.delete(
        f"{served[0]}/api/episodes/ep", headers={"Origin": "http://evil.example"}, timeout=30
    )
    assert response.status_code == 403
    own = httpx2.delete(f"{served[0]}/api/episodes/ep", headers={"Origin": served[0]}, timeout=30)
    assert own.status_code == 404  # answered: no live episode "ep"


def test_binding_every_interface_keeps_the_mcp_host_check_and_allowed_hosts_are_configurable(
    tmp_path: Path,
) -> None:
    replay = make_replay(tmp_path / "wide.db")
    app = create_app(replay, host="0.0.0.0", token="t0k", allowed_hosts=["replay.internal"])
    with serving_in_thread(app) as url:  # served on 127.0.0.1 all the same
        port = _address(url)[1]

        def post(host: str) -> int:
            return httpx2.post(
                f"{url}/mcp/demo", json=INIT, headers=ACCEPT | {"Host": host}, timeout=30
            ).status_code

        assert post("evil.example") == 421
        assert post(f"evil.example:{port}") == 421
        assert post(f"replay.internal:{port}") == 200
        assert post(f"10.1.2.3:{port}") == 200  # an IP address cannot be rebound
        assert post(f"{socket.gethostname()}:{port}") == 200


def test_a_star_allowed_host_turns_the_check_off() -> None:
    assert listener.HostCheck("127.0.0.1", ["*"]).host_ok("anything.example")
    assert not listener.HostCheck("127.0.0.1").host_ok("anything.example")
    assert listener.HostCheck("127.0.0.1").host_ok("localhost:8765") and listener.HostCheck().host_ok(
        "[::1]:8765"
    )


def test_with_a_token_the_admin_api_needs_it_and_health_and_mcp_do_not(tmp_path: Path) -> None:
    replay = make_replay(tmp_path / "token.db")
    with serving_in_thread(create_app(replay, token="s3cret")) as url:
        for path in ("/api/recordings", "/api/stats", "/api/misses", "/api/episodes", "/metrics"):
            refused = httpx2.get(f"{url}{path}", timeout=30)
            assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
            wrong = httpx2.get(f"{url}{path}", headers={"Authorization": "Bearer nope"}, timeout=30)
            assert wrong.status_code == 401
            assert (
                httpx2.get(f"{url}{path}", headers={"Authorization": "Bearer s3cret"}, timeout=30).status_code
                == 200
            )
        assert httpx2.delete(f"{url}/api/episodes/ep", timeout=30).status_code == 401
        assert httpx2.get(f"{url}/api/health", timeout=30).status_code == 200
        assert httpx2.get(f"{url}/", timeout=30).status_code == 200  # the page; it asks for the token
        assert httpx2.post(f"{url}/mcp/demo", json=INIT, headers=ACCEPT, timeout=30).status_code == 200


def test_an_app_bound_beyond_loopback_without_a_token_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="token"):
        create_app(make_replay(tmp_path / "open.db"), host="0.0.0.0")


@pytest.mark.parametrize(
    ("arguments", "env"),
    [
        (["--token", ""], {}),  # --token "$UNSET"
        (["--token", "  "], {}),
        (["--host", "0.0.0.0"], {"REPLAY_SIM_TOKEN": ""}),  # click takes an empty variable for unset
    ],
    ids=["empty", "whitespace", "empty env"],
)
def test_an_empty_admin_token_is_refused_at_start_in_one_line(
    tmp_path: Path, arguments: list[str], env: dict[str, str]
) -> None:
    make_replay(tmp_path / "cli.db").store.close()
    command = [str(BIN / "replay-sim"), "serve", "--db", str(tmp_path / "cli.db"), "--port", "0", *arguments]
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ | env, timeout=60)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "admin token is empty" in done.stderr
    with pytest.raises(ConfigError, match="admin token is empty"):
        create_app(make_replay(tmp_path / "lib.db"), token=" ")


def test_serve_says_where_it_listens_and_that_the_admin_api_needs_its_token(tmp_path: Path) -> None:
    make_replay(tmp_path / "cli.db").store.close()
    env = os.environ | {"REPLAY_SIM_TOKEN": "from-env"}
    process = subprocess.Popen(
        [str(BIN / "replay-sim"), "serve", "--db", str(tmp_path / "cli.db"), "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stderr is not None
        lines = []
        for line in process.stderr:
            lines.append(line)
            if line.startswith("accepted Host names"):
                break
        text = "".join(lines)
        assert "replaying demo at http://127.0.0.1:" in text
        assert "need a token: 'Authorization: Bearer <token>'" in text and "from-env" not in text
        url = text.split("replaying demo at ")[1].split("/mcp/")[0]
        assert httpx2.get(f"{url}/api/stats", timeout=30).status_code == 401
        assert (
            httpx2.get(
                f"{url}/api/stats", headers={"Authorization": "Bearer from-env"}, timeout=30
            ).status_code
            == 200
        )
    finally:
        process.terminate()
        process.wait(timeout=30)


# -- 6. bounded sessions, work, metrics and body reads ---------------------------------------------


def _metric(url: str, name: str) -> float:
    for line in httpx2.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in /metrics")


def _wait_for_metric(url: str, name: str, done: Callable[[float], bool]) -> None:
    async def until() -> None:
        with anyio.fail_after(60):
            while not done(_metric(url, name)):
                await anyio.sleep(0.05)

    anyio.run(until)


def test_calls_of_unrecorded_tool_names_share_one_metrics_series(tmp_path: Path) -> None:
    replay = make_replay(tmp_path / "names.db")
    with serving_in_thread(create_app(replay)) as url:

        async def main() -> None:
            async with httpx2.AsyncClient(timeout=60) as http:
                headers = await raw_session(http, f"{url}/mcp/demo")
                for i in range(40):
                    body = {
                        "jsonrpc": "2.0",
                        "id": i,
                        "method": "tools/call",
                        "params": {"name": f"nosuch-{i}", "arguments": {}},
                    }
                    await http.post(f"{url}/mcp/demo", json=body, headers=headers)
                body = {
                    "jsonrpc": "2.0",
                    "id": 99,
                    "method": "tools/call",
                    "params": {"name": "counter", "arguments": {}},
                }
                await http.post(f"{url}/mcp/demo", json=body, headers=headers)

        anyio.run(main)
        text = httpx2.get(f"{url}/metrics", timeout=30).text
    assert "nosuch-" not in text
    assert (
        'replay_sim_calls_total{server="demo",method="tools/call",tool="(unknown)",tier="refused"} 40' in text
    )
    assert 'tool="counter"' in text


def test_a_session_over_the_cap_is_refused_at_once_with_retry_after(tmp_path: Path) -> None:
    replay = make_replay(tmp_path / "cap.db")
    with serving_in_thread(create_app(replay, limits=Limits(max_sessions=1))) as url:
        first = httpx2.post(f"{url}/mcp/demo", json=INIT, headers=ACCEPT, timeout=30)
        assert first.status_code == 200
        second = httpx2.post(f"{url}/mcp/demo", json=INIT, headers=ACCEPT, timeout=30)
        assert second.status_code == 503 and second.headers["retry-after"] == "1"
        assert second.json()["error"]["message"]
        assert httpx2.post(f"{url}/mcp/other", json=INIT, headers=ACCEPT, timeout=30).status_code == 200


def test_an_idle_session_is_closed_after_the_configured_timeout(tmp_path: Path) -> None:
    replay = make_replay(tmp_path / "idle.db")
    with serving_in_thread(create_app(replay, limits=Limits(session_idle_timeout=0.3))) as url:
        opened = httpx2.post(f"{url}/mcp/demo", json=INIT, headers=ACCEPT, timeout=30)
        session = opened.headers["mcp-session-id"]
        _wait_for_metric(url, 'replay_sim_open_sessions{server="demo"}', lambda n: n == 0)
        ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        gone = httpx2.post(
            f"{url}/mcp/demo",
            json=ping,
            headers=ACCEPT | {"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"},
            timeout=30,
        )
        assert gone.status_code == 404


def _half_sent(url: str, path: str, headers: str = "", sent: int = 10) -> socket.socket:
    """A connection that sent a POST's headers and ``sent`` of its body bytes (more are announced)."""
    client = socket.create_connection(_address(url), timeout=60)
    client.sendall(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Accept: application/json, text/event-stream\r\n{headers}"
        f"Content-Length: {sent + 200}\r\n\r\n".encode()
        + (b'{"jsonrpc"' + b" " * sent)[:sent]
    )
    return client


def _in_flight(url: str, path: str) -> socket.socket:
    """A request counted in flight that never ends: past the bytes read before counting, then stalled."""
    return _half_sent(url, path, sent=MAX_PEEK_BYTES + 1)


def test_a_new_session_waits_its_turn_while_too_much_is_in_flight_and_opens_once_a_slot_frees(
    tmp_path: Path,
) -> None:
    replay = make_replay(tmp_path / "queue.db")
    limits = Limits(max_concurrent=1, admission_wait=120, body_timeout=None)
    with serving_in_thread(create_app(replay, limits=limits)) as url:
        with ThreadPoolExecutor(1) as pool:
            with _in_flight(url, "/mcp/demo"):
                _wait_for_metric(url, "replay_sim_requests_in_flight", lambda n: n >= 1)
                opening = pool.submit(httpx2.post, f"{url}/mcp/demo", json=INIT, headers=ACCEPT, timeout=120)
                _wait_for_metric(url, "replay_sim_sessions_waiting", lambda n: n >= 1)
                assert not opening.done()  # in line, not refused
                assert httpx2.get(f"{url}/api/health", timeout=30).status_code == 200
            # the half-sent request ends with its connection: its slot goes to the one in line
            answered = opening.result(timeout=120)
        assert answered.status_code == 200 and "mcp-session-id" in answered.headers
        assert _metric(url, "replay_sim_sessions_waiting") == 0


def test_a_new_session_is_refused_with_retry_after_once_it_waited_its_admission_wait(
    tmp_path: Path,
) -> None:
    replay = make_replay(tmp_path / "busy.db")
    limits = Limits(max_concurrent=1, admission_wait=0.2, body_timeout=None)
    with serving_in_thread(create_app(replay, limits=limits)) as url:
        with _in_flight(url, "/mcp/demo"):
            _wait_for_metric(url, "replay_sim_requests_in_flight", lambda n: n >= 1)
            refused = httpx2.post(f"{url}/mcp/demo", json=INIT, headers=ACCEPT, timeout=30)
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            message = refused.json()["error"]["message"]
            assert "overloaded" in message and "--admission-wait" in message
            assert _metric(url, "replay_sim_sessions_waiting") == 0
        # once nothing is in flight, sessions open again at once
        _wait_for_metric(url, "replay_sim_requests_in_flight", lambda n: n == 0)
        assert httpx2.post(f"{url}/mcp/demo", json=INIT, headers=ACCEPT, timeout=30).status_code == 200


def test_a_request_whose_body_never_arrives_gets_408_and_its_connection_closed(tmp_path: Path) -> None:
    replay = make_replay(tmp_path / "slow.db")
    with serving_in_thread(create_app(replay, limits=Limits(body_timeout=0.3))) as url:
        with _half_sent(url, "/mcp/demo") as client:
            received = b""
            while chunk := client.recv(65536):  # until the server closes (socket timeout: 60 s)
                received += chunk
        assert received.startswith(b"HTTP/1.1 408")
        assert httpx2.get(f"{url}/api/health", timeout=30).status_code == 200


# -- 9a. ids past SQLite's range -------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/api/recordings/99999999999999999999",
        "/api/recordings/9223372036854775808",
        "/api/recordings?after_id=99999999999999999999",
        "/api/misses?limit=99999999999999999999",
        "/api/recordings?limit=99999999999999999999",
    ],
)
def test_ids_past_sqlites_integer_range_are_refused_cleanly(served: tuple[str, Any], path: str) -> None:
    assert httpx2.get(f"{served[0]}{path}", timeout=30).status_code in (404, 422)


def test_the_largest_sqlite_id_is_simply_not_found(served: tuple[str, Any]) -> None:
    assert httpx2.get(f"{served[0]}/api/recordings/9223372036854775807", timeout=30).status_code == 404
