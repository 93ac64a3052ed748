"""The opt-in static embedding: token vectors of the real model, averaged."""

from __future__ import annotations

import numpy as np

from replay_sim.resolve.embedding import Embedder, SentenceTransformerEmbedder
from replay_sim.resolve.static_embedding import STATIC_MODEL_ID, StaticEmbedder


def test_static_vectors_are_unit_vectors_closer_for_paraphrases_under_their_own_model_id(
    embedder: SentenceTransformerEmbedder,
) -> None:
    static = StaticEmbedder(embedder)
    assert isinstance(static, Embedder)
    assert static.model_id == STATIC_MODEL_ID != embedder.model_id
    vectors = static.encode(["reset my password", "how can I change my password", "banana bread recipe"])
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]


def test_a_static_vector_is_the_mean_of_what_the_model_says_of_each_token_alone(
    embedder: SentenceTransformerEmbedder,
) -> None:
    static = StaticEmbedder(embedder)
    alone = embedder.encode(["password", "reset"])  # one token each: [CLS] token [SEP] to the model
    np.testing.assert_allclose(static.encode(["password"])[0], alone[0], atol=1e-5)
    mean = alone.sum(axis=0) / np.linalg.norm(alone.sum(axis=0))
    np.testing.assert_allclose(static.encode(["reset password"])[0], mean, atol=1e-5)


def test_static_vectors_do_not_depend_on_what_was_encoded_before(
    embedder: SentenceTransformerEmbedder,
) -> None:
    texts = ['{"path":"/srv/data/notes.txt"}', "quarterly budget review", "git log of main"]
    fresh = StaticEmbedder(embedder).encode(texts)
    used = StaticEmbedder(embedder)
    used.encode(["an unrelated text that fills the token table first", "and another one"])
    np.testing.assert_allclose(used.encode(texts), fresh, atol=1e-6)


def test_enormous_empty_and_blank_texts_get_static_vectors(embedder: SentenceTransformerEmbedder) -> None:
    static = StaticEmbedder(embedder)
    vectors = static.encode(["x" * 2_000_000, "", "   ", "ünïcödé"])
    assert vectors.shape == (4, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(vectors[1], vectors[2])  # no tokens: the empty sentence's vector
    assert static.encode([]).shape == (0, 384)
