"""The resolver's tiers, state-aware choice and near-miss diagnostics (table-driven where it can be)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from resolver_helpers import (
    TOOLS,
    call,
    demo_store,
)

from replay_sim.resolve.calibration import MatchConfig
from replay_sim.resolve.embedding import SentenceTransformerEmbedder
from replay_sim.resolve.lineage import Trail
from replay_sim.resolve.resolution import Problem, Tier
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Store

REPO = "/srv/repo"


def with_calibration_evidence(store: Store) -> Store:
    """Two close questions with other answers: the evidence that calibrates search's threshold.

    (cosines to "how do I reset my password": 0.877 and 0.889, to each other 0.818; the threshold
    becomes 0.909 with three conflicting pairs within 0.1 below it.)
    """
    call(store, "search", {"query": "how do I change my password", "repo_path": REPO}, "Under Security.")
    call(store, "search", {"query": "how do I recover my password", "repo_path": REPO}, "By email.")
    return store


@pytest.fixture(scope="module")
def resolver(tmp_path_factory: pytest.TempPathFactory, embedder: SentenceTransformerEmbedder) -> Resolver:
    folder = tmp_path_factory.mktemp("resolver")
    store = with_calibration_evidence(demo_store(folder / "r.db"))
    return Resolver(store, embedder=embedder, index_dir=folder / "index")


def search(query: str, **extra: Any) -> dict[str, Any]:
    return {"name": "search", "arguments": {"query": query, "repo_path": REPO, **extra}}


@pytest.mark.parametrize(
    ("params", "tier", "answer"),
    [
        (search("how do I reset my password"), Tier.EXACT, "Reset it under Settings."),
        (
            {"arguments": {"repo_path": REPO, "query": "where is my order"}, "name": "search"},
            Tier.EXACT,
            "Track it under Orders.",
        ),
        (search("where is my order", limit=5), Tier.CANONICAL, "Track it under Orders."),
        (search("where is my order", limit=5.0), Tier.CANONICAL, "Track it under Orders."),
        (search("where is my order", since=None), Tier.CANONICAL, "Track it under Orders."),
        (search("  where is my order \n"), Tier.CANONICAL, "Track it under Orders."),
        (search("How do I reset my password?"), Tier.SEMANTIC, "Reset it under Settings."),
        (search("how can I reset my password"), Tier.SEMANTIC, "Reset it under Settings."),
        (search("where is my order", limit=6), Tier.MISS, None),  # a different number
        (
            {"name": "search", "arguments": {"query": "where is my order", "repo_path": REPO + "/"}},
            Tier.MISS,
            None,
        ),
        (search("banana bread recipe"), Tier.MISS, None),
        (search("what is the refund policy for orders"), Tier.MISS, None),
        ({"name": "echo", "arguments": {"message": "hello world"}}, Tier.EXACT, "Echo: hello world"),
        ({"name": "echo", "arguments": {"message": "Hello world"}}, Tier.MISS, None),  # echoed text is exact
        ({"name": "echo", "arguments": {"message": " hello world"}}, Tier.MISS, None),
        ({"name": "read_file", "arguments": {"path": "/a.txt"}}, Tier.EXACT, "one"),
    ],
)
def test_each_call_is_answered_by_the_right_tier(
    resolver: Resolver, params: dict[str, Any], tier: Tier, answer: str | None
) -> None:
    found = resolver.resolve("demo", "tools/call", params, [])
    assert found.tier is tier, found.reason
    assert found.hit is (answer is not None)
    if answer is not None:
        assert found.recording is not None and found.recording.result["content"][0]["text"] == answer
        assert tier is not Tier.SEMANTIC or 0.9 <= found.score < 1.0


@pytest.mark.parametrize(
    ("server", "params", "problem", "words"),
    [
        ("demo", {"name": "nope", "arguments": {}}, Problem.UNKNOWN_TOOL, "unknown tool 'nope'"),
        ("ghost", {"name": "nope", "arguments": {}}, Problem.UNKNOWN_TOOL, "no recorded tools/list"),
        ("demo", {"name": "search", "arguments": "query=x"}, Problem.INVALID_ARGUMENTS, "JSON object"),
        ("demo", {"name": "search", "arguments": ["x"]}, Problem.INVALID_ARGUMENTS, "JSON object"),
        ("demo", "not params", Problem.INVALID_ARGUMENTS, "params"),
        (
            "demo",
            {"name": "search", "arguments": {"query": 3, "repo_path": REPO}},
            Problem.INVALID_ARGUMENTS,
            "inputSchema",
        ),
        (
            "demo",
            {"name": "search", "arguments": {"query": float("nan"), "repo_path": REPO}},
            Problem.INVALID_ARGUMENTS,
            "JSON",
        ),
        (
            "demo",
            {"name": "write_file", "arguments": {"path": "/a", "content": "x", "extra": 1}},
            Problem.INVALID_ARGUMENTS,
            "extra",
        ),
    ],
)
def test_structural_misses_say_why(
    resolver: Resolver, server: str, params: Any, problem: Problem, words: str
) -> None:
    found = resolver.resolve(server, "tools/call", params, [])
    assert found.tier is Tier.MISS and found.problem is problem
    assert words in found.reason


def test_a_miss_lists_the_three_nearest_recordings_and_the_fields_that_differ(resolver: Resolver) -> None:
    found = resolver.resolve(
        "demo",
        "tools/call",
        {"name": "search", "arguments": {"query": "where is my order", "repo_path": "/srv/x"}},
    )
    assert found.tier is Tier.MISS and len(found.candidates) == 3
    best = found.candidates[0]
    assert best.score >= found.candidates[1].score >= found.candidates[2].score
    diffs = {d.name: (d.recorded, d.requested) for d in best.differences}
    assert diffs == {"repo_path": (REPO, "/srv/x")}


def test_enormous_free_text_never_crashes_and_never_matches_by_meaning(resolver: Resolver) -> None:
    huge = "how do I reset my password " * 100_000
    found = resolver.resolve("demo", "tools/call", search(huge), [])
    assert found.tier is Tier.MISS
    assert all(len(str(d.requested)) < 300 for c in found.candidates for d in c.differences)


def test_resources_and_prompts_are_exact_only(resolver: Resolver) -> None:
    found = resolver.resolve("demo", "resources/read", {"uri": "file:///nowhere"}, [])
    assert found.tier is Tier.MISS and "exact match only" in found.reason


def test_reads_are_answered_from_the_state_the_episode_is_in(resolver: Resolver) -> None:
    read = {"name": "read_file", "arguments": {"path": "/a.txt"}}
    write = {"name": "write_file", "arguments": {"path": "/a.txt", "content": "two"}}
    history: list[str] = []
    first = resolver.resolve("demo", "tools/call", read, history)
    assert first.recording is not None and first.recording.result["content"][0]["text"] == "one"
    history.append(first.step)
    wrote = resolver.resolve("demo", "tools/call", write, history)
    assert wrote.tier is Tier.EXACT
    history.append(wrote.step)
    after = resolver.resolve("demo", "tools/call", read, history)
    assert after.recording is not None and after.recording.result["content"][0]["text"] == "two"


def test_after_an_unrecorded_write_every_later_call_misses(resolver: Resolver) -> None:
    novel = resolver.resolve(
        "demo", "tools/call", {"name": "write_file", "arguments": {"path": "/a.txt", "content": "three"}}, []
    )
    assert novel.tier is Tier.MISS
    later = resolver.resolve(
        "demo", "tools/call", {"name": "read_file", "arguments": {"path": "/a.txt"}}, [novel.step]
    )
    assert later.tier is Tier.MISS and later.problem is Problem.DIVERGED


def test_interleaved_episodes_do_not_change_each_others_answers(resolver: Resolver) -> None:
    read = {"name": "read_file", "arguments": {"path": "/a.txt"}}
    write = {"name": "write_file", "arguments": {"path": "/a.txt", "content": "two"}}
    novel = {"name": "write_file", "arguments": {"path": "/a.txt", "content": "three"}}
    plan = {"a": [write, read], "b": [novel, read]}

    def run(order: list[str]) -> dict[str, list[str]]:
        trails = {name: Trail() for name in plan}
        out: dict[str, list[str]] = {name: [] for name in plan}
        for name in order:
            params = plan[name][len(out[name])]
            found = resolver.resolve("demo", "tools/call", params, trails[name])
            resolver.advance(trails[name], found)
            out[name].append(
                found.tier if found.recording is None else found.recording.result["content"][0]["text"]
            )
        return out

    alone = run(["a", "a", "b", "b"])
    assert alone == {"a": ["Successfully wrote /a.txt", "two"], "b": [Tier.MISS, Tier.MISS]}
    assert run(["b", "a", "b", "a"]) == alone


def test_a_read_recorded_only_after_a_write_is_not_served_from_the_initial_state(tmp_path: Path) -> None:
    store = Store(tmp_path / "r.db")
    store.put_listing("demo", "tools/list", {"tools": TOOLS})
    call(store, "write_file", {"path": "/b", "content": "x"}, "ok", session="w")
    call(store, "read_file", {"path": "/b"}, "x", session="w")
    found = Resolver(store, index_dir=None, semantic=False).resolve(
        "demo", "tools/call", {"name": "read_file", "arguments": {"path": "/b"}}, []
    )
    assert found.tier is Tier.MISS and found.problem is Problem.OTHER_STATE


def test_new_recordings_are_seen_by_the_exact_cache(tmp_path: Path) -> None:
    store = demo_store(tmp_path / "r.db")
    resolver = Resolver(store, index_dir=None, semantic=False)
    params = {"name": "echo", "arguments": {"message": "late"}}
    assert resolver.resolve("demo", "tools/call", params, []).tier is Tier.MISS
    call(store, "echo", {"message": "late"}, "Echo: late")
    assert resolver.resolve("demo", "tools/call", params, []).tier is Tier.EXACT


def test_config_overrides_turn_the_semantic_tier_off_for_one_tool(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    path = tmp_path / "replay-sim.toml"
    path.write_text('[defaults]\nfloor = 0.5\n\n[tools."demo/search"]\nsemantic = false\n')
    config = MatchConfig.load(path)
    assert config.floor == 0.5
    resolver = Resolver(demo_store(tmp_path / "r.db"), config=config, embedder=embedder, index_dir=None)
    assert resolver.resolve("demo", "tools/call", search("how can I reset my password"), []).tier is Tier.MISS


def test_the_threshold_sits_above_the_closest_recorded_pair_with_different_results(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    store = demo_store(tmp_path / "r.db")
    call(store, "search", {"query": "how do I reset my password?", "repo_path": REPO}, "A different answer.")
    resolver = Resolver(store, embedder=embedder, index_dir=None)
    found = resolver.resolve("demo", "tools/call", search("how can I reset my password"), [])
    state = resolver.tool_states.kept("demo", "search")
    assert state is not None
    assert state.conflict is not None and state.conflict > 0.95
    assert state.threshold(resolver.index()) > state.conflict
    assert found.tier is Tier.MISS or found.score > state.conflict


# -- refusals the dev probe analysis relies on (fixtures/probes/README.md, "needless misses") -------

_RO = {"readOnlyHint": True}
_REFUSAL_TOOLS = [
    *TOOLS,
    {
        "name": "find",
        "inputSchema": {"type": "object", "properties": {"query": {"type": "string"}}},
        "annotations": _RO,
    },
    {
        "name": "open",
        "inputSchema": {
            "type": "object",
            "properties": {"names": {"type": "array", "items": {"type": "string"}}},
        },
        "annotations": _RO,
    },
    {
        "name": "log",
        "inputSchema": {"type": "object", "properties": {"max_count": {"type": "integer", "default": 10}}},
        "annotations": _RO,
    },
    *[
        {
            "name": name,
            "inputSchema": {"type": "object", "properties": {"branch_name": {"type": "string"}}},
            "annotations": {"readOnlyHint": False},
        }
        for name in ("create_branch", "checkout")
    ],
]


@pytest.fixture(scope="module")
def refusals(tmp_path_factory: pytest.TempPathFactory, embedder: SentenceTransformerEmbedder) -> Resolver:
    store = Store(tmp_path_factory.mktemp("refusals") / "r.db")
    store.put_listing("demo", "tools/list", {"tools": _REFUSAL_TOOLS})
    for query, answer in [
        ("Alice", "Alice: person"),
        ("chess", "Alice: likes chess"),
        ("quantum", "nothing"),
    ]:
        call(store, "find", {"query": query}, answer)  # results echo the query: it is an identifier
    call(store, "open", {"names": ["Alice", "Bob"]}, "Alice, Bob")
    call(store, "log", {}, "3 commits")
    call(store, "read_file", {"path": "/a.txt"}, "one")
    call(store, "write_file", {"path": "/new.txt", "content": "fresh"}, "Wrote /new.txt", session="w")
    call(store, "create_branch", {"branch_name": "topic"}, "Created topic", session="b")
    call(store, "checkout", {"branch_name": "feature"}, "Switched to feature", session="b")
    return Resolver(store, embedder=embedder, index_dir=None)


def _step(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


@pytest.mark.parametrize(
    ("steps", "problem"),
    [
        # No recorded pair shows that the echoed query ignores case or whitespace: no assumption.
        ([_step("find", query="alice")], None),
        ([_step("find", query="CHESS")], None),
        ([_step("find", query="  Alice ")], None),
        ([_step("find", query="quantum\n")], None),
        # A list of names in another order is another call (order matters to other tools).
        ([_step("open", names=["Bob", "Alice"])], None),
        # max_count 20 may equal the default's answer on a short history, but nothing says so.
        ([_step("log", max_count=20)], None),
        # A server may coerce "3" to 3; the schema says integer, so no recording answers it.
        ([_step("log", max_count="3")], Problem.INVALID_ARGUMENTS),
        # A read recorded only from the initial state is not served after an unrelated write.
        (
            [_step("write_file", path="/new.txt", content="fresh"), _step("read_file", path="/a.txt")],
            Problem.OTHER_STATE,
        ),
        # Nor is a write recorded only after another write served from the initial state.
        ([_step("checkout", branch_name="feature")], Problem.OTHER_STATE),
        # A write with other content is a different write: the next read's state is unknown.
        (
            [_step("write_file", path="/new.txt", content="fresh "), _step("read_file", path="/a.txt")],
            Problem.DIVERGED,
        ),
    ],
)
def test_calls_no_sound_rule_can_answer_are_refused(
    refusals: Resolver, steps: list[dict[str, Any]], problem: Problem | None
) -> None:
    history: list[str] = []
    for params in steps[:-1]:
        history.append(refusals.resolve("demo", "tools/call", params, history).step)
    found = refusals.resolve("demo", "tools/call", steps[-1], history)
    assert found.tier is Tier.MISS, found.reason
    assert found.problem is problem


def test_warm_builds_the_index_and_loads_the_model_before_the_first_call(tmp_path: Path) -> None:
    model = SentenceTransformerEmbedder()
    resolver = Resolver(demo_store(tmp_path / "r.db"), embedder=model, index_dir=tmp_path / "index")
    assert model._model is None and not (tmp_path / "index" / "manifest.json").exists()
    resolver.warm()
    assert model._model is not None and (tmp_path / "index" / "manifest.json").exists()


def test_warm_loads_no_model_when_a_sandbox_answers_every_recorded_server(tmp_path: Path) -> None:
    """Their calls are answered exactly or by the sandbox, never by a guess: the index and the model
    (seconds of CPU a replay's start used to spend beside its first answers) load only if asked."""
    model = SentenceTransformerEmbedder()
    resolver = Resolver(demo_store(tmp_path / "r.db"), embedder=model, index_dir=tmp_path / "index")
    resolver.lookup.answer_strictly({"demo"})
    resolver.warm()
    assert model._model is None and not (tmp_path / "index" / "manifest.json").exists()
    fresh = Resolver(demo_store(tmp_path / "s.db"), embedder=model, index_dir=tmp_path / "index")
    fresh.warm()  # no sandbox answers its server: warmed as before
    assert model._model is not None


def test_warm_loads_no_model_when_no_tool_call_was_recorded(tmp_path: Path) -> None:
    store = Store(tmp_path / "r.db")
    store.put_listing("demo", "tools/list", {"tools": TOOLS})
    store.record_call("demo", "resources/read", {"uri": "file:///a"}, result={"contents": []})
    model = SentenceTransformerEmbedder()
    Resolver(store, embedder=model, index_dir=tmp_path / "index").warm()
    assert model._model is None


# -- code-like free text and calibration evidence (issue 14, cause 4) ------------------------------


def test_free_text_shaped_like_code_is_never_matched_by_meaning(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    store = with_calibration_evidence(demo_store(tmp_path / "r.db"))  # search is calibrated for prose
    sql = "SELECT name FROM products ORDER BY price ASC"
    call(store, "search", {"query": sql, "repo_path": REPO}, "Doohickey, Widget")
    resolver = Resolver(store, embedder=embedder, index_dir=None)
    # DESC scores 0.92 against ASC and the real answer is reversed; lower case scores 1.0.
    for query in ("SELECT name FROM products ORDER BY price DESC", sql.lower()):
        found = resolver.resolve("demo", "tools/call", search(query), [])
        assert found.tier is Tier.MISS and "shaped like code" in found.reason, found.reason
    assert (
        resolver.resolve("demo", "tools/call", search("How do I reset my password?"), []).tier
        is Tier.SEMANTIC
    )


def test_a_tool_without_recorded_evidence_near_its_threshold_is_not_compared_by_meaning(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    store = demo_store(tmp_path / "r.db")  # three unrelated questions: nothing near 0.9
    found = Resolver(store, embedder=embedder, index_dir=None).resolve(
        "demo", "tools/call", search("How do I reset my password?"), []
    )
    assert found.tier is Tier.MISS
    assert "no recorded evidence to calibrate search's threshold" in found.reason
    # An operator who fixes the threshold takes that judgement on: it is used as is.
    config = MatchConfig.from_dict({"tools": {"demo/search": {"threshold": 0.95}}})
    fixed = Resolver(store, config=config, embedder=embedder, index_dir=None)
    assert (
        fixed.resolve("demo", "tools/call", search("How do I reset my password?"), []).tier is Tier.SEMANTIC
    )
