"""The recorder asks a real server which argument differences it ignores; replay answers from that."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from recording_helpers import NODE_BIN, proxy_stdio, run_script, stdio

from replay_sim.canonical import answer_text
from replay_sim.record.explore import Explorer, Variant
from replay_sim.resolve.resolution import Tier
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Origin, Store
from replay_sim.variants import MIN_EVIDENCE, Transform


@pytest.mark.parametrize(
    ("transform", "value", "varied"),
    [
        (Transform.CASE, "Acme", "ACME"),
        (Transform.CASE, "ACME", "acme"),
        (Transform.CASE, "12:30", None),  # nothing with a case
        (Transform.SPACE, "Acme", " Acme "),
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


def _tool(name: str, **arguments: Any) -> tuple[str, dict[str, Any]]:
    return "tools/call", {"name": name, "arguments": arguments}


@pytest.mark.slow
@pytest.mark.anyio
async def test_recording_with_explore_lets_replay_answer_what_the_real_server_ignores(tmp_path: Path) -> None:
    graph = tmp_path / "memory.jsonl"

    def reset() -> None:
        graph.write_text("".join(json.dumps(e) + "\n" for e in _GRAPH))

    memory = [str(NODE_BIN / "mcp-server-memory")]
    script = [
        *[_tool("search_nodes", query=q) for q in ["Alice", "quantum", "Acme", "violin", "person"]],
        _tool("open_nodes", names=["Alice", "Bob"]),
        _tool("open_nodes", names=["Acme", "Bob"]),
        _tool("open_nodes", names=["Alice", "Bob", "Acme"]),
        _tool("create_entities", entities=[{"name": "Carol", "entityType": "person", "observations": []}]),
        _tool("search_nodes", query="Carol"),
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
    assert {"query": "ALICE"} in asked and {"query": " Alice "} in asked
    assert {"names": ["Bob", "Alice"]} in asked
    assert sum(r.arguments.get("query", "").isupper() for r in explored) <= MIN_EVIDENCE + 1

    # Replay answers variants the recordings show the server ignores, exactly as the server would.
    calls = [
        _tool("search_nodes", query="aCmE"),
        _tool("search_nodes", query="Person"),
        _tool("open_nodes", names=["Bob", "Alice", "Acme"]),
    ]
    reset()
    truth = await run_script(stdio(memory[0], env={"MEMORY_FILE_PATH": str(graph)}), calls)
    resolver = Resolver(store, index_dir=None, semantic=False)
    for (method, params), real in zip(calls, truth, strict=True):
        found = resolver.resolve("memory", method, params, [])
        assert found.tier is Tier.CANONICAL, found.reason
        assert answer_text(found.recording.result, None) == answer_text(real, None)
    # Whitespace is not ignored by this server (" Alice " finds nothing), so it is not assumed.
    assert resolver.resolve("memory", *_tool("search_nodes", query="Alice "), []).tier is Tier.MISS
    store.close()


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_secret_is_never_varied_so_no_variant_escapes_redaction(tmp_path: Path) -> None:
    graph = tmp_path / "memory.jsonl"
    graph.write_text("".join(json.dumps(e) + "\n" for e in _GRAPH))
    db = tmp_path / "r.db"
    memory = [str(NODE_BIN / "mcp-server-memory")]
    options = ["--explore", "--redact-pattern", "Vio[a-z]+", "-e", f"MEMORY_FILE_PATH={graph}"]
    await run_script(proxy_stdio(db, "memory", memory, *options), [_tool("search_nodes", query="Violin")])
    store = Store(db)
    assert [r.arguments for r in store.recordings()] == [{"query": "[REDACTED]"}]  # no variant asked
    store.close()
    assert all(b"VIOLIN" not in f.read_bytes() for f in tmp_path.glob("r.db*"))
