"""Which embedder: an index is queried with the model it was built with, or not at all."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from resolver_helpers import demo_store

from replay_sim.errors import VectorIndexError
from replay_sim.resolve.build import build_index
from replay_sim.resolve.embedders import EMBEDDINGS, embedder_for, index_embedder
from replay_sim.resolve.embedding import DEFAULT_MODEL_ID, CachedEmbedder, SentenceTransformerEmbedder
from replay_sim.resolve.index import IndexSet
from replay_sim.resolve.resolver import Resolver
from replay_sim.resolve.static_embedding import STATIC_MODEL_ID, StaticEmbedder


def test_a_resolver_embeds_queries_with_the_model_its_index_names(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    store = demo_store(tmp_path / "r.db")
    assert Resolver(store, index_dir=tmp_path / "index").embedder.model_id == DEFAULT_MODEL_ID  # no index yet
    build_index(store, embedder=CachedEmbedder(StaticEmbedder(embedder), store), directory=tmp_path / "index")
    assert IndexSet.load(tmp_path / "index").model_id == STATIC_MODEL_ID
    resolver = Resolver(store, index_dir=tmp_path / "index", auto_index=False)
    assert resolver.embedder.model_id == STATIC_MODEL_ID
    assert resolver.index().model_id == STATIC_MODEL_ID  # served, not refused nor rebuilt


def test_an_index_served_with_another_model_than_its_own_is_a_clear_error(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    store = demo_store(tmp_path / "r.db")
    build_index(store, embedder=CachedEmbedder(StaticEmbedder(embedder), store), directory=tmp_path / "index")
    resolver = Resolver(store, index_dir=tmp_path / "index", embedder=embedder, auto_index=False)
    said = f"built with embedding model '{re.escape(STATIC_MODEL_ID)}'.*index build --embedding"
    with pytest.raises(VectorIndexError, match=said):
        resolver.index()


def test_an_index_naming_a_model_replay_sim_does_not_know_is_a_clear_error(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    store = demo_store(tmp_path / "r.db")
    build_index(store, embedder=CachedEmbedder(embedder, store), directory=tmp_path / "index")
    manifest = tmp_path / "index" / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "model": "someone/else"}))
    with pytest.raises(VectorIndexError, match=r"no embedding model 'someone/else'.*minilm-static"):
        index_embedder(tmp_path / "index")


def test_every_named_embedding_has_its_own_model_id(embedder: SentenceTransformerEmbedder) -> None:
    models = {name: embedder_for(model_id) for name, model_id in EMBEDDINGS.items()}
    assert {name: m.model_id for name, m in models.items()} == EMBEDDINGS
    assert len(set(EMBEDDINGS.values())) == len(EMBEDDINGS)
