"""What a request line is to a stdio shortcut: its id cut out of it, and when the cut is the whole story."""

from __future__ import annotations

import pytest

from replay_sim.stdio_transport import Repeated, TooLong, read_line, request_of

TAIL = b',"method":"tools/call","params":{"name":"echo"}}'


@pytest.mark.parametrize(
    ("head", "token", "tail", "id_", "holds"),
    [
        (b'{"jsonrpc":"2.0","id":', b"7", TAIL, 7, True),
        (b'{"jsonrpc": "2.0", "id": ', b"-12", TAIL, -12, True),
        (b'{"id":', b"-0", TAIL, 0, True),
        (b'{"jsonrpc":"2.0","id":', b'"a\\"b\\u00e9"', TAIL, 'a"b\u00e9', True),
        (b' { "id" : ', b'"x"', b" " + TAIL, "x", True),
        (b'{"jsonrpc":"2.0","id":', b"1", b".5" + TAIL, 1, False),  # not an integer: never a template
        (b'{"jsonrpc":"2.0","id":', b"1", b"e3" + TAIL, 1, False),
        (b'{"jsonrpc":"2.0","id":', b"3", TAIL[:-1] + b',"id":4}', 3, False),  # a later id wins
        (b'{"jsonrpc":"2.0","id":', b"007", TAIL, None, False),  # not JSON
        (b'{"jsonrpc":"2.0","id":', b"1234567890123456789", TAIL, None, False),  # past what is kept
        (b'{"jsonrpc":"2.0","id":', b"true", TAIL, None, False),
        (b'{"method":"tools/call","id":', b"1", b"}", None, False),  # the id does not lead
    ],
)
def test_a_request_line_splits_into_its_id_and_a_template_that_holds_only_where_its_id_is_the_only_one(
    head: bytes, token: bytes, tail: bytes, id_: int | str | None, holds: bool
) -> None:
    line = head + token + tail
    repeated = Repeated.split(line)
    if id_ is None:
        assert repeated is None
        return
    assert repeated is not None and repeated.id == id_
    request = request_of(line)
    assert (request is not None and repeated.holds(request)) is holds
    other = Repeated.split(head + b'"other"' + tail)  # the same request with another id
    assert other is not None and other.id == "other" and other.template == repeated.template


def test_a_dropped_line_whose_leading_id_is_not_json_is_answered_with_a_null_id() -> None:
    error, for_server = read_line(
        TooLong(1 << 30, b'{"jsonrpc":"2.0","id":007,"method":"tools/call"'), 1 << 20
    )
    assert not for_server and error.message.id is None


@pytest.mark.parametrize("token", [b"1e3", b"1.0", b"1.5", b"true", b"false", b"null", b"{}", b"[1]"])
def test_a_request_whose_id_is_not_a_string_or_an_integer_gets_an_invalid_request_error(token: bytes) -> None:
    line = b'{"jsonrpc":"2.0","id":' + token + b',"method":"ping"}'
    error, for_server = read_line(line, 1 << 20)
    assert not for_server
    assert error.message.id is None and error.message.error.code == -32600  # type: ignore[union-attr]
    assert "id" in error.message.error.message  # type: ignore[union-attr]


def test_a_notification_and_a_request_with_a_proper_id_are_the_servers() -> None:
    for line in (
        b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
        b'{"jsonrpc":"2.0","id":"a","method":"ping"}',
    ):
        _, for_server = read_line(line, 1 << 20)
        assert for_server


@pytest.mark.parametrize("token", [b"1e3", b"1.0", b"true", b"null", b"{}"])
def test_a_shortcut_is_never_offered_a_request_whose_id_is_not_a_string_or_an_integer(token: bytes) -> None:
    assert request_of(b'{"jsonrpc":"2.0","id":' + token + b',"method":"tools/call","params":{}}') is None
