"""Which tools change state: declared, or learned from the recordings (the evidence rules, table-driven)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from recording_helpers import PYTHON, ROOT, proxy_stdio, run_script, step
from resolver_helpers import record_x, x_tool

from replay_sim.effects import Call, Declaration, Effect, covers, declare, learn, named
from replay_sim.resolve.calibration import MatchConfig, ToolOverride
from replay_sim.resolve.resolution import Tier
from replay_sim.resolve.resolver import Resolver
from replay_sim.resolve.tooleffects import store_effects
from replay_sim.store import Store

COUNTER = [PYTHON, ROOT / "fixtures" / "counter_server.py"]

RO = {"readOnlyHint": True}
_ids = iter(range(1, 10**6))


def c(spec: str) -> Call:
    """``tool(args)=answer``; ``!`` before the answer marks a failure, ``res:uri=answer`` a resource read."""
    head, answer = spec.split("=")
    failed = answer.startswith("!")
    if head.startswith("res:"):
        return Call(next(_ids), "resources/read", head[4:], head, answer, failed, True)
    name = head.split("(")[0]
    return Call(next(_ids), "tools/call", name, head, answer, failed, failed)


def effects(sessions: list[list[str]], declared: dict[str, Declaration] | None = None) -> dict[str, Effect]:
    verdicts = learn([[c(s) for s in run] for run in sessions], declared or {})
    return {tool: v.effect for tool, v in verdicts.items()}


@pytest.mark.parametrize(
    ("sessions", "declared", "expected"),
    [
        # A pure function: f(1) answers the same after f(2) (its answers vary, so it can witness itself).
        ([["f(1)=2", "f(2)=4", "f(1)=2"]], {}, {"f": Effect.NONE}),
        # A write that always says "ok" shows nothing by repeating itself.
        ([["w(1)=ok", "w(2)=ok", "w(1)=ok"]], {}, {"w": Effect.UNKNOWN}),
        # A read before and after the only call of a tool, unchanged: that call changed nothing
        # the read shows, which says little of the tool (an insert of lines: "1 read unchanged").
        ([["r(a)=A", "w(1)=ok", "r(a)=A"]], {"r": declare(RO)}, {"r": Effect.NONE, "w": Effect.UNKNOWN}),
        # ... and of two different calls: effect-free.
        (
            [["r(a)=A", "w(1)=ok", "r(a)=A", "w(2)=ok", "r(a)=A"]],
            {"r": declare(RO)},
            {"r": Effect.NONE, "w": Effect.NONE},
        ),
        # ... changed: the tool changes state.
        ([["r(a)=A", "w(1)=ok", "r(a)=B"]], {"r": declare(RO)}, {"r": Effect.NONE, "w": Effect.CHANGES}),
        # One call seen to change nothing (a write the server refused in its answer's text) says
        # little about the tool's other calls.
        (
            [["r(a)=A", "w(1)=conflict", "r(a)=A"], ["w(2)=ok"]],
            {"r": declare(RO)},
            {"r": Effect.NONE, "w": Effect.UNKNOWN},
        ),
        # Two different calls seen to change nothing: effect-free.
        (
            [["r(a)=A", "w(1)=x", "r(a)=A", "w(2)=y", "r(a)=A"], ["w(3)=z"]],
            {"r": declare(RO)},
            {"r": Effect.NONE, "w": Effect.NONE},
        ),
        # A failed read before and after is no witness ("no such file" both times).
        ([["r(a)=!missing", "w(1)=ok", "r(a)=!missing"]], {"r": declare(RO)}, {"w": Effect.UNKNOWN}),
        # A read-only hint that lies: the same call answers differently from one state.
        ([["t(a)=#1", "t(b)=#2", "t(a)=#3"]], {"t": declare(RO)}, {"t": Effect.CHANGES}),
        # ... across sessions, which all start from the initial state.
        ([["t(a)=#1"], ["t(b)=#1", "t(a)=#2"]], {"t": declare(RO)}, {"t": Effect.CHANGES}),
        # Across sessions: one session's state extends another's by calls of one tool.
        ([["r(a)=A"], ["w(1)=ok", "r(a)=B"]], {"r": declare(RO)}, {"r": Effect.NONE, "w": Effect.CHANGES}),
        ([["r(a)=A"], ["f(1)=2", "f(2)=4", "r(a)=A"]], {"r": declare(RO)}, {"f": Effect.NONE}),
        # A resource read is a read: it witnesses too.
        ([["res:memo=M", "w(1)=ok", "res:memo=M2"]], {}, {"w": Effect.CHANGES}),
        # A change after calls of two tools of unknown effect: not both effect-free, even though
        # each was seen to change nothing elsewhere.
        (
            [
                ["r(a)=A", "u(1)=1", "r(a)=A", "u(2)=2", "r(a)=A", "v(1)=1", "r(a)=A", "v(2)=2", "r(a)=A"],
                ["r(a)=A", "u(3)=3", "v(3)=3", "r(a)=B"],
            ],
            {"r": declare(RO)},
            {"r": Effect.NONE, "u": Effect.UNKNOWN, "v": Effect.UNKNOWN},
        ),
        # ... which one it was shows once either is known effect-free.
        (
            [
                ["r(a)=A", "u(1)=1", "r(a)=A", "u(2)=2", "r(a)=A"],
                ["r(a)=A", "u(3)=3", "v(3)=3", "r(a)=B"],
            ],
            {"r": declare(RO)},
            {"u": Effect.NONE, "v": Effect.CHANGES},
        ),
        # A read of unknown effect becomes effect-free (its reads of other things left them
        # unchanged, across sessions), and then a change between its two reads is the write's.
        (
            [["q(n)=N", "q(m)=M", "q(t)=T"], ["q(t)=T", "e(1)=ok", "q(t)=T2"]],
            {},
            {"q": Effect.NONE, "e": Effect.CHANGES},
        ),
        # The matching config wins over annotations and evidence, both ways.
        (
            [["t(a)=#1", "t(b)=#2", "t(a)=#3"]],
            {"t": declare(RO, read_only=True)},
            {"t": Effect.NONE},
        ),
        ([["f(1)=2", "f(2)=4", "f(1)=2"]], {"f": declare(None, read_only=False)}, {"f": Effect.CHANGES}),
        # A tool annotated as writing stays so, whatever the reads saw.
        (
            [["r(a)=A", "w(1)=x", "r(a)=A", "w(2)=y", "r(a)=A"]],
            {"r": declare(RO), "w": declare({"readOnlyHint": False})},
            {"w": Effect.CHANGES},
        ),
        ([], {"d": declare({"destructiveHint": True})}, {"d": Effect.CHANGES}),
        ([], {"d": declare({"destructiveHint": True, "readOnlyHint": True})}, {"d": Effect.NONE}),
        # No evidence: unknown.
        ([["a(1)=1", "b(1)=1"]], {}, {"a": Effect.UNKNOWN, "b": Effect.UNKNOWN}),
    ],
)
def test_a_tools_effect_follows_the_evidence_rules(
    sessions: list[list[str]], declared: dict[str, Declaration], expected: dict[str, Effect]
) -> None:
    found = effects(sessions, declared)
    assert {tool: found[tool] for tool in expected} == expected


def test_a_verdict_names_its_evidence() -> None:
    calls = [[c("r(a)=A"), c("w(1)=ok"), c("r(a)=B")], [c("f(1)=2"), c("f(2)=4"), c("f(1)=2")]]
    a, b = calls[0][0].id, calls[0][2].id
    verdicts = learn(calls, {"r": declare(RO)})
    assert verdicts["w"].describe() == f"changes: r before/after differed (recordings {a}, {b})"
    assert verdicts["w"].contrary == (a, b)
    assert verdicts["f"].describe().startswith("none: 1 read unchanged (recordings ")
    assert verdicts["f"].as_dict()["source"] == "evidence"
    assert learn([], {"g": declare(None)})["g"].describe() == "unknown: no evidence"
    assert verdicts["r"].describe() == "none: annotated readOnlyHint: true"


def _resolve(resolver: Resolver, steps: list[tuple[str, Any]]) -> list[tuple[Tier, str | None]]:
    """Resolve a call sequence as one episode: each step's tier and the text it would be answered."""
    trail = resolver.lookup.trail([])
    out = []
    for name, x in steps:
        found = resolver.resolve("srv", "tools/call", {"name": name, "arguments": {"x": x}}, trail)
        resolver.advance(trail, found)
        answer = None if found.recording is None else found.recording.result["content"][0]["text"]  # type: ignore[index]
        out.append((found.tier, answer))
    return out


def test_an_exact_repeat_of_a_pure_function_hits_from_any_point_of_an_episode(tmp_path: Path) -> None:
    store = Store(tmp_path / "r.db")
    store.put_listing("srv", "tools/list", {"tools": [x_tool("double")]})  # no annotations
    for x in (1, 2, 1, 3):
        record_x(store, "s1", "double", x, str(2 * x))
    resolver = Resolver(store, index_dir=None, semantic=False)
    assert resolver.lookup.effect("srv", "double").effect is Effect.NONE
    # Before: only the session's first call was reachable (every later one "after a state change").
    assert _resolve(resolver, [("double", 3), ("double", 2), ("double", 9), ("double", 1)]) == [
        (Tier.EXACT, "6"),
        (Tier.EXACT, "4"),
        (Tier.MISS, None),  # never recorded; and it does not make the episode diverge
        (Tier.EXACT, "2"),
    ]


def test_an_exact_key_of_a_read_only_tool_with_hidden_state_is_never_served_from_another_history(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "r.db")
    store.put_listing("srv", "tools/list", {"tools": [x_tool("tally", RO)]})
    ids = [record_x(store, "s1", "tally", x, f"#{n} {x}") for n, x in enumerate(["a", "b", "a"], 1)]
    resolver = Resolver(store, index_dir=None, semantic=False)
    verdict = resolver.lookup.effect("srv", "tally")
    assert verdict.effect is Effect.CHANGES and verdict.contrary == (ids[0], ids[2])
    assert resolver.tool_schema("srv", "tally").read_only is False  # type: ignore[union-attr]
    # The real server says "#1 b" and "#2 a"; the recordings hold "#2 b" and "#3 a" (other histories).
    assert _resolve(resolver, [("tally", "b")]) == [(Tier.MISS, None)]
    assert _resolve(resolver, [("tally", "a"), ("tally", "a")]) == [(Tier.EXACT, "#1 a"), (Tier.MISS, None)]
    # The recorded history itself is answered as recorded.
    assert _resolve(resolver, [("tally", "a"), ("tally", "b"), ("tally", "a")]) == [
        (Tier.EXACT, "#1 a"),
        (Tier.EXACT, "#2 b"),
        (Tier.EXACT, "#3 a"),
    ]


def test_the_matching_config_keeps_precedence_over_learned_effects(tmp_path: Path) -> None:
    store = Store(tmp_path / "r.db")
    store.put_listing("srv", "tools/list", {"tools": [x_tool("double")]})
    for x in (1, 2, 1):
        record_x(store, "s1", "double", x, str(2 * x))
    config = MatchConfig(tools={"srv/double": ToolOverride(read_only=False)})
    resolver = Resolver(store, config=config, index_dir=None, semantic=False)
    verdict = resolver.lookup.effect("srv", "double")
    assert (verdict.effect, verdict.source) == (Effect.CHANGES, "config")
    assert _resolve(resolver, [("double", 2)]) == [(Tier.MISS, None)]
    assert store_effects(store)["srv"]["double"].effect is Effect.NONE
    assert store_effects(store, config)["srv"]["double"].effect is Effect.CHANGES


def test_effects_are_learned_again_when_new_recordings_arrive(tmp_path: Path) -> None:
    store = Store(tmp_path / "r.db")
    store.put_listing("srv", "tools/list", {"tools": [x_tool("get", RO), x_tool("put")]})
    record_x(store, "s1", "get", "k", "unset")
    record_x(store, "s1", "put", "k", "ok")
    resolver = Resolver(store, index_dir=None, semantic=False)
    assert resolver.lookup.effect("srv", "put").effect is Effect.UNKNOWN
    record_x(store, "s1", "get", "k", "set")
    assert _resolve(resolver, [("get", "k")]) == [(Tier.EXACT, "unset")]  # a call notices the change
    assert resolver.lookup.effect("srv", "put").effect is Effect.CHANGES


@pytest.mark.parametrize(
    ("arguments", "names"),
    [
        ({"path": "/data/a.txt", "content": "hello there"}, {"/data/a.txt"}),
        ({"key": "Alpha", "value": "1"}, {"alpha"}),
        ({"entityNames": ["Alice", "Bob"]}, {"alice", "bob"}),
        ({"entities": [{"name": "Ada", "observations": ["likes chess"]}]}, {"ada"}),
        ({"query": "INSERT INTO products (name) VALUES ('x')"}, {"products"}),
        ({"query": "SELECT count(*) FROM orders JOIN items ON 1"}, {"orders", "items"}),
        ({"x": 2, "expression": "2+3*4", "text": "hello world"}, set()),  # numbers and prose name nothing
    ],
)
def test_a_call_names_the_things_its_identifying_arguments_and_sql_tables_name(
    arguments: dict[str, Any], names: set[str]
) -> None:
    assert named(arguments) == names


def _call(names: set[str], answer: str = "{}") -> Call:
    return Call(1, "tools/call", "t", "k", answer, False, False, frozenset(names))


@pytest.mark.parametrize(
    ("observer", "call", "covered"),
    [
        (_call({"/data/b.txt"}), _call({"/data/a.txt"}), False),  # another file sees nothing of a.txt
        (_call({"/data/a.txt"}), _call({"/data/a.txt"}), True),
        (_call({"/data"}), _call({"/data/a.txt"}), True),  # the folder that holds it
        (_call({"gamma"}, '"null"'), _call({"alpha"}), False),
        (_call(set(), '{"entities": ["alpha"]}'), _call({"alpha"}), True),  # its answer shows it
        (_call({"products"}), _call({"products"}), True),
        (_call({"anything"}), _call(set()), True),  # a call naming nothing: any observer
    ],
)
def test_an_observer_covers_a_call_only_when_it_names_or_shows_what_the_call_names(
    observer: Call, call: Call, covered: bool
) -> None:
    assert covers(observer, call) is covered


@pytest.mark.anyio
async def test_a_write_is_not_learned_effect_free_from_a_read_of_another_key(tmp_path: Path) -> None:
    # The real counter server: `get gamma` before and after `put alpha` agrees, which says nothing
    # about alpha (it was learned effect-free from that one unrelated read).
    db = tmp_path / "r.db"
    script = [step("get", key="gamma"), step("put", key="alpha", value="1"), step("get", key="gamma")]
    await run_script(proxy_stdio(db, "counter", COUNTER), script)
    await run_script(proxy_stdio(db, "counter", COUNTER), [step("get", key="alpha")])
    with Store(db) as store:
        effects = store_effects(store)["counter"]
    assert effects["put"].effect is Effect.UNKNOWN
