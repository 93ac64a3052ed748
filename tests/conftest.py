"""Fixtures shared by the whole suite; helper functions live in the ``*_helpers`` modules beside it."""

from __future__ import annotations

import pytest

from replay_sim.resolve.embedding import SentenceTransformerEmbedder, default_embedder
from replay_sim.resolve.runtime import configure_runtime


def pytest_configure(config: pytest.Config) -> None:
    """The test process runs replay-sim the way its entry points do (one thread each for faiss and torch)."""
    configure_runtime()


@pytest.fixture(scope="session")
def embedder() -> SentenceTransformerEmbedder:
    """The real packaged MiniLM, loaded and warmed once for the whole session."""
    model = default_embedder()
    model.encode(["warm up"])
    return model
