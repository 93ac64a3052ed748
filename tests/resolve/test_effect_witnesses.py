"""An effect-free verdict needs witnesses that could have seen the tool's effect (issue 27's cases).

A read unchanged across a call is no witness when the call changed nothing because of its
arguments (a find/replace of an absent pattern, a call answering ``0 replacements``), and one
call unchanged says little of the tool: "none" needs two different calls witnessed.
"""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path
from typing import Any

import pytest
from recording_helpers import REPLAY_SIM, step
from sandbox_helpers import record, write_config

from replay_sim.effects import Call, Effect, can_show, declare, did_nothing, learn, named, selected
from replay_sim.effects.model import Verdict
from replay_sim.resolve.resolution import Tier
from replay_sim.resolve.resolver import Resolver
from replay_sim.resolve.tooleffects import store_effects
from replay_sim.store import Store

RO = {"readOnlyHint": True}
_ids = itertools.count(1)
DOC = "# Intro\nhello world\n# Usage\nrun it"


def read(answer: str = DOC, path: str = "a.md") -> Call:
    """A read of one document (declared read-only: ``r``)."""
    return Call(next(_ids), "tools/call", "r", f"r({path})", answer, False, False, named({"path": path}))


def call(tool: str, answer: str, **arguments: Any) -> Call:
    """A call of ``tool`` (unknown effect) with these arguments and answer."""
    key = f"{tool}({sorted(arguments.items())})"
    things, picks = named(arguments), selected(arguments)
    return Call(next(_ids), "tools/call", tool, key, answer, False, False, things, None, picks)


def verdict(*sessions: list[Call]) -> dict[str, Verdict]:
    return learn([list(s) for s in sessions], {"r": declare(RO)})


@pytest.mark.parametrize(
    ("arguments", "picks"),
    [
        ({"path": "a.md", "old": "hello", "new": "bye"}, {"hello"}),
        ({"path": "a.md", "edits": [{"oldText": "x = 1", "newText": "x = 2"}]}, {"x = 1"}),
        ({"pattern": "h.llo", "replacement": "bye"}, {"h.llo"}),
        ({"search": "hello"}, {"hello"}),
        ({"path": "a.md", "line": 2, "text": "more"}, set()),  # an insert picks nothing by content
        ({"search_path": "/tmp", "match_case": "yes"}, set()),  # options named like a selector
    ],
)
def test_a_call_selects_its_target_by_the_values_of_arguments_named_for_it(
    arguments: dict[str, Any], picks: set[str]
) -> None:
    assert selected(arguments) == picks


@pytest.mark.parametrize(
    ("answer", "nothing"),
    [
        ("0 replacements", True),
        ("No matches found for 'zzz'", True),
        ("Pattern not found", True),
        ("nothing to replace", True),
        ("0 rows affected", True),
        ("1 replacement", False),
        ("ok", False),
        ("Replaced 3 occurrences", False),
    ],
)
def test_a_call_says_it_did_nothing_in_its_own_words(answer: str, nothing: bool) -> None:
    assert did_nothing(answer) is nothing


def test_a_read_shows_a_find_replace_only_when_it_showed_the_pattern_before() -> None:
    assert can_show(read(), call("find_replace", "1 replacement", path="a.md", old="hello", new="bye"))
    assert not can_show(read(), call("find_replace", "1 replacement", path="a.md", old="zzz", new="y"))
    assert not can_show(read(), call("find_replace", "0 replacements", path="a.md", old="hello", new="y"))
    quoted = read('{"text": "say \\"hi\\"\\nthen go"}')  # an answer's JSON escapes count as shown
    assert can_show(quoted, call("find_replace", "1 replacement", path="a.md", old='"hi"\nthen', new="y"))


def test_a_find_replace_whose_pattern_is_absent_stays_unknown_after_three_reads_unchanged() -> None:
    patterns = ["zzz", "qqq", "www"]
    session = [read()]
    for old in patterns:
        session += [call("find_replace", "0 replacements", path="a.md", old=old, new="x"), read()]
    found = verdict(session)["find_replace"]
    assert found.effect is Effect.UNKNOWN and found.witnesses == ()
    # The same three reads, had the tool answered otherwise and its pattern been shown: effect-free.
    present = [read()]
    for old in ("hello", "world", "Intro"):
        present += [call("find_replace", "previewed", path="a.md", old=old, new="x"), read()]
    assert verdict(present)["find_replace"].effect is Effect.NONE


def test_an_insert_of_lines_stays_unknown_after_one_read_unchanged() -> None:
    headings = "Intro\nUsage"  # a read of the headings: it cannot show a line of body text
    session = [read(headings), call("insert_lines", "ok", path="a.md", line=2, text="more"), read(headings)]
    found = verdict(session)["insert_lines"]
    assert found.effect is Effect.UNKNOWN
    assert found.reason.startswith("1 read unchanged, after 1 of its calls: too few to tell")


def test_heading_numbering_stays_unknown_after_one_read_of_headings_without_numbers() -> None:
    headings = "Intro\nUsage"
    session = [read(headings), call("number_headings", "ok", path="a.md"), read(headings)]
    assert verdict(session)["number_headings"].effect is Effect.UNKNOWN
    # A read that shows what it changes settles it, whatever the headings read says.
    shown = [read(), call("number_headings", "ok", path="a.md"), read(DOC.replace("# ", "# 1. ", 1))]
    assert verdict(session, shown)["number_headings"].effect is Effect.CHANGES


async def _edited_documents(db: Path) -> None:
    """The real document server: find/replace of absent patterns around reads, an insert, then both
    applied for real in sessions of their own."""
    absent = [step("read_document", path="a.md")]
    for old in ("zzz", "qqq", "www"):
        absent += [step("find_replace", path="a.md", old=old, new="x"), step("read_document", path="a.md")]
    await record(db, "document", absent)
    await record(db, "document", [step("find_replace", path="a.md", old="hello", new="bye")])
    inserted = [step("read_headings", path="a.md"), step("insert_lines", path="a.md", line=2, text="more")]
    await record(db, "document", [*inserted, step("read_headings", path="a.md")])
    await record(db, "document", [inserted[1]])


def _episode(resolver: Resolver, *calls: tuple[str, dict[str, Any]]) -> list[Tier]:
    trail = resolver.lookup.trail([])
    tiers = []
    for method, params in calls:
        found = resolver.resolve("document", method, params, trail)
        resolver.advance(trail, found)
        tiers.append(found.tier)
    return tiers


@pytest.mark.anyio
async def test_plain_serving_misses_a_read_after_a_write_no_witness_could_show(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    await _edited_documents(db)
    with Store(db) as store:
        effects = store_effects(store)["document"]
        assert effects["find_replace"].effect is Effect.UNKNOWN  # "3 reads unchanged" is no witness
        assert effects["insert_lines"].effect is Effect.UNKNOWN  # "1 read unchanged" says too little
        resolver = Resolver(store, index_dir=None, semantic=False)
        read = step("read_document", path="a.md")
        replaced = step("find_replace", path="a.md", old="hello", new="bye")
        assert _episode(resolver, replaced, read) == [Tier.EXACT, Tier.MISS]  # not "hello world"
        inserted = step("insert_lines", path="a.md", line=2, text="more")
        assert _episode(resolver, inserted, read) == [Tier.EXACT, Tier.MISS]


@pytest.mark.anyio
@pytest.mark.slow
async def test_explored_serving_learns_the_writes_change_state_never_that_they_are_effect_free(
    tmp_path: Path,
) -> None:
    db = tmp_path / "r.db"
    await _edited_documents(db)
    config = write_config(tmp_path / "recorder.toml", servers=("document",))
    done = subprocess.run(
        [REPLAY_SIM, "explore", "--config", str(config), "--db", str(db)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    with Store(db) as store:
        effects = store_effects(store)["document"]
        for tool in ("find_replace", "insert_lines"):
            assert effects[tool].effect is not Effect.NONE, effects[tool].describe()
        resolver = Resolver(store, index_dir=None, semantic=False)
        replaced = step("find_replace", path="a.md", old="hello", new="bye")
        tiers = _episode(resolver, replaced, step("read_document", path="a.md"))
        assert tiers[1] is Tier.MISS
