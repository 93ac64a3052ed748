"""The stdio fast path in process: a line repeated but for its id is answered as resolving it would.

:class:`~replay_sim.replay.stdio.fastpath.StdioFastPath` keeps, per request line, what its answer depended
on; these tests change each of those things between two sends of one line (the byte-identity with
the SDK path over real stdio is ``test_fastpath_http.py``'s).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp_types import JSONRPCResponse
from replay_helpers import PASS_THROUGH, build_store

from replay_sim.protocol import EPISODE_META_KEY, MATCH_META_KEY
from replay_sim.replay.core.connections import stdio_client
from replay_sim.replay.core.episodes import seed_of
from replay_sim.replay.core.replay import Replay
from replay_sim.replay.shaping.faults import Faults
from replay_sim.replay.stdio.fastpath import StdioFastPath
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Store

HELLO = {"name": "echo", "arguments": {"message": "hello"}}


def _line(id_: Any, params: dict[str, Any] = HELLO, method: str = "tools/call") -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params}).encode()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    build_store(tmp_path / "replay.db").close()
    return tmp_path / "replay.db"


@contextmanager
def _opened(db: Path, **options: Any) -> Iterator[tuple[StdioFastPath, list[int]]]:
    """A stdio fast path on an initialized handshake connection, and a count of the lines answered again."""
    store = Store(db)
    replay = Replay(store, resolver=Resolver(store, index_dir=None), **options)
    again, answered = replay.prepared.again, []

    def counted(*args: Any) -> Any:
        found = again(*args)
        answered.extend([1] if found is not None else [])
        return found

    replay.prepared.again = counted  # type: ignore[method-assign]
    with stdio_client() as client:
        fast = StdioFastPath(replay.prepared, "demo", replay.server("demo"), client)
        init = {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        }
        assert fast.answer(_line(0, init, "initialize")) is None
        fast.sent(JSONRPCResponse(jsonrpc="2.0", id=0, result={"protocolVersion": "2025-11-25"}))
        yield fast, answered
    store.close()


@pytest.fixture
def opened(db: Path) -> Iterator[tuple[StdioFastPath, list[int]]]:
    with _opened(db) as found:
        yield found


def _recording(answer: bytes | None) -> int:
    """The recording an answer says it came from."""
    assert answer is not None
    return int(json.loads(answer)["result"]["_meta"][MATCH_META_KEY]["recording"])


def test_a_repeated_line_is_answered_again_with_its_own_id(opened: tuple[StdioFastPath, list[int]]) -> None:
    fast, answered = opened
    first, second = fast.answer(_line(1)), fast.answer(_line("two"))
    assert first is not None and second is not None
    assert first.replace(b'"id":1,', b'"id":"two",', 1) == second
    assert len(answered) == 1


def test_a_recording_added_by_another_process_is_seen_by_the_next_repeat(
    db: Path, opened: tuple[StdioFastPath, list[int]]
) -> None:
    fast, answered = opened
    assert [_recording(fast.answer(_line(i))) for i in (1, 2)] == [1, 1]
    with Store(db) as writer:  # a recorder's session that made the call twice (the same answer):
        session = writer.start_session("demo", "s-9")  # its second call repeats this episode's history best
        for _ in range(2):
            second = writer.record_call("demo", "tools/call", HELLO, result=PASS_THROUGH, session=session)
    assert _recording(fast.answer(_line(3))) == second
    assert len(answered) == 1


def test_a_repeat_whose_turn_it_is_to_fail_is_left_to_the_sdk_path_to_fail(db: Path) -> None:
    # Faults are drawn per call (from its episode's seed and its index in the episode): the nth
    # repeat may fail where the first did not.
    with _opened(db, faults=Faults.parse(["demo/echo=0.5:error"])) as (fast, answered):
        injector = fast.prepared.replay.injector

        def first_fault(episode: str) -> int:
            draws = (
                injector.faults.draw(injector.basis, seed_of(episode), "demo", "echo", i) for i in range(64)
            )
            return next(i for i, kind in enumerate(draws) if kind is not None)

        episode = next(f"e-{n}" for n in range(1000) if first_fault(f"e-{n}") >= 2)
        params = {**HELLO, "_meta": {EPISODE_META_KEY: episode}}
        failing = first_fault(episode)
        answers = [fast.answer(_line(i, params)) for i in range(failing + 1)]
    assert all(answer is not None for answer in answers[:failing])
    assert answers[failing] is None  # the SDK path injects the fault
    assert len(answered) == failing - 1


def test_a_line_whose_id_is_overridden_later_in_it_is_answered_with_the_id_it_has(
    opened: tuple[StdioFastPath, list[int]],
) -> None:
    fast, answered = opened
    for leading in (1, 2):
        line = _line(leading)[:-1] + b', "id": 5}'
        answer = fast.answer(line)
        assert answer is not None and answer.startswith(b'{"jsonrpc":"2.0","id":5,')
    assert answered == []  # such a line is resolved each time
