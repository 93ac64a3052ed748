"""The fast path: ready at once, and nothing on the hot path that grows with the store (issue 12)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from resolver_helpers import REPO, GatedEmbedder, calibrated_store, call, search

import replay_sim.resolve.toolstate as toolstate
from replay_sim.errors import VectorIndexError
from replay_sim.replay.core.replay import Replay
from replay_sim.resolve.embedding import SentenceTransformerEmbedder
from replay_sim.resolve.resolution import Tier
from replay_sim.resolve.resolver import Resolver
from replay_sim.resolve.vectors import FaissIndex
from replay_sim.store import Store


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _run(code: str, cwd: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_replay_sim_imports_neither_torch_nor_sentence_transformers(tmp_path: Path) -> None:
    loaded = _run(
        "import json, sys, replay_sim\n"
        "heavy = ('torch', 'sentence_transformers', 'transformers')\n"
        "print(json.dumps([m for m in heavy if m in sys.modules]))",
        tmp_path,
    )
    assert loaded == []


def test_an_opened_replay_answers_an_exact_hit_without_loading_the_model(tmp_path: Path) -> None:
    calibrated_store(tmp_path / "r.db").close()
    found = _run(
        "import json, sys, anyio\n"
        "from replay_sim import open_replay\n"
        f"replay = open_replay({str(tmp_path / 'r.db')!r}, index_dir={str(tmp_path / 'index')!r})\n"
        "params = {'name': 'search', 'arguments': {'query': 'where is my order', 'repo_path': '/srv/repo'}}\n"
        "answer = anyio.run(replay.resolve, 'demo', 'tools/call', params, ())\n"
        "print(json.dumps([answer.resolution.tier, 'torch' in sys.modules]))",
        tmp_path,
    )
    assert found == ["exact", False]


@pytest.mark.anyio
async def test_exact_hits_are_answered_while_the_model_loads_and_a_semantic_call_waits_for_it(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    store = calibrated_store(tmp_path / "r.db")
    model = GatedEmbedder(embedder)
    replay = Replay(store, resolver=Resolver(store, embedder=model, index_dir=tmp_path / "index"))
    replay.resolver.warm(wait=False)  # as a server starts it: the index build now waits on the gate
    results: list[Tier] = []

    async def semantic() -> None:
        answer = await replay.resolve("demo", "tools/call", search("How do I reset my password?"), ())
        results.append(answer.resolution.tier)

    with anyio.fail_after(60):
        await anyio.to_thread.run_sync(model.waiting.wait)
        async with anyio.create_task_group() as tg:
            tg.start_soon(semantic)
            for query in ("where is my order", "how do I reset my password", "what is the refund policy"):
                answer = await replay.resolve("demo", "tools/call", search(query), ())
                assert answer.resolution.tier is Tier.EXACT
            assert results == [] and replay.resolver.warmup.warming  # still waiting for the model
            model.gate.set()
        assert results == [Tier.SEMANTIC]
        await anyio.to_thread.run_sync(replay.resolver.warmup.wait)


def test_a_tool_is_calibrated_once_by_its_first_call_that_needs_it_not_by_the_warm_up(
    tmp_path: Path, embedder: SentenceTransformerEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    calibrations: list[int] = []
    original = toolstate.calibrate_threshold

    def counted(*args: Any, **kwargs: Any) -> Any:
        calibrations.append(len(args[1]))
        return original(*args, **kwargs)

    monkeypatch.setattr(toolstate, "calibrate_threshold", counted)
    resolver = Resolver(calibrated_store(tmp_path / "r.db"), embedder=embedder, index_dir=tmp_path / "index")
    resolver.warm()
    assert calibrations == []  # the warm-up loads the index only
    for query in ("How do I reset my password?", "banana bread recipe", "where is my order"):
        resolver.resolve("demo", "tools/call", search(query), [])
    assert len(calibrations) == 1  # search, once (echo echoes its text, read_file has no free text)


def test_semantic_calls_neither_scan_the_calls_table_nor_write_to_the_store(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    store = calibrated_store(tmp_path / "r.db")
    resolver = Resolver(store, embedder=embedder, index_dir=tmp_path / "index")
    resolver.warm()
    resolver.resolve("demo", "tools/call", search("where is my order"), [])  # builds search's state
    cached = store.embedding_cache_size()
    assert cached > 0  # the index build caches the recordings' embeddings in the store
    statements: list[str] = []
    store.conn.set_trace_callback(statements.append)
    try:
        for query in ("How do I reset my password?", "how can I reset my password", "banana bread recipe"):
            found = resolver.resolve("demo", "tools/call", search(query), [])
            assert found.tier in (Tier.SEMANTIC, Tier.MISS)
        resolver.resolve("demo", "tools/call", search("where is my order"), [])
    finally:
        store.conn.set_trace_callback(None)
    assert statements, "the trace callback saw nothing"
    assert not [s for s in statements if "COUNT(" in s.upper()]
    assert not [s for s in statements if s.split()[0].upper() in ("INSERT", "UPDATE", "DELETE", "BEGIN")]
    assert store.embedding_cache_size() == cached


def test_calls_another_connection_adds_are_indexed_and_found(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    store = calibrated_store(tmp_path / "r.db")
    resolver = Resolver(store, embedder=embedder, index_dir=tmp_path / "index")
    resolver.warm()
    query = "can I get a discount on bulk orders"
    assert resolver.resolve("demo", "tools/call", search(query), []).tier is Tier.MISS
    with Store(tmp_path / "r.db") as recorder:  # another writer, e.g. a recorder on the same file
        call(recorder, "search", {"query": query, "repo_path": REPO}, "Ten percent off.")
    found = resolver.resolve("demo", "tools/call", search(query.capitalize() + "?"), [])
    assert found.hit and found.recording is not None
    assert found.recording.result["content"][0]["text"] == "Ten percent off."
    assert len(resolver.index().partition("demo", "search") or ()) == 7  # 6 recorded before, 1 new


def test_a_partition_scores_a_subset_from_its_array_best_first_ties_by_id() -> None:
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((50, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    vectors[10] = vectors[20]  # a tie: the lower id comes first
    ids = np.arange(100, 150)
    part = FaissIndex(8)
    part.add(ids, vectors)
    query = vectors[20]
    allowed = [149, 110, 120, 101, 133]
    found = part.search(query, 5, allowed)
    expected = sorted(((i, float(vectors[i - 100] @ query)) for i in allowed), key=lambda p: (-p[1], p[0]))
    assert [i for i, _ in found] == [i for i, _ in expected]
    assert [i for i, _ in found[:2]] == [110, 120] and found[0][1] == found[1][1]
    assert [s for _, s in found] == pytest.approx([s for _, s in expected], abs=1e-6)
    assert np.array_equal(part.vectors([120, 101]), np.stack([vectors[20], vectors[1]]))
    part.add(np.array([150]), vectors[:1])  # the array is read again after an add
    assert np.array_equal(part.vectors([150]), vectors[:1])
    with pytest.raises(VectorIndexError, match=r"\[7\]"):
        part.vectors([7])
