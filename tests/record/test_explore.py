"""The recorder asks a real server which tools change state and which argument differences it ignores.

Replay answers from what the answers show: a pure function is effect-free, a write changes state, a
read-only hint that hides state is not believed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from recording_helpers import NODE_BIN, PYTHON, ROOT, proxy_stdio, run_script, stdio, step

from replay_sim.canonical import answer_text
from replay_sim.effects import Effect
from replay_sim.record.config import RecorderConfig, UpstreamSpec
from replay_sim.record.effect_probes import EffectProbes
from replay_sim.record.explore import Explorer, Variant
from replay_sim.record.revisit import explore_store
from replay_sim.resolve.resolution import Tier
from replay_sim.resolve.resolver import Resolver
from replay_sim.schema import tool_schemas
from replay_sim.store import Origin, Store
from replay_sim.variants import MIN_EVIDENCE, Transform


@pytest.mark.parametrize(
    ("transform", "value", "varied"),
    [
        (Transform.CASE, "Acme", "ACME"),
        (Transform.CASE, "ACME", "acme"),
        (Transform.CASE, "12:30", None),  # nothing with a case
        # Code: every letter swapped, so keywords, function names and names each change case.
        (Transform.CASE, "SELECT count(*) FROM items", "select COUNT(*) from ITEMS"),
        (Transform.SPACE, "Acme", " Acme \n"),  # a space before, a space and a newline after
        (Transform.SPACE, " Acme\n", "Acme"),
        (Transform.SPACE, "   ", None),
        (Transform.ORDER, ["a", "b"], ["b", "a"]),
        (Transform.ORDER, ["a", "a"], None),
        (Transform.ORDER, "ab", None),
        (Transform.CASE, 3, None),
        (Transform.CASE, "x" * 5000, None),  # prose nobody retypes
    ],
)
def test_each_variant_differs_only_by_its_transform(transform: Transform, value: Any, varied: Any) -> None:
    assert transform.vary(value) == varied
    if varied is not None:
        assert transform.apply(varied) == transform.apply(value)


def test_a_difference_is_asked_about_until_the_answers_settle_it() -> None:
    explorer = Explorer(budget=10)

    def ask(query: str, agree: bool) -> list[Transform]:
        asked = explorer.variants("search", {"query": query})
        for variant in asked:
            explorer.observe(variant, f"answer {query}", f"answer {query}" if agree else "other")
        return [v.transform for v in asked]

    assert ask("alice", agree=True) == [Transform.SPACE, Transform.CASE]
    assert ask("bob", agree=False) == [Transform.SPACE, Transform.CASE]  # refuted: settled
    assert ask("carol", agree=True) == []
    explorer = Explorer(budget=10)
    for n in range(MIN_EVIDENCE + 1):  # agreeing answers, one more than the resolver needs
        assert ask(f"q{n}x", agree=True) == [Transform.SPACE, Transform.CASE]
    assert ask("next", agree=True) == []


def test_the_budget_bounds_the_calls_when_the_answers_never_settle() -> None:
    explorer = Explorer(budget=2)
    variant = Variant("search", "query", Transform.CASE, {"query": "X"})
    for _ in range(2):
        assert Transform.CASE in [v.transform for v in explorer.variants("search", {"query": "x"})]
        explorer.observe(variant, "same", "same")  # one answer again and again: never settles
    assert [v.transform for v in explorer.variants("search", {"query": "x"})] == [Transform.SPACE]


_GRAPH = [
    {"type": "entity", "name": "Alice", "entityType": "person", "observations": ["likes chess"]},
    {"type": "entity", "name": "Bob", "entityType": "person", "observations": ["plays violin"]},
    {"type": "entity", "name": "Acme", "entityType": "company", "observations": ["makes rockets"]},
    {"type": "relation", "from": "Alice", "to": "Acme", "relationType": "works_at"},
]


@pytest.mark.slow
@pytest.mark.anyio
async def test_recording_with_explore_lets_replay_answer_what_the_real_server_ignores(tmp_path: Path) -> None:
    graph = tmp_path / "memory.jsonl"

    def reset() -> None:
        graph.write_text("".join(json.dumps(e) + "\n" for e in _GRAPH))

    memory = [str(NODE_BIN / "mcp-server-memory")]
    script = [
        *[step("search_nodes", query=q) for q in ["Alice", "quantum", "Acme", "violin", "person"]],
        step("open_nodes", names=["Alice", "Bob"]),
        step("open_nodes", names=["Acme", "Bob"]),
        step("open_nodes", names=["Alice", "Bob", "Acme"]),
        step("create_entities", entities=[{"name": "Carol", "entityType": "person", "observations": []}]),
        step("search_nodes", query="Carol"),
    ]
    reset()
    db = tmp_path / "r.db"
    env = f"MEMORY_FILE_PATH={graph}"
    proxied = await run_script(proxy_stdio(db, "memory", memory, "--explore", "-e", env), script)
    reset()
    direct = await run_script(stdio(memory[0], env={"MEMORY_FILE_PATH": str(graph)}), script)
    assert proxied == direct  # exploring changes nothing the client sees

    store = Store(db)
    explored = [r for r in store.recordings() if r.origin == Origin.EXPLORE]
    assert {r.name for r in explored} == {"search_nodes", "open_nodes"}  # never a write
    asked = [r.arguments for r in explored]
    assert {"query": "ALICE"} in asked and {"query": " Alice \n"} in asked
    assert {"names": ["Bob", "Alice"]} in asked
    assert sum(r.arguments.get("query", "").isupper() for r in explored) <= MIN_EVIDENCE + 1

    # Replay answers variants the recordings show the server ignores, exactly as the server would.
    calls = [
        step("search_nodes", query="aCmE"),
        step("search_nodes", query="Person"),
        step("open_nodes", names=["Bob", "Alice", "Acme"]),
    ]
    reset()
    truth = await run_script(stdio(memory[0], env={"MEMORY_FILE_PATH": str(graph)}), calls)
    resolver = Resolver(store, index_dir=None, semantic=False)
    for (method, params), real in zip(calls, truth, strict=True):
        found = resolver.resolve("memory", method, params, [])
        assert found.tier is Tier.CANONICAL, found.reason
        assert answer_text(found.recording.result, None) == answer_text(real, None)
    # Whitespace is not ignored by this server (" Alice " finds nothing), so it is not assumed.
    assert resolver.resolve("memory", *step("search_nodes", query="Alice "), []).tier is Tier.MISS
    store.close()


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_secret_is_never_varied_so_no_variant_escapes_redaction(tmp_path: Path) -> None:
    graph = tmp_path / "memory.jsonl"
    graph.write_text("".join(json.dumps(e) + "\n" for e in _GRAPH))
    db = tmp_path / "r.db"
    memory = [str(NODE_BIN / "mcp-server-memory")]
    options = ["--explore", "--redact-pattern", "Vio[a-z]+", "-e", f"MEMORY_FILE_PATH={graph}"]
    await run_script(proxy_stdio(db, "memory", memory, *options), [step("search_nodes", query="Violin")])
    store = Store(db)
    # No variant asked: only the call itself again (the read-only check), redacted the same way.
    assert {r.origin: r.arguments for r in store.recordings()} == {
        Origin.LIVE: {"query": "[REDACTED]"},
        Origin.EXPLORE: {"query": "[REDACTED]"},
    }
    store.close()
    assert all(b"VIOLIN" not in f.read_bytes() for f in tmp_path.glob("r.db*"))


# -- effect probes ------------------------------------------------------------------------------

COUNTER = [PYTHON, ROOT / "fixtures" / "counter_server.py"]
_LISTING = {
    "tools": [
        {"name": "get", "inputSchema": {}, "annotations": {"readOnlyHint": True}},
        {"name": "sum", "inputSchema": {}},
        {"name": "rm", "inputSchema": {}, "annotations": {"readOnlyHint": False}},
    ]
}


def _answer(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}]}


def test_a_probe_asks_related_earlier_reads_first_and_the_call_itself_only_when_harmless() -> None:
    probes = EffectProbes(reads=2)
    probes.declare(tool_schemas(_LISTING))
    for name, arguments, answer in [
        ("get", {"key": "a"}, "1"),
        ("get", {"key": "b"}, "2"),
        ("get", {"key": "c"}, "3"),
        ("sum", {"values": [1, 2], "key": "a"}, "3"),
    ]:
        probes.observe("s", "tools/call", {"name": name, "arguments": arguments}, _answer(answer), None)
    # Not the unknown tool again (it may be a write); "a" first (shared), then the latest.
    planned = probes.plan("s", "sum", {"values": [1, 2], "key": "a"})
    assert [p.params["arguments"] for p in planned] == [{"key": "a"}, {"key": "c"}]
    # A read-only tool: the call itself first (is the hint true?), then earlier reads of others.
    probes.observe("s", "tools/call", {"name": "get", "arguments": {"key": "c"}}, _answer("3"), None)
    assert [p.params["arguments"] for p in probes.plan("s", "get", {"key": "c"})] == [{"key": "c"}]
    # A tool annotated as writing is settled: never probed.
    probes.observe("s", "tools/call", {"name": "rm", "arguments": {"key": "a"}}, _answer("ok"), None)
    assert probes.plan("s", "rm", {"key": "a"}) == []


def test_probing_stops_once_the_answers_settle_a_tool_or_the_budget_is_spent() -> None:
    probes = EffectProbes(budget=5)
    probes.declare(tool_schemas(_LISTING))
    rounds = 0
    for n in range(10):
        probes.observe("s", "tools/call", {"name": "get", "arguments": {"key": "a"}}, _answer("1"), None)
        probes.observe("s", "tools/call", {"name": "sum", "arguments": {"n": n}}, _answer(str(n)), None)
        planned = probes.plan("s", "sum", {"n": n})
        if not planned:
            break
        for probe in planned:  # the read is unchanged every time
            probes.observe("s", probe.method, probe.params, _answer("1"), None, explored=True)
        probes.probed("sum")
        rounds += 1
    assert rounds == 2 and probes.read_only("sum")  # two different calls seen to change nothing
    probes = EffectProbes(budget=1)
    probes.declare(tool_schemas(_LISTING))
    probes.observe("s", "tools/call", {"name": "get", "arguments": {"key": "a"}}, _answer("1"), None)
    probes.observe("s", "tools/call", {"name": "sum", "arguments": {"n": 1}}, _answer("1"), None)
    probes.probed("sum")
    assert probes.plan("s", "sum", {"n": 2}) == []


@pytest.mark.slow
@pytest.mark.anyio
async def test_effect_probes_show_a_pure_tool_a_write_and_a_read_only_hint_that_lies(tmp_path: Path) -> None:
    script = [
        step("get", key="a"),
        step("double", x=2),
        step("double", x=5),
        step("put", key="a", value="1"),
        step("get", key="a"),
        step("tally", text="hi"),
        step("tally", text="ho"),
        step("double", x=7),
    ]
    db = tmp_path / "r.db"
    proxied = await run_script(proxy_stdio(db, "counter", COUNTER, "--explore"), script)
    direct = await run_script(stdio(*COUNTER), script)
    # Exploring changes nothing the client sees — but for the tool whose read-only hint lies: the
    # one repeat that showed it keeps state shifted its later answers (#3 instead of #2).
    assert [a for a, (_, p) in zip(proxied, script, strict=True) if p["name"] != "tally"] == [
        a for a, (_, p) in zip(direct, script, strict=True) if p["name"] != "tally"
    ]
    store = Store(db)
    explored = [r for r in store.recordings() if r.origin == Origin.EXPLORE]
    assert "put" not in {r.name for r in explored}  # a call of unknown effect is never repeated
    assert [r.arguments for r in explored if r.name == "tally"] == [{"text": "hi"}]  # once, then settled
    resolver = Resolver(store, index_dir=None, semantic=False)
    effects = resolver.lookup.effects("counter")
    assert {tool: v.effect for tool, v in effects.items()} == {
        "double": Effect.NONE,
        "get": Effect.NONE,
        "put": Effect.CHANGES,
        "read": Effect.NONE,  # listed, annotated read-only, never called
        "sql": Effect.NONE,
        "tally": Effect.CHANGES,
    }
    assert effects["put"].describe().startswith("changes: get before/after differed (recordings ")
    assert effects["double"].source == "evidence" and effects["double"].shown >= 2

    def episode(*calls: tuple[str, dict[str, Any]]) -> list[tuple[Tier, str | None]]:
        trail = resolver.lookup.trail([])
        out = []
        for method, params in calls:
            found = resolver.resolve("counter", method, params, trail)
            resolver.advance(trail, found)
            rec = found.recording
            out.append((found.tier, None if rec is None else rec.result["content"][0]["text"]))  # type: ignore[index]
        return out

    # A pure call recorded mid-session is an exact hit from the initial state (it was a miss), and
    # does not change the episode's state; a read after the recorded write gets the written value.
    assert episode(step("double", x=5), step("get", key="a")) == [
        (Tier.EXACT, "10"),
        (Tier.EXACT, "(unset)"),
    ]
    assert episode(step("put", key="a", value="1"), step("get", key="a")) == [
        (Tier.EXACT, "ok"),
        (Tier.EXACT, "1"),
    ]
    store.close()


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_plain_recording_shows_a_read_only_hint_that_lies_and_replay_stops_trusting_it(
    tmp_path: Path,
) -> None:
    script = [step("tally", text="a"), step("tally", text="b"), step("tally", text="a")]
    db = tmp_path / "r.db"
    await run_script(proxy_stdio(db, "counter", COUNTER), script)  # no exploring
    store = Store(db)
    resolver = Resolver(store, index_dir=None, semantic=False)
    assert resolver.lookup.effect("counter", "tally").effect is Effect.CHANGES
    # What the real server answers from the initial state; the recording of each call from
    # another point of the session must not be served.
    truth = await run_script(stdio(*COUNTER), [step("tally", text="b")])
    assert truth[0]["content"][0]["text"] == "#1 b"
    found = resolver.resolve("counter", *step("tally", text="b"), [])
    assert found.tier is Tier.MISS and found.recording is None, found.reason
    store.close()


# -- exploring after the fact (replay-sim explore) ----------------------------------------------


@pytest.mark.slow
@pytest.mark.anyio
async def test_exploring_a_plain_recording_afterwards_learns_what_the_server_ignores_and_remembers_it(
    tmp_path: Path,
) -> None:
    graph, seed = tmp_path / "memory.jsonl", tmp_path / "seed.jsonl"
    seed.write_text("".join(json.dumps(e) + "\n" for e in _GRAPH))
    graph.write_bytes(seed.read_bytes())
    memory = str(NODE_BIN / "mcp-server-memory")
    script = [
        *[step("search_nodes", query=q) for q in ["Alice", "quantum", "Acme", "violin"]],
        step("create_entities", entities=[{"name": "Carol", "entityType": "person", "observations": []}]),
        step("search_nodes", query="Carol"),  # after a write: not at the initial state
    ]
    db = tmp_path / "r.db"
    await run_script(proxy_stdio(db, "memory", [memory], "-e", f"MEMORY_FILE_PATH={graph}"), script)
    store = Store(db)
    resolver = Resolver(store, index_dir=None, semantic=False)
    assert resolver.resolve("memory", *step("search_nodes", query="aCmE"), []).tier is Tier.MISS

    # The recording left Carol in the memory file: the reset puts the recorded initial state back.
    spec = UpstreamSpec(command=memory, env={"MEMORY_FILE_PATH": str(graph)}, reset=f"cp {seed} {graph}")
    config = RecorderConfig({"memory": spec})
    effects = resolver.lookup.effects("memory")

    def read_only(server: str, tool: str) -> bool:
        return effects[tool].effect is Effect.NONE

    report = await explore_store(store, config, read_only)
    assert (report.considered, report.problems) == (4, [])
    explored = [r for r in store.recordings() if r.origin == Origin.EXPLORE]
    assert {r.name for r in explored} == {"search_nodes"}
    assert "Carol" not in {r.arguments.get("query") for r in explored}  # not from the initial state
    assert report.asked == len(explored)

    # Replay now answers what the server ignores (case), exactly as the server would.
    graph.write_bytes(seed.read_bytes())
    truth = await run_script(
        stdio(memory, env={"MEMORY_FILE_PATH": str(graph)}), [step("search_nodes", query="aCmE")]
    )
    resolver = Resolver(store, index_dir=None, semantic=False)
    found = resolver.resolve("memory", *step("search_nodes", query="aCmE"), [])
    assert found.tier is Tier.CANONICAL, found.reason
    assert answer_text(found.recording.result, None) == answer_text(truth[0], None)  # type: ignore[union-attr]

    # What is settled belongs to the store: a second run asks nothing settled again.
    again = await explore_store(store, config, read_only)
    assert again.asked == 0 and again.explored == 0 and again.settled == again.considered == 4
    # And neither does a recorder exploring the same store later (its budget counts these calls).
    explorer = Explorer()
    assert explorer.resume(store, "memory") > 0
    tool = explorer.tools["search_nodes"]
    assert explorer.variants("search_nodes", {"query": "Bob"}, tool.input_schema) == []
    store.close()


def test_variants_follow_the_tool_schema_numbers_and_omitted_optional_arguments() -> None:
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": ["integer", "string"]},
            "sort": {"type": "string"},
            "id": {"type": "integer"},
        },
        "required": ["id"],
    }
    asked = Explorer().variants("t", {"n": 3, "sort": "name", "id": 7}, schema)
    made = {(v.argument, v.transform): v.arguments for v in asked}
    assert made[("n", Transform.NUMBER)] == {"n": "3", "sort": "name", "id": 7}  # the schema allows "3"
    assert made[("sort", Transform.DEFAULT)] == {"n": 3, "id": 7}  # optional, no declared default
    assert ("id", Transform.NUMBER) not in made and ("id", Transform.DEFAULT) not in made
    assert all(Transform.NUMBER is not t for _, t in made if _ == "sort")
    assert Explorer().variants("t", {"n": 3}) == []  # no schema: nothing of another type, nothing left out


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_second_record_explore_run_asks_nothing_the_store_already_settles(tmp_path: Path) -> None:
    graph = tmp_path / "memory.jsonl"
    graph.write_text("".join(json.dumps(e) + "\n" for e in _GRAPH))
    memory = [str(NODE_BIN / "mcp-server-memory")]
    options = ["--explore", "-e", f"MEMORY_FILE_PATH={graph}"]
    db = tmp_path / "r.db"
    first = [step("search_nodes", query=q) for q in ["Alice", "quantum", "Acme", "violin"]]
    await run_script(proxy_stdio(db, "memory", memory, *options), first)
    with Store(db) as store:
        asked_first = sum(r.origin == Origin.EXPLORE for r in store.recordings())
    assert asked_first >= MIN_EVIDENCE + 2  # case agreed three times, whitespace refuted at once

    await run_script(proxy_stdio(db, "memory", memory, *options), [step("search_nodes", query="Bob")])
    with Store(db) as store:
        last = store.recordings()[-1].session
        second = [r.arguments for r in store.recordings(session=last) if r.origin == Origin.EXPLORE]
    assert {"query": "BOB"} not in second and {"query": " Bob \n"} not in second  # settled in the first run
