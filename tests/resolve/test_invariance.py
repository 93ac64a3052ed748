# ruff: noqa: E501 - the evidence tables read best one case per line
"""Which argument differences a server ignores, learned from recorded pairs (never assumed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from resolver_helpers import call

from replay_sim.resolve.invariance import Observation, Verdict, apply, judge, learn
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
    assert learn(calls) == {"names": (Transform.ORDER,)}


def test_the_default_whitespace_assumption_holds_until_a_recording_refutes_it() -> None:
    assert learn([seen("A", q="a")], assumed_space=["q"]) == {"q": (Transform.SPACE,)}
    refuted = [seen("A", q="a"), seen("other", q=" a")]
    assert learn(refuted, assumed_space=["q"]) == {}


def test_apply_takes_out_only_the_learned_differences() -> None:
    invariances = {"q": (Transform.SPACE, Transform.CASE), "names": (Transform.ORDER,)}
    arguments = {"q": "  Chess ", "names": ["b", "a"], "path": " /A "}
    assert apply(arguments, invariances) == {"q": "chess", "names": ["a", "b"], "path": " /A "}
    assert arguments["q"] == "  Chess "  # the caller's object is left alone


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
