"""A start table answers only for the store, content and code it was written from, row for row.

Each test runs the real CLI over real pipes: a tampered table, another store's table, a store row
rewritten in place (``sqlite3``, no replay-sim), and a store written while a start answers. None is
served from the table; each start that will not use it says why in one line on stderr.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from replay_helpers import text_result
from start_helpers import LineClient, call, demo_with_table

from replay_sim.replay.stdio.start import START_TABLE, request_key
from replay_sim.replay.stdio.start.write import write_start_table
from replay_sim.resolve.embedding import SentenceTransformerEmbedder


@pytest.fixture
def demo(tmp_path: Path, embedder: SentenceTransformerEmbedder) -> tuple[Path, Path]:
    return demo_with_table(tmp_path / "a", embedder)


def _rewrite_echo(db: Path, text: str) -> None:
    """Rewrite the recorded answer of ``echo hello`` in place, as any sqlite3 user can."""
    with sqlite3.connect(db) as conn:
        changed = conn.execute(
            "UPDATE calls SET result=? WHERE name='echo' AND arguments LIKE '%hello%'",
            (json.dumps(text_result(text)),),
        ).rowcount
    assert changed == 1


def _echo_once(db: Path, index_dir: Path) -> tuple[str, list[str]]:
    """A start asked ``echo hello``: the answer's text, and its stderr lines about the start table."""
    client = LineClient(db, index_dir)
    try:
        client.handshake()
        client.send(call(2, "echo", message="hello"))
        (answer,) = client.until(2)
        assert client.close() == 0
        said = [line for line in client.stderr.splitlines() if START_TABLE in line]
        return answer["result"]["content"][0]["text"], said
    finally:
        client.stop()


def test_an_answer_edited_in_the_table_is_not_served_and_the_start_says_why(demo: tuple[Path, Path]) -> None:
    db, index_dir = demo
    found = request_key("demo", call(0, "echo", message="hello"))
    assert found is not None
    with sqlite3.connect(index_dir / START_TABLE) as conn:
        conn.execute(
            "UPDATE answers SET result=CAST(? AS BLOB) WHERE key=?",
            ('{"content":[{"type":"text","text":"forged"}]}', found[1]),
        )
    text, said = _echo_once(db, index_dir)
    assert text == "hello"
    assert len(said) == 1 and "was changed since it was written" in said[0], said


def test_another_stores_table_is_not_served_and_the_start_says_why(
    demo: tuple[Path, Path], tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    db, index_dir = demo
    other_db, other_index = demo_with_table(tmp_path / "b", embedder)  # one scripted session, recorded twice
    _rewrite_echo(other_db, "from b")
    assert write_start_table(other_db, other_index) == 4
    shutil.copy(other_index / START_TABLE, index_dir / START_TABLE)
    text, said = _echo_once(db, index_dir)
    assert text == "hello"
    assert len(said) == 1 and "written from another store" in said[0], said


def test_a_store_row_rewritten_in_place_makes_the_table_stale_until_index_build_rewrites_it(
    demo: tuple[Path, Path],
) -> None:
    db, index_dir = demo
    _rewrite_echo(db, "rewritten")
    text, said = _echo_once(db, index_dir)
    assert text == "rewritten"
    assert len(said) == 1 and "the store was written since" in said[0], said
    written = (index_dir / START_TABLE).stat().st_mtime_ns
    assert write_start_table(db, index_dir) == 4
    assert (index_dir / START_TABLE).stat().st_mtime_ns != written  # rewritten, not "kept as it is"
    text, said = _echo_once(db, index_dir)
    assert text == "rewritten" and said == []


def test_a_store_written_while_the_start_answers_hands_over_at_the_next_request(
    demo: tuple[Path, Path],
) -> None:
    db, index_dir = demo
    client = LineClient(db, index_dir)
    try:
        client.handshake()
        client.send(call(2, "echo", message="hello"))
        (before,) = client.until(2)
        _rewrite_echo(db, "changed meanwhile")
        client.send(call(3, "echo", message="hello"))
        after = client.until(3)[-1]
        assert client.close() == 0
    finally:
        client.stop()
    assert before["result"]["content"][0]["text"] == "hello"
    assert after["result"]["content"][0]["text"] == "changed meanwhile", client.stderr[-2000:]


def test_a_table_is_used_again_once_written_for_the_store_as_it_is(demo: tuple[Path, Path]) -> None:
    db, index_dir = demo
    text, said = _echo_once(db, index_dir)
    assert text == "hello" and said == []
