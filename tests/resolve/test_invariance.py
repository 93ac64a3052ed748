# ruff: noqa: E501 - the evidence tables read best one case per line
"""Which argument differences a server ignores, learned from recorded pairs (never assumed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from recording_helpers import PYTHON, ROOT, proxy_stdio, run_script, stdio, step
from resolver_helpers import call

from replay_sim.canonical import answer_text
from replay_sim.resolve.invariance import Default, Observation, Scoped, Verdict, apply, judge, learn
from replay_sim.resolve.resolution import FieldDiff, Tier
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Store
from replay_sim.variants import Transform


def seen(answer: str, state: str = "s0", failed: bool = False, **arguments: Any) -> Observation:
    return Observation(state, arguments, answer, failed)


@pytest.mark.parametrize(
    ("calls", "verdict"),
    [
        # Two pairs differing only in case, each with its own answer: shown.
        ([seen("A", q="Acme"), seen("A", q="ACME"), seen("P", q="person"), seen("P", q="Person")], Verdict.SHOWN),
        # One pair is not enough.
        ([seen("A", q="Acme"), seen("A", q="ACME")], Verdict.UNKNOWN),
        # The same pair again is not a second piece of evidence.
        ([seen("A", q="Acme"), seen("A", q="ACME"), seen("A", state="s1", q="acme"), seen("A", state="s1", q="Acme")],
         Verdict.UNKNOWN),
        # Two pairs that both found nothing are one answer, not two: a case-sensitive search says that too.
        ([seen("none", q="quantum"), seen("none", q="QUANTUM"), seen("none", q="weather"), seen("none", q="WEATHER")],
         Verdict.UNKNOWN),
        ([seen("A", q="Acme"), seen("A", q="ACME"), seen("none", q="quantum"), seen("none", q="QUANTUM")],
         Verdict.SHOWN),
        # Errors refute when they differ, but never support.
        ([seen("A", q="Acme"), seen("A", q="ACME"), seen("E", failed=True, q="x"), seen("E", failed=True, q="X")],
         Verdict.UNKNOWN),
        ([seen("A", q="Acme"), seen("E", failed=True, q="ACME")], Verdict.REFUTED),
        # One pair with different answers refutes, whatever else agrees.
        ([seen("A", q="Acme"), seen("A", q="ACME"), seen("P", q="person"), seen("P", q="Person"),
          seen("B", q="Bob"), seen("nothing", q="bob")], Verdict.REFUTED),
        # Pairs must come from one state and agree in every other argument.
        ([seen("A", q="Acme"), seen("B", state="s1", q="ACME"), seen("P", q="person", limit=1),
          seen("Q", q="Person", limit=2)], Verdict.UNKNOWN),
    ],
)  # fmt: skip
def test_case_is_ignored_only_when_distinct_recorded_pairs_show_it(
    calls: list[Observation], verdict: Verdict
) -> None:
    assert judge(calls, "q", Transform.CASE) is verdict


def test_array_order_and_whitespace_are_judged_the_same_way() -> None:
    calls = [
        seen("AB", names=["Alice", "Bob"], q="x"),
        seen("AB", names=["Bob", "Alice"], q="x"),
        seen("AC", names=["Acme", "Alice"], q="x"),
        seen("AC", names=["Alice", "Acme"], q="x"),
        seen("B", names=["Bob"], q="Bob"),
        seen("nothing", names=["Bob"], q="Bob "),
    ]
    assert judge(calls, "names", Transform.ORDER) is Verdict.SHOWN
    assert judge(calls, "q", Transform.SPACE) is Verdict.REFUTED
    assert learn(calls) == {"names": (Scoped(Transform.ORDER, frozenset({"string"})),)}


def test_the_default_whitespace_assumption_holds_until_a_recording_refutes_it() -> None:
    assert learn([seen("A", q="a")], assumed_space=["q"]) == {"q": (Transform.SPACE,)}
    refuted = [seen("A", q="a"), seen("other", q=" a")]
    assert learn(refuted, assumed_space=["q"]) == {}


def test_apply_takes_out_only_the_learned_differences() -> None:
    invariances = {"q": (Transform.SPACE, Transform.CASE), "names": (Transform.ORDER,)}
    arguments = {"q": "  Chess ", "names": ["b", "a"], "path": " /A "}
    assert apply(arguments, invariances) == {"q": "chess", "names": ["a", "b"], "path": " /A "}
    assert arguments["q"] == "  Chess "  # the caller's object is left alone


# Per kind of difference: two pairs that differ only by it, each pair with its own answer, and a
# third pair that differs only by it and got another answer.
_PAIRS = [
    (Transform.PATH_SEP, ("src/a", "src//a"), ("lib/b", "lib///b"), ("x/y", "x//y")),
    (Transform.PATH_DOT, ("src/a", "./src/a"), ("lib/b", "././lib/b"), ("x/y", "./x/y")),
    (Transform.PATH_UP, ("src/a", "src/../src/a"), ("lib/b", "lib/c/../b"), ("x/y", "x/../x/y")),
    (Transform.PATH_SLASH, ("src/a", "src/a/"), ("/srv/lib", "/srv/lib/"), ("x/y", "x/y/")),
    (Transform.NUMBER, (1, "1"), ("2.50", 2.5), (3, "3.0")),
    (Transform.MIDNIGHT, ("2026-01-15", "2026-01-15T00:00:00"), ("2026-02-01", "2026-02-01T00:00:00"),
     ("2026-03-01", "2026-03-01T00:00:00")),
    (Transform.SECONDS, ("09:00", "09:00:00"), ("2026-01-15T10:30Z", "2026-01-15T10:30:00Z"), ("11:00", "11:00:00")),
    (Transform.HOUR_PAD, ("9:00", "09:00"), ("7:30:00", "07:30:00"), ("8:00", "08:00")),
    (Transform.DUPLICATES, (["a", "b"], ["a", "a", "b"]), (["c"], ["c", "c"]), (["d", "e"], ["d", "e", "d"])),
]  # fmt: skip


@pytest.mark.parametrize(("transform", "first", "second", "third"), _PAIRS, ids=[p[0].value for p in _PAIRS])
def test_each_kind_of_spelling_is_learned_from_agreeing_pairs_and_refuted_by_one_disagreeing(
    transform: Transform, first: tuple[Any, Any], second: tuple[Any, Any], third: tuple[Any, Any]
) -> None:
    agreeing = [seen(f"answer {n}", v=value) for n, pair in enumerate([first, second]) for value in pair]
    assert judge(agreeing, "v", transform) is Verdict.SHOWN
    reach = {
        Transform.NUMBER: frozenset({"type", "spelling"}),  # 1 vs "1"; "2.50" vs 2.5
    }
    assert learn(agreeing) == {"v": (Scoped(transform, reach[transform]) if transform.scoped else transform,)}
    assert judge(agreeing[:2], "v", transform) is Verdict.UNKNOWN  # one pair is one answer
    disagreeing = [*agreeing, seen("one answer", v=third[0]), seen("another", v=third[1])]
    assert judge(disagreeing, "v", transform) is Verdict.REFUTED
    assert learn(disagreeing) == {}
    failed = [*agreeing, seen("E", failed=True, v=third[0]), seen("ok", v=third[1])]
    assert judge(failed, "v", transform) is Verdict.REFUTED  # an error for one spelling refutes


def test_a_spelling_is_not_learned_from_pairs_that_differ_otherwise() -> None:
    # "src/a" vs "src/a/" in two states, or with another limit: no pair differs only by the slash.
    calls = [seen("A", path="src/a"), seen("B", state="s1", path="src/a/"),
             seen("C", path="lib", limit=1), seen("D", path="lib/", limit=2)]  # fmt: skip
    assert judge(calls, "path", Transform.PATH_SLASH) is Verdict.UNKNOWN


@pytest.mark.parametrize(
    ("calls", "verdict", "default"),
    [
        # Leaving limit out answered like limit=10, for two different queries: 10 is the default.
        ([seen("A10", q="a"), seen("A10", q="a", limit=10), seen("B10", q="b"), seen("B10", q="b", limit=10),
          seen("A5", q="a", limit=5)], Verdict.SHOWN, 10),
        # One pair is not enough.
        ([seen("A10", q="a"), seen("A10", q="a", limit=10)], Verdict.UNKNOWN, None),
        # Absent and 10 disagreed once: 10 is not what absence means.
        ([seen("A10", q="a"), seen("A10", q="a", limit=10), seen("B10", q="b"), seen("B10", q="b", limit=10),
          seen("C", q="c"), seen("C10", q="c", limit=10)], Verdict.REFUTED, None),
        # Errors never support.
        ([seen("E", failed=True, q="a"), seen("E", failed=True, q="a", limit=10), seen("B10", q="b"),
          seen("B10", q="b", limit=10)], Verdict.UNKNOWN, None),
        # Two values each answered like absence: the argument is ignored there, not defaulted.
        ([seen("A", q="a"), seen("A", q="a", limit=10), seen("B", q="b"), seen("B", q="b", limit=10),
          seen("A", q="a", limit=20), seen("B", q="b", limit=20)], Verdict.UNKNOWN, None),
        # Calls from another state do not pair.
        ([seen("A10", q="a"), seen("A10", state="s1", q="a", limit=10), seen("B10", q="b"),
          seen("B10", state="s1", q="b", limit=10)], Verdict.UNKNOWN, None),
    ],
)  # fmt: skip
def test_a_default_the_schema_does_not_declare_is_learned_from_absent_and_explicit_pairs(
    calls: list[Observation], verdict: Verdict, default: Any
) -> None:
    assert judge(calls, "limit", Transform.DEFAULT) is verdict
    learned = learn(calls).get("limit", ())
    assert learned == ((Default(default),) if verdict is Verdict.SHOWN else ())


def test_a_learned_default_fills_the_argument_before_its_spelling_is_taken_out() -> None:
    invariances = {"path": (Default("Src/"), Transform.CASE, Transform.PATH_SLASH)}
    assert apply({}, invariances) == {"path": "src"}
    assert apply({"path": "SRC"}, invariances) == {"path": "src"}
    assert apply({"q": 1}, {"limit": (Default([10]),)}) == {"q": 1, "limit": [10]}


_TOOLS = [
    {
        "name": "find",
        "inputSchema": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "open",
        "inputSchema": {
            "type": "object",
            "properties": {"names": {"type": "array", "items": {"type": "string"}}},
        },
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "save",
        "inputSchema": {"type": "object", "properties": {"query": {"type": "string"}}},
        "annotations": {"readOnlyHint": False},
    },
]


def _resolve(resolver: Resolver, name: str, history: list[str] | None = None, **arguments: Any) -> Any:
    return resolver.resolve("demo", "tools/call", {"name": name, "arguments": arguments}, history or [])


def test_the_resolver_answers_what_the_recordings_show_is_ignored(tmp_path: Path) -> None:
    store = Store(tmp_path / "r.db")
    store.put_listing("demo", "tools/list", {"tools": _TOOLS})
    for query, answer in [
        ("Acme", "Acme, Alice"), ("ACME", "Acme, Alice"), ("person", "Alice, Bob"), ("Person", "Alice, Bob"),
        ("chess", "Alice likes chess"), ("quantum", "nothing"), ("Bob", "Bob"), ("Bob ", "nothing"),
    ]:  # fmt: skip
        call(store, "find", {"query": query}, answer)
    for names, answer in [(["Alice", "Acme"], "Alice, Acme"), (["Acme", "Alice"], "Alice, Acme")]:
        call(store, "open", {"names": names}, answer)
    call(store, "open", {"names": ["Bob", "Acme"]}, "Bob, Acme")
    call(store, "open", {"names": ["Acme", "Bob"]}, "Bob, Acme")
    call(store, "open", {"names": ["Alice", "Bob"]}, "Alice, Bob")
    call(store, "save", {"query": "chess"}, "saved", session="w")
    call(store, "save", {"query": "CHESS"}, "saved", session="w2")
    call(store, "find", {"query": "chess"}, "Alice and Carol like chess", session="w")
    resolver = Resolver(store, index_dir=None, semantic=False)

    found = _resolve(resolver, "find", query="CHESS")
    assert (found.tier, found.recording.result["content"][0]["text"]) == (Tier.CANONICAL, "Alice likes chess")
    assert found.differences == [FieldDiff("query", "chess", "CHESS")]
    assert _resolve(resolver, "find", query="Quantum").tier is Tier.CANONICAL
    found = _resolve(resolver, "open", names=["Bob", "Alice"])
    assert (found.tier, found.recording.result["content"][0]["text"]) == (Tier.CANONICAL, "Alice, Bob")
    # Whitespace is refuted ("Bob " found nothing), so a padded query is not the same call.
    padded = _resolve(resolver, "find", query=" chess")
    assert padded.tier is Tier.MISS and "must match exactly: the tool echoes query" in padded.reason
    # A write is never judged by its answer: "saved" twice says nothing about the state it left.
    write = _resolve(resolver, "save", query="Chess")
    assert write.tier is Tier.MISS and "must match exactly: the tool changes state" in write.reason
    # The learned invariance still answers only from the episode's state.
    after = [_resolve(resolver, "save", query="chess").step]
    found = _resolve(resolver, "find", after, query="Chess")
    assert found.recording.result["content"][0]["text"] == "Alice and Carol like chess"


def test_the_resolver_answers_a_path_spelling_and_an_omitted_default_the_recordings_show(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "r.db")
    schema = {
        "type": "object",
        "properties": {"path": {"type": "string"}, "max_count": {"type": "integer"}},  # no declared default
        "required": ["path"],
    }
    store.put_listing("demo", "tools/list", {"tools": [
        {"name": "log", "inputSchema": schema, "annotations": {"readOnlyHint": True}},
    ]})  # fmt: skip
    recorded: list[tuple[dict[str, Any], str]] = [
        ({"path": "src"}, "3 commits in src"), ({"path": "src/"}, "3 commits in src"),
        ({"path": "docs"}, "1 commit in docs"), ({"path": "docs/"}, "1 commit in docs"),
        ({"path": "lib"}, "2 commits in lib"), ({"path": "lib", "max_count": 10}, "2 commits in lib"),
        ({"path": "docs", "max_count": 10}, "1 commit in docs"), ({"path": "src", "max_count": 1}, "1 commit in src"),
    ]  # fmt: skip
    for arguments, answer in recorded:
        call(store, "log", arguments, answer)
    resolver = Resolver(store, index_dir=None, semantic=False)

    found = _resolve(resolver, "log", path="lib/")
    assert (found.tier, found.recording.result["content"][0]["text"]) == (Tier.CANONICAL, "2 commits in lib")
    found = _resolve(resolver, "log", path="src", max_count=10)
    assert (found.tier, found.recording.result["content"][0]["text"]) == (Tier.CANONICAL, "3 commits in src")
    # Another count is another call, and a spelling nobody showed is not taken out.
    assert _resolve(resolver, "log", path="src", max_count=2).tier is Tier.MISS
    assert _resolve(resolver, "log", path="./src").tier is Tier.MISS


COUNTER = [PYTHON, ROOT / "fixtures" / "counter_server.py"]


@pytest.mark.anyio
async def test_a_case_invariance_learned_on_identifiers_does_not_cover_a_function_names_case(
    tmp_path: Path,
) -> None:
    # The real counter server's SQLite: the recorded pairs upper-case names only (keywords are
    # upper case already), with two different answers: case of identifiers is shown ignored.
    db = tmp_path / "r.db"
    script = [
        step("sql", sql="SELECT name FROM items WHERE n = 1"),
        step("sql", sql="SELECT NAME FROM ITEMS WHERE N = 1"),
        step("sql", sql="SELECT name FROM items WHERE n = 2"),
        step("sql", sql="SELECT NAME FROM ITEMS WHERE N = 2"),
        step("sql", sql="SELECT count(*) FROM items"),
    ]
    await run_script(proxy_stdio(db, "counter", COUNTER), script)
    asked = [
        step("sql", sql="SELECT COUNT(*) FROM items"),
        step("sql", sql="SELECT name FROM ITEMS WHERE n = 2"),
    ]
    truth = [answer_text(a, None) for a in await run_script(stdio(*COUNTER), asked)]
    with Store(db) as store:
        resolver = Resolver(store, index_dir=None, semantic=False)
        function, identifier = (resolver.resolve("counter", m, p, []) for m, p in asked)
    # SQLite labels the column `COUNT(*)`, not the recorded `count(*)`: never served.
    assert function.tier is Tier.MISS
    assert identifier.tier is Tier.CANONICAL and identifier.recording is not None
    assert answer_text(identifier.recording.result, None) == truth[1]


NOTES = [PYTHON, ROOT / "fixtures" / "notes_server.py"]


@pytest.mark.anyio
async def test_a_learned_whitespace_number_or_order_invariance_covers_only_the_difference_its_pairs_made(
    tmp_path: Path,
) -> None:
    # The real notes server's `format` strips spaces (not newlines) from text, echoes a string
    # factor as given, and sorts string tags (not numbers). The recorded pairs padded text with
    # spaces, quoted factors without respelling them and reversed string tags — two answers each.
    db = tmp_path / "r.db"
    recorded = [
        {"text": "alpha one"}, {"text": " alpha one "}, {"text": "beta two"}, {"text": " beta two "},
        {"text": "factor line", "factor": 2}, {"text": "factor line", "factor": "2"}, {"text": "factor line", "factor": 3},
        {"text": "factor line", "factor": "3"}, {"text": "factor line", "factor": 2.5},
        {"text": "tag line", "tags": ["a", "b"]}, {"text": "tag line", "tags": ["b", "a"]}, {"text": "tag line", "tags": ["c", "d"]},
        {"text": "tag line", "tags": ["d", "c"]}, {"text": "tag line", "tags": [1, 2]},
    ]  # fmt: skip
    await run_script(proxy_stdio(db, "notes", NOTES), [step("format", **a) for a in recorded])
    asked = [
        {"text": "alpha one\n"},  # a trailing newline: no pair changed one
        {"text": "factor line", "factor": "2.50"},  # a respelled number: no pair respelled one
        {"text": "tag line", "tags": [2, 1]},  # reordered numbers: no pair reordered any
        {"text": "alpha one "},  # what the pairs did show: answered
        {"text": "factor line", "factor": "2.5"},
        {"text": "tag line", "tags": ["d", "c"]},
    ]
    truth = [
        answer_text(a, None) for a in await run_script(stdio(*NOTES), [step("format", **a) for a in asked])
    ]
    with Store(db) as store:
        resolver = Resolver(store, index_dir=None, semantic=False)
        found = [
            resolver.resolve("notes", "tools/call", {"name": "format", "arguments": a}, []) for a in asked
        ]
    served = [None if f.recording is None else answer_text(f.recording.result, None) for f in found]
    # Before, each learned invariance applied to every difference of its kind: all three were
    # served another call's answer (`"alpha one"` for `"alpha one\n"`, `"2.5"` for `"2.50"`, `[1, 2]` for `[2, 1]`).
    assert [s != t for s, t in zip(served[:3], truth[:3], strict=True)] == [True] * 3  # they would be wrong
    assert [f.tier for f in found[:3]] == [Tier.MISS] * 3
    assert [f.tier for f in found[3:]] == [Tier.CANONICAL, Tier.CANONICAL, Tier.EXACT]
    assert served[3:] == truth[3:]
