"""The faiss index: partitions, persistence, staleness and incremental updates."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import faiss
import numpy as np
import pytest
from resolver_helpers import (
    call,
    demo_store,
)

from replay_sim.errors import VectorIndexError
from replay_sim.resolve.build import build_index
from replay_sim.resolve.embedding import CachedEmbedder, SentenceTransformerEmbedder
from replay_sim.resolve.index import IndexSet, call_text
from replay_sim.resolve.resolver import Resolver
from replay_sim.resolve.vectors import FaissIndex
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
    with pytest.raises(VectorIndexError, match="replay-sim index build"):
        IndexSet.load(tmp_path / "nowhere")
    store = demo_store(tmp_path / "r.db")
    _build(store, tmp_path / "index", embedder)
    next((tmp_path / "index").glob("*.faiss")).unlink()
    with pytest.raises(VectorIndexError, match="missing"):
        IndexSet.load(tmp_path / "index")
    resolver = Resolver(store, index_dir=tmp_path / "index", auto_index=False)
    with pytest.raises(VectorIndexError):
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


def test_a_build_removes_the_partition_files_its_manifest_no_longer_names(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    folder = tmp_path / "index"
    _build(demo_store(tmp_path / "a.db"), folder, embedder)
    stray = folder / ("0" * 20 + ".faiss")  # e.g. the partition of a tool the old store had
    stray.write_bytes(b"old")
    (folder / "leftover.faiss.tmp").write_bytes(b"interrupted")
    (folder / "notes.txt").write_text("not ours")
    other = Store(tmp_path / "b.db")  # another store: the index is rebuilt with one partition
    other.put_listing("demo", "tools/list", {"tools": []})
    call(other, "echo", {"message": "solo"}, "Echo: solo")
    _build(other, folder, embedder)
    manifest = json.loads((folder / "manifest.json").read_text())
    named = {p["file"] for p in manifest["partitions"]}
    assert len(named) == 1
    assert {p.name for p in folder.glob("*.faiss*")} == named
    assert (folder / "notes.txt").read_text() == "not ours"


def test_an_index_folder_that_cannot_be_written_is_a_clear_error(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    store = demo_store(tmp_path / "r.db")
    (tmp_path / "taken").write_text("a file")
    with pytest.raises(VectorIndexError, match=r"taken/index: cannot write the index"):
        _build(store, tmp_path / "taken" / "index", embedder)


def test_a_resolver_whose_index_folder_cannot_be_written_keeps_the_index_in_memory(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    store = demo_store(tmp_path / "r.db")
    (tmp_path / "taken").write_text("a file")
    resolver = Resolver(store, embedder=embedder, index_dir=tmp_path / "taken" / "index")
    assert resolver.index().is_current(store) and resolver.index().directory is None


@pytest.mark.parametrize("named", ["../../outside.faiss", "/tmp/outside.faiss", "other.faiss"])
def test_an_index_manifest_naming_another_file_than_a_partitions_own_is_refused(
    tmp_path: Path, named: str
) -> None:
    index = IndexSet(tmp_path / "index", "model", 4)
    part = FaissIndex(4)
    part.add(np.arange(1, 3), np.eye(4, dtype=np.float32)[:2])
    index.partitions[("notes", "search")] = part
    index.save()
    (tmp_path / "outside.faiss").write_bytes(next((tmp_path / "index").glob("*.faiss")).read_bytes())
    assert len(IndexSet.load(tmp_path / "index").partitions) == 1
    manifest = tmp_path / "index" / "manifest.json"
    entries = json.loads(manifest.read_text())
    entries["partitions"][0]["file"] = named
    manifest.write_text(json.dumps(entries))
    with pytest.raises(VectorIndexError, match=rf"notes/search names file '{named}', not its own"):
        IndexSet.load(tmp_path / "index")


class _Logged:
    """The real model, noting the texts of each batch it is asked to encode."""

    def __init__(self, model: SentenceTransformerEmbedder) -> None:
        self.model, self.model_id, self.dimension = model, model.model_id, model.dimension
        self.batches: list[list[str]] = []

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.batches.append(list(texts))
        return self.model.encode(texts)


def test_a_build_embeds_shortest_texts_first_and_stores_each_calls_own_vector_in_recording_order(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    store = Store(tmp_path / "r.db")
    store.put_listing("demo", "tools/list", {"tools": []})
    messages = ["a much longer message than the others, " * 3, "hi", "a medium message", "yo", "short one"]
    ids = [call(store, "echo", {"message": m}, f"Echo: {m}") for m in messages]
    logged = _Logged(embedder)
    index = build_index(store, embedder=logged, directory=tmp_path / "index", batch=2)
    lengths = [len(text) for batch in logged.batches for text in batch]
    assert lengths == sorted(lengths)  # batches pad little: the model's cost is per padded token
    part = index.partition("demo", "echo")
    assert part is not None
    stored = faiss.vector_to_array(part.index.id_map).tolist()
    assert stored == ids  # added in recording order, as before
    alone = np.stack([embedder.encode([call_text({"message": m}, ())])[0] for m in messages])
    np.testing.assert_allclose(part.vectors(ids), alone, atol=1e-5)  # the vectors do not change
