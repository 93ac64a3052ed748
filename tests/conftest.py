"""Fixtures shared by the whole suite; helper functions live in the ``*_helpers`` modules beside it."""

from __future__ import annotations

import pytest

from replay_sim.resolve.embedding import SentenceTransformerEmbedder, default_embedder


@pytest.fixture(scope="session")
def embedder() -> SentenceTransformerEmbedder:
    """The real packaged MiniLM, loaded and warmed once for the whole session."""
    model = default_embedder()
    model.encode(["warm up"])
    return model
