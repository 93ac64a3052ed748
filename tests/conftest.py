"""Fixtures shared by the whole suite; helper functions live in the ``*_helpers`` modules beside it."""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import settings

from replay_sim.resolve.embedding import SentenceTransformerEmbedder, default_embedder
from replay_sim.resolve.runtime import configure_runtime

settings.register_profile("ci", derandomize=True, database=None)
"""CI's property tests run the same examples every time (``HYPOTHESIS_PROFILE=ci``, set by ``.ci/run``):
a gate that passed here passes there; exploring new examples is for the runs developers make."""
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_configure(config: pytest.Config) -> None:
    """The test process runs replay-sim the way its entry points do (one thread each for faiss and torch)."""
    configure_runtime()
    # Stores' integrity stamps (replay_sim.store.verified) go to a folder of the run, not the user's.
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="replay-sim-tests-cache-")


@pytest.fixture(scope="session")
def embedder() -> SentenceTransformerEmbedder:
    """The real packaged MiniLM, loaded and warmed once for the whole session."""
    model = default_embedder()
    model.encode(["warm up"])
    return model
