"""The embedder and its store-backed cache, with the real model."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from replay_sim.resolve.embedding import CachedEmbedder, Embedder, SentenceTransformerEmbedder, text_sha
from replay_sim.store import Store


def test_the_default_model_gives_unit_vectors_closer_for_paraphrases(
    embedder: SentenceTransformerEmbedder,
) -> None:
    assert isinstance(embedder, Embedder)
    vectors = embedder.encode(["reset my password", "how can I change my password", "banana bread recipe"])
    assert vectors.shape == (3, embedder.dimension) == (3, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]


def test_nothing_is_embedded_twice_in_or_across_processes(
    tmp_path: Path, embedder: SentenceTransformerEmbedder
) -> None:
    with Store(tmp_path / "r.db") as store:
        first = CachedEmbedder(embedder, store)
        a = first.encode(["alpha", "beta", "alpha"])
        assert first.encoded == 2
        first.encode(["beta", "alpha"])
        assert first.encoded == 2
        assert set(store.cached_embeddings(embedder.model_id, [text_sha("alpha"), text_sha("beta")])) == {
            text_sha("alpha"),
            text_sha("beta"),
        }
    with Store(tmp_path / "r.db") as store:
        second = CachedEmbedder(embedder, store)  # a new process would start like this
        b = second.encode(["alpha", "beta", "gamma"])
        assert second.encoded == 1
        np.testing.assert_allclose(a[0], b[0])


def test_enormous_and_empty_texts_are_embedded_without_error(embedder: SentenceTransformerEmbedder) -> None:
    cached = CachedEmbedder(embedder)
    vectors = cached.encode(["x" * 2_000_000, "", "ünïcödé"])
    assert vectors.shape == (3, 384)
    assert cached.encode([]).shape == (0, 384)
