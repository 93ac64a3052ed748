"""Vector search: the :class:`VectorIndex` protocol and its faiss implementation.

A :class:`FaissIndex` holds (recording id, unit vector) pairs for one tool: exact inner product
(``IndexFlatIP``) while small, HNSW above ``hnsw_threshold`` vectors. Its vectors are also kept as
one array (read from faiss once, on first need), so scoring a call against some of a tool's
recordings, or calibrating its threshold, is one matrix product, not a loop. faiss reports every C++
failure as a ``RuntimeError``; :func:`translate_faiss` turns it into a
:class:`~replay_sim.errors.VectorIndexError` here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import faiss
import numpy as np

from replay_sim.errors import VectorIndexError
from replay_sim.resolve.runtime import apply_faiss_settings

apply_faiss_settings()  # faiss is imported on first need: the threads configure_runtime asked for

__all__ = ["EXACT_ALLOWED_LIMIT", "HNSW_THRESHOLD", "FaissIndex", "VectorIndex", "translate_faiss"]

HNSW_THRESHOLD = 20_000
EXACT_ALLOWED_LIMIT = 4096  # below this, a filtered search scores the allowed ids exactly


@contextmanager
def translate_faiss(
    action: str, path: Path | str | None = None, hint: str = "rebuild with `replay-sim index build`"
) -> Iterator[None]:
    """Turn a faiss failure during ``action`` into a :class:`VectorIndexError` naming ``path``."""
    try:
        yield
    except RuntimeError as exc:  # faiss raises RuntimeError for every C++ failure
        where = f"{path}: " if path else ""
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise VectorIndexError(f"{where}cannot {action}: {reason}; {hint}") from exc


class VectorIndex(Protocol):
    """A searchable set of (recording id, unit vector) pairs."""

    kind: str

    def __len__(self) -> int: ...

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Add vectors under recording ids."""
        ...

    def search(
        self, vector: np.ndarray, k: int, allowed: Collection[int] | None = None
    ) -> list[tuple[int, float]]:
        """The ``k`` nearest ids by inner product (optionally only among ``allowed``), best first."""
        ...


class FaissIndex:
    """A :class:`VectorIndex` over faiss: flat inner product, or HNSW once it is large.

    Args:
        dimension: Vector length.
        hnsw_threshold: Convert to HNSW when more vectors than this are held.
        index: An existing ``IndexIDMap2`` (when loading).
    """

    def __init__(self, dimension: int, hnsw_threshold: int = HNSW_THRESHOLD, index: Any = None) -> None:
        self.dimension = dimension
        self.hnsw_threshold = hnsw_threshold
        self.index = index if index is not None else faiss.IndexIDMap2(faiss.IndexFlatIP(dimension))
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def kind(self) -> str:
        """``flat`` or ``hnsw``."""
        return "hnsw" if isinstance(faiss.downcast_index(self.index.index), faiss.IndexHNSW) else "flat"

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Add vectors; switches a flat partition to HNSW when it crosses the threshold."""
        with translate_faiss("add vectors"):
            self._arrays = None
            self.index.add_with_ids(
                np.ascontiguousarray(vectors, dtype=np.float32), np.asarray(ids, dtype=np.int64)
            )
            if self.kind == "flat" and len(self) > self.hnsw_threshold:
                self._to_hnsw()

    def _to_hnsw(self) -> None:
        ids = faiss.vector_to_array(self.index.id_map).astype(np.int64)
        vectors = self.index.index.reconstruct_n(0, len(self))
        hnsw = faiss.IndexHNSWFlat(self.dimension, 32, faiss.METRIC_INNER_PRODUCT)
        hnsw.hnsw.efConstruction = 40
        hnsw.hnsw.efSearch = 64
        index = faiss.IndexIDMap2(hnsw)
        index.add_with_ids(vectors, ids)
        self.index = index
        self._arrays = None

    def _matrix(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(vectors in storage order, ids sorted, the row of each sorted id)``, read once per change."""
        arrays = self._arrays
        if arrays is None:
            with translate_faiss("read vectors"):
                ids = faiss.vector_to_array(self.index.id_map).astype(np.int64)
                matrix = (
                    self.index.index.reconstruct_n(0, len(ids))
                    if len(ids)
                    else np.zeros((0, self.dimension), dtype=np.float32)
                )
            order = np.argsort(ids, kind="stable")
            arrays = self._arrays = (matrix, ids[order], order)
        return arrays

    def vectors(self, ids: Collection[int]) -> np.ndarray:
        """The stored vectors of ``ids``, in the order given (each must be present).

        Raises:
            VectorIndexError: An id is not in this partition.
        """
        if not ids:
            return np.zeros((0, self.dimension))
        matrix, stored, rows = self._matrix()
        wanted = np.fromiter(ids, dtype=np.int64, count=len(ids))
        at = np.minimum(np.searchsorted(stored, wanted), max(len(stored) - 1, 0))
        if not len(stored) or not np.array_equal(stored[at], wanted):
            held = set(stored.tolist())
            absent = [int(i) for i in wanted.tolist() if i not in held][:3]
            raise VectorIndexError(
                f"cannot read vectors: recording(s) {absent} are not in the partition; "
                "rebuild with `replay-sim index build`"
            )
        return matrix[rows[at]]

    def search(
        self, vector: np.ndarray, k: int, allowed: Collection[int] | None = None
    ) -> list[tuple[int, float]]:
        """Nearest ids by cosine, best first; ties broken by lower id. Exact when ``allowed`` is small."""
        query = np.ascontiguousarray(vector, dtype=np.float32).reshape(1, -1)
        if allowed is not None:
            allowed = sorted(set(allowed))
            if not allowed:
                return []
            if len(allowed) <= EXACT_ALLOWED_LIMIT:
                scores = self.vectors(allowed) @ query[0]
                # Best first, ties by lower id (``allowed`` is sorted, and lexsort is stable).
                order = np.lexsort((np.arange(len(allowed)), -scores))[:k]
                return [(allowed[i], float(scores[i])) for i in order.tolist()]
        with translate_faiss("search"):
            params = None
            if allowed is not None:
                selector = faiss.IDSelectorBatch(np.asarray(allowed, dtype=np.int64))
                params = faiss.SearchParameters(sel=selector)  # type: ignore[call-arg]
            scores, ids = self.index.search(query, min(k, max(len(self), 1)), params=params)
        found = [(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if i >= 0]
        return sorted(found, key=lambda p: (-p[1], p[0]))

    def write(self, path: Path) -> None:
        """Persist to ``path``."""
        with translate_faiss("write partition", path, "check that the index folder is writable"):
            faiss.write_index(self.index, str(path))

    @classmethod
    def read(cls, path: Path, dimension: int, hnsw_threshold: int = HNSW_THRESHOLD) -> FaissIndex:
        """Load a partition written by :meth:`write`."""
        with translate_faiss("read partition", path):
            raw = faiss.read_index(str(path))
        return cls(dimension, hnsw_threshold, raw)
