"""The faiss index: partitions, persistence, staleness and incremental updates."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from resolver_helpers import (
    call,
    demo_store,
)

from replay_sim.errors import IndexError_
from replay_sim.resolve.embedding import CachedEmbedder, SentenceTransformerEmbedder
from replay_sim.resolve.index import FaissIndex, IndexSet, build_index, call_text
from replay_sim.resolve.resolver import Resolver
from replay_sim.store import Store


def _build(store: Store, folder: Path, model: SentenceTransformerEmbedder) -> tuple[IndexSet, CachedEmbedder]:
    cached = CachedEmbedder(model, store)
    return build_index(store, Resolver(store).tool_schema, cached, folder), cached


def test_one_partition_per_tool_is_persisted_with_a_manifest(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    store = demo_store(tmp_path / "r.db")
    index, _ = _build(store, tmp_path / "index", embedder)
    manifest = json.loads((tmp_path / "index" / "manifest.json").read_text())
    assert manifest["fingerprint"] == store.fingerprint()
    assert {(p["server"], p["tool"]) for p in manifest["partitions"]} == {
        ("demo", "search"), ("demo", "echo"), ("demo", "read_file"), ("demo", "write_file")
    }  # fmt: skip
    assert len(index.partition("demo", "search") or []) == 4
    loaded = IndexSet.load(tmp_path / "index")
    assert loaded.is_current(store)
    assert {k: len(p) for k, p in loaded.partitions.items()} == {
        k: len(p) for k, p in index.partitions.items()
    }


def test_a_stale_index_is_updated_incrementally(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    store = demo_store(tmp_path / "r.db")
    _build(store, tmp_path / "index", embedder)
    call(
        store,
        "search",
        {"query": "cancel my subscription", "repo_path": "/srv/repo"},
        "Cancel under Billing.",
    )
    assert not IndexSet.load(tmp_path / "index").is_current(store)
    index, cached = _build(store, tmp_path / "index", embedder)
    assert cached.encoded + cached.reused == 1  # only the new recording was looked at
    assert len(index.partition("demo", "search") or []) == 5
    assert IndexSet.load(tmp_path / "index").is_current(store)


def test_an_index_of_another_store_is_rebuilt_not_extended(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    _build(demo_store(tmp_path / "a.db"), tmp_path / "index", embedder)
    other = Store(tmp_path / "b.db")
    other.put_listing("demo", "tools/list", {"tools": []})
    call(other, "echo", {"message": "solo"}, "Echo: solo")
    index, _ = _build(other, tmp_path / "index", embedder)
    assert {k: len(p) for k, p in index.partitions.items()} == {("demo", "echo"): 1}


def test_a_missing_index_or_partition_is_a_clear_error(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    with pytest.raises(IndexError_, match="replay-sim index build"):
        IndexSet.load(tmp_path / "nowhere")
    store = demo_store(tmp_path / "r.db")
    _build(store, tmp_path / "index", embedder)
    next((tmp_path / "index").glob("*.faiss")).unlink()
    with pytest.raises(IndexError_, match="missing"):
        IndexSet.load(tmp_path / "index")
    resolver = Resolver(store, index_dir=tmp_path / "index", auto_index=False)
    with pytest.raises(IndexError_):
        resolver.index()


def test_partitions_switch_to_hnsw_above_the_threshold_and_still_find_neighbours() -> None:
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(300, 32)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    part = FaissIndex(32, hnsw_threshold=100)
    part.add(np.arange(1, 201), vectors[:200])
    assert part.kind == "hnsw"
    part.add(np.arange(201, 301), vectors[200:])
    assert len(part) == 300
    assert part.search(vectors[250], 1)[0][0] == 251
    allowed = [5, 9, 77]
    found = part.search(vectors[8], 3, allowed)
    assert found[0][0] == 9 and {i for i, _ in found} == set(allowed)


def test_call_text_is_the_free_text_or_else_the_canonical_arguments() -> None:
    assert call_text({"query": "  hi ", "limit": 3}, ["query"]) == "hi"
    assert call_text({"b": 1, "a": 2}, []) == '{"a":2,"b":1}'
