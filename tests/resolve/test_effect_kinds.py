"""Effects per kind of call: a SQL tool's SELECT calls are not its writes (issue #19, item 3d)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from recording_helpers import PYTHON, REPLAY_SIM, ROOT, proxy_stdio, run_script, step

from replay_sim.effects import Call, Effect, Verdict, kind_of, learn
from replay_sim.resolve.resolution import Tier
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Store

NOTES = [PYTHON, ROOT / "fixtures" / "notes_server.py"]


@pytest.mark.parametrize(
    ("arguments", "kind"),
    [
        ({"sql": "SELECT name, n FROM notes ORDER BY n"}, "select"),
        (
            {"query": "select count(*) from notes where name = 'a;b';"},
            "select",
        ),  # ; in a literal, one at the end
        ({"query": "SELECT replace(name, 'a', 'b') FROM notes"}, "select"),  # the function, not REPLACE INTO
        ({"sql": "INSERT INTO notes VALUES ('y', 2)"}, "insert"),
        ({"statement": "update notes set n = 2 where name = 'x'"}, "update"),
        ({"sql": "DELETE FROM notes"}, "delete"),
        # Not trusted: several statements, a CTE (it may write), PRAGMA (reads or sets), EXPLAIN
        # (ANALYZE runs it), SELECT INTO (makes a table), functions that act, transactions.
        ({"sql": "SELECT * FROM notes; DELETE FROM notes"}, None),
        ({"sql": "WITH d AS (DELETE FROM notes RETURNING *) SELECT * FROM d"}, None),
        ({"sql": "WITH t AS (SELECT 1 AS a) SELECT a FROM t"}, None),
        ({"sql": "PRAGMA table_info(notes)"}, None),
        ({"sql": "PRAGMA user_version = 3"}, None),
        ({"sql": "EXPLAIN ANALYZE SELECT * FROM notes"}, None),
        ({"sql": "SELECT * INTO copy FROM notes"}, None),
        ({"sql": "SELECT nextval('ids') FROM notes"}, None),
        ({"sql": "SELECT load_extension('x') FROM notes"}, None),
        ({"sql": "BEGIN; INSERT INTO notes VALUES (1, 2); COMMIT"}, None),
        # Two statements in two arguments, prose, and arguments not named for a statement.
        ({"sql": "SELECT * FROM a", "query": "DELETE FROM b"}, None),
        ({"thought": "Update the plan as needed, then select the best from them"}, None),
        ({"query": "select the best hotels in paris"}, None),
        ({"x": 2}, None),
    ],
)
def test_a_calls_kind_is_its_one_sql_statements_leading_keyword_when_that_can_be_trusted(
    arguments: dict[str, Any], kind: str | None
) -> None:
    assert kind_of(arguments) == kind


_ids = iter(range(1, 10**6))


def q(sql: str, answer: str) -> Call:
    return Call(
        next(_ids), "tools/call", "q", sql, answer, False, False, frozenset({"t"}), kind_of({"sql": sql})
    )


def test_a_tool_whose_calls_differ_in_kind_gets_a_verdict_per_kind_from_that_kinds_evidence() -> None:
    s1, s2 = "SELECT a FROM t", "SELECT count(*) FROM t"
    run = [q(s1, "A"), q(s2, "1"), q(s1, "A"), q(s2, "1"), q("INSERT INTO t VALUES (2)", "ok"), q(s1, "A B")]
    verdict = learn([run], {})["q"]
    assert verdict.effect is Effect.CHANGES  # the tool as a whole changes state
    kinds = dict(verdict.kinds)
    assert kinds["select"].effect is Effect.NONE and kinds["select"].shown == 2
    assert kinds["insert"].effect is Effect.CHANGES
    assert verdict.of_kind("select").effect is Effect.NONE
    assert Verdict.from_dict(verdict.as_dict()) == verdict  # a store keeps per-kind verdicts whole
    assert verdict.of_kind("delete") is verdict and verdict.of_kind(None) is verdict  # unrecorded: the tool's
    # One SELECT seen to change nothing says little about the others: the kind stays unknown.
    once = [q(s1, "A"), q(s1, "A"), q("INSERT INTO t VALUES (2)", "ok"), q(s1, "A B")]
    thin = learn([once, [q("SELECT b FROM t", "B")]], {})
    assert dict(thin["q"].kinds)["select"].effect is Effect.UNKNOWN
    # A tool effect-free as a whole is not split: kinds only narrow what counts as a change.
    assert learn([[q(s1, "A"), q(s2, "1"), q(s1, "A"), q(s2, "1")]], {})["q"].kinds == ()


def _replay(resolver: Resolver, statements: list[str]) -> list[tuple[Tier, str | None]]:
    """Resolve ``query`` calls as one episode: each step's tier and the answer's text."""
    trail = resolver.lookup.trail([])
    out = []
    for sql in statements:
        found = resolver.resolve("notes", "tools/call", {"name": "query", "arguments": {"sql": sql}}, trail)
        resolver.advance(trail, found)
        answer = None if found.recording is None else found.recording.result["content"][0]["text"]  # type: ignore[index]
        out.append((found.tier, answer))
    return out


S1 = "SELECT name, n FROM notes ORDER BY n"
S2 = "SELECT count(*) FROM notes"
INSERT = "INSERT INTO notes VALUES ('y', 2)"


@pytest.mark.anyio
async def test_an_unrecorded_select_of_a_read_write_sql_tool_does_not_make_the_episode_diverge(
    tmp_path: Path,
) -> None:
    # The real notes server's `query` tool (no annotations) reads and writes: recorded SELECTs
    # before and after each other agree, and a SELECT after the INSERT differs.
    db = tmp_path / "r.db"
    script = [step("query", sql=s) for s in (S1, S2, S1, S2, INSERT, S1, S2)]
    answers = await run_script(proxy_stdio(db, "notes", NOTES), script)
    assert json.loads(answers[5]["content"][0]["text"]) == [["x", 1], ["y", 2]]
    with Store(db) as store:
        resolver = Resolver(store, index_dir=None, semantic=False)
        verdict = resolver.lookup.effect("notes", "query")
        assert verdict.effect is Effect.CHANGES
        assert verdict.of_kind("select").effect is Effect.NONE
        assert verdict.of_kind("insert").effect is Effect.CHANGES
        unrecorded = "SELECT name FROM notes WHERE n = 1"
        # Before, the unrecorded SELECT counted as a state change no recording answered: the
        # INSERT and every later call of the episode missed.
        assert _replay(resolver, [S1, unrecorded, INSERT, S1]) == [
            (Tier.EXACT, '[["x", 1]]'),
            (Tier.MISS, None),
            (Tier.EXACT, '{"changed": 1}'),
            (Tier.EXACT, '[["x", 1], ["y", 2]]'),
        ]
        # An unrecorded write, or a statement whose kind cannot be trusted, still diverges.
        for unsafe in ("DELETE FROM notes", "SELECT 1; DELETE FROM notes", "PRAGMA user_version = 3"):
            assert _replay(resolver, [unsafe, S1]) == [(Tier.MISS, None), (Tier.MISS, None)]


@pytest.mark.anyio
async def test_stats_shows_each_kinds_effect_and_its_witnesses(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    await run_script(
        proxy_stdio(db, "notes", NOTES), [step("query", sql=s) for s in (S1, S2, S1, S2, INSERT, S1)]
    )
    table = subprocess.run(
        [REPLAY_SIM, "stats", "--db", str(db)], capture_output=True, text=True, check=True
    ).stdout
    assert "notes\tquery [select]\tnone: 2 reads unchanged (recording pairs " in table
    assert "notes\tquery [insert]\tchanges: query [select] before/after differed" in table
    rows = json.loads(
        subprocess.run(
            [REPLAY_SIM, "stats", "--db", str(db), "--json"], capture_output=True, text=True, check=True
        ).stdout
    )
    (row,) = [r for r in rows if r["name"] == "query"]
    kinds = row["effect"]["kinds"]
    assert kinds["select"]["effect"] == "none" and len(kinds["select"]["witnesses"]) == 2
    assert kinds["insert"]["effect"] == "changes" and kinds["insert"]["contrary"] is not None
