"""No line stops a ``serve --stdio`` start: what it cannot key goes to the replay, which answers it.

Every test runs the real CLI over real pipes. A hostile line must reach the start itself — the first
line after the handshake it answered — so each runs in a process of its own (all at once); the
answers are the replay's as it answers without a start table. The property tests feed many
arbitrary lines through one long-running process, with and without a start table: each request is
answered (a result or a JSON-RPC error) and the process stays up.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from start_helpers import INITIALIZE, INITIALIZED, LineClient, demo_with_table

from replay_sim.replay.stdio.start import START_TABLE
from replay_sim.resolve.embedding import SentenceTransformerEmbedder

_ECHO = b'{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"message":%s}}}'
_DEEP = b"[" * 990 + b"]" * 990

_BAD_VERSION = json.dumps(INITIALIZE).replace("2025-06-18", "\\ud800").encode()

HOSTILE: list[bytes] = [
    _ECHO % (10, b"NaN"),
    _ECHO % (11, b"Infinity"),
    _ECHO % (13, b"1e999"),
    _ECHO.replace(b"echo", b"nope") % (12, b"-Infinity"),  # an unknown tool: the refusal must key it
    _ECHO % (14, b'"\\ud800"'),
    _ECHO % (15, b"1" * 5000),  # past the digits Python reads as an int
    _ECHO % (16, _DEEP),
    b'{"jsonrpc":"2.0","id":17,"method":"resources/read","params":{"uri":"\\ud800"}}',
    _BAD_VERSION,  # in place of the handshake's initialize
]
"""Lines that once ended a start with a traceback."""

_BAD_IDS = [b"1e3", b"true", b"null", b"{}", b"[]", b"1.5", b"false"]
_PING = {"jsonrpc": "2.0", "id": 99, "method": "ping"}


@pytest.fixture(scope="module")
def demo(
    tmp_path_factory: pytest.TempPathFactory, embedder: SentenceTransformerEmbedder
) -> tuple[Path, Path]:
    return demo_with_table(tmp_path_factory.mktemp("start-input"), embedder)


@pytest.fixture(scope="module")
def bare_index(demo: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's index folder without its start table."""
    bare = tmp_path_factory.mktemp("bare") / "index"
    shutil.copytree(demo[1], bare)
    (bare / START_TABLE).unlink()
    return bare


def _answered(client: LineClient, count: int) -> list[dict[str, Any]]:
    """The answers up to the sentinel ping's, and ``count`` before it (the replay answers in any order)."""
    answers = client.until(99)
    while len(answers) < count + 1:
        answers.append(client.receive())
    return answers


def _opening(line: bytes) -> list[dict[str, Any] | bytes]:
    return [line, INITIALIZED] if line is _BAD_VERSION else [INITIALIZE, INITIALIZED, line]


def test_a_line_the_start_cannot_key_is_answered_as_without_a_table_and_the_process_lives_on(
    demo: tuple[Path, Path], bare_index: Path
) -> None:
    db, index_dir = demo
    starts = [LineClient(db, index_dir) for _ in HOSTILE]  # each line the first the start must key
    bare = LineClient(db, bare_index)
    try:
        for client, line in zip(starts, HOSTILE, strict=True):
            client.send(*_opening(line), _PING)
        expected = []
        for line in HOSTILE:
            bare.send(*_opening(line), _PING)
            expected.append(sorted(_answered(bare, 1 + (line is not _BAD_VERSION)), key=json.dumps))
        for client, line, wanted in zip(starts, HOSTILE, expected, strict=True):
            answers = _answered(client, 1 + (line is not _BAD_VERSION))
            assert sorted(answers, key=json.dumps) == wanted, (line[:100], client.stderr[-2000:])
            assert client.process.poll() is None and "Traceback" not in client.stderr, client.stderr[-3000:]
        assert bare.process.poll() is None and "Traceback" not in bare.stderr, bare.stderr[-3000:]
    finally:
        for client in [*starts, bare]:
            client.stop()


def test_a_request_whose_id_is_not_a_string_or_an_integer_gets_invalid_request_from_start_and_replay(
    demo: tuple[Path, Path],
) -> None:
    db, index_dir = demo
    client = LineClient(db, index_dir)
    try:
        client.handshake()
        for token in _BAD_IDS:  # the first reaches the start, the others the replay it handed over to
            client.send(b'{"jsonrpc":"2.0","id":' + token + b',"method":"tools/list"}', _PING)
            error, ping = _answered(client, 1)
            assert error["id"] is None and error["error"]["code"] == -32600, (token, error)
            assert ping["id"] == 99
        assert client.close() == 0
    finally:
        client.stop()


# -- property tests: arbitrary lines through one process --------------------------------------------

_IDS = st.one_of(
    st.integers(min_value=-(2**53), max_value=2**53),
    st.text(max_size=20),
    st.sampled_from([1e3, 1.5, True, False, None, {}, [], {"a": 1}, -0.0]),
)
_NUMBERS = st.one_of(
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1E+400", "0.1e-999", "-0"]),
)
_STRINGS = st.one_of(
    st.text(max_size=30).map(json.dumps),
    st.sampled_from(['"\\ud800"', '"\\udfff x"', '"a\\u0000b"', '"\\ud83d\\ude00"']),
)
"""JSON string literals: arbitrary text, and escapes Python's decoder reads but UTF-8 cannot hold."""


@st.composite
def _requests(draw: st.DrawFn) -> tuple[bytes, Any]:
    """A request line with an arbitrary id, method and argument, and its id (absent: no id member)."""
    method = draw(st.sampled_from(["tools/call", "resources/read", "prompts/get", "ping", "tools/list"]))
    raw = draw(
        st.one_of(
            _NUMBERS.map(lambda v: v if isinstance(v, str) else json.dumps(v)),
            _STRINGS,
        )
    )
    name = draw(st.sampled_from(["echo", "counter", "nope", "\\ud800"]))
    if method == "resources/read":
        params = f'{{"uri":{raw}}}'
    else:
        params = f'{{"name":"{name}","arguments":{{"message":{raw}}}}}'
    id_ = draw(_IDS)
    line = f'{{"jsonrpc":"2.0","id":{json.dumps(id_)},"method":"{method}","params":{params}}}'
    return line.encode(), id_


_LINES = st.one_of(
    _requests(),
    st.binary(max_size=200).map(lambda b: b.replace(b"\n", b" ")),
    st.text(max_size=200).map(lambda t: t.replace("\n", " ").encode("utf-8", "surrogatepass")),
)


@pytest.fixture(scope="module", params=["table", "no table"])
def served(request: pytest.FixtureRequest, demo: tuple[Path, Path], bare_index: Path) -> Iterator[LineClient]:
    """One handshaken process for the whole module, with or without a start table."""
    db, index_dir = demo
    client = LineClient(db, index_dir if request.param == "table" else bare_index)
    client.handshake()
    yield client
    assert client.close() == 0
    assert "Traceback" not in client.stderr, client.stderr[-3000:]


_SENTINEL = iter(range(10**6, 10**7))


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(line=_LINES)
def test_every_line_gets_an_answer_or_none_by_rule_and_the_process_stays_up(
    served: LineClient, line: tuple[bytes, Any] | bytes
) -> None:
    raw, id_ = line if isinstance(line, tuple) else (line, "absent")
    sentinel = next(_SENTINEL)
    served.send(raw.strip() or b"{}", {"jsonrpc": "2.0", "id": sentinel, "method": "ping"})
    answers = served.until(sentinel)
    for answer in answers:
        assert answer.get("jsonrpc") == "2.0" and ("result" in answer) != ("error" in answer), answer
    if isinstance(line, tuple):  # a request: exactly one answer, with its id or (a bad id) null
        if len(answers) == 1:  # the replay may answer the ping first
            answers.append(served.receive())
        (answer,) = [a for a in answers if a.get("id") != sentinel]
        if type(id_) is int or isinstance(id_, str):
            assert answer["id"] == id_, (raw, answer)
        else:
            assert answer["id"] is None and answer["error"]["code"] == -32600, (raw, answer)
    assert served.process.poll() is None, served.stderr[-3000:]
