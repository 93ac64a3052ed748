"""Which embedder: the embeddings ``index build`` offers, and the one a persisted index was built with.

An index's manifest names the model id its vectors come from; queries must be embedded by that same
model, or their cosines against the index mean nothing. :func:`index_embedder` reads the manifest
and returns that model's embedder, so an index built with the opt-in static embedding is served
with it, and one built with the default model with the default model.
"""

from __future__ import annotations

import json
from pathlib import Path

from replay_sim.errors import VectorIndexError
from replay_sim.resolve.embedding import DEFAULT_MODEL_ID, Embedder, default_embedder
from replay_sim.resolve.index import MANIFEST
from replay_sim.resolve.static_embedding import STATIC_MODEL_ID, StaticEmbedder

__all__ = ["EMBEDDINGS", "embedder_for", "index_embedder", "index_model"]

EMBEDDINGS: dict[str, str] = {"minilm": DEFAULT_MODEL_ID, "minilm-static": STATIC_MODEL_ID}
"""The names ``index build --embedding`` takes, and the model id each one's index names.

- ``minilm``: all-MiniLM-L6-v2 itself (the default).
- ``minilm-static``: static token vectors distilled from it (:mod:`~replay_sim.resolve.static_embedding`).
"""

_STATIC: StaticEmbedder | None = None


def embedder_for(model_id: str) -> Embedder:
    """The process-wide embedder of a model id (both share the one loaded MiniLM).

    Raises:
        VectorIndexError: No embedder of this replay-sim has that id (names it and the known ones).
    """
    global _STATIC
    if model_id == DEFAULT_MODEL_ID:
        return default_embedder()
    if model_id == STATIC_MODEL_ID:
        if _STATIC is None:
            _STATIC = StaticEmbedder(default_embedder())
        return _STATIC
    known = ", ".join(f"{name} ({mid})" for name, mid in EMBEDDINGS.items())
    raise VectorIndexError(
        f"no embedding model {model_id!r} here (known: {known}); "
        "rebuild the index with `replay-sim index build --embedding NAME`"
    )


def index_model(directory: Path | None) -> str | None:
    """The model id the index in ``directory`` was built with, or None when there is none to read."""
    if directory is None:
        return None
    try:
        model = json.loads((Path(directory) / MANIFEST).read_text(encoding="utf-8")).get("model")
    except (OSError, ValueError, AttributeError):
        return None  # missing or unreadable: whoever loads the index says why
    return model if isinstance(model, str) else None


def index_embedder(directory: Path | None) -> Embedder:
    """The embedder the index in ``directory`` must be queried with (the default when there is none).

    Raises:
        VectorIndexError: The index names a model this replay-sim does not know.
    """
    return embedder_for(index_model(directory) or DEFAULT_MODEL_ID)
