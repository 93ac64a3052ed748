"""The opt-in fast embedding: static token vectors distilled from the packaged MiniLM.

A text's vector is the normalised mean of its tokens' vectors, and a token's vector is what
all-MiniLM-L6-v2 itself says of that token alone (``[CLS] token [SEP]``, mean-pooled, normalised) —
the model2vec recipe without its PCA, derived here from the packaged weights, nothing downloaded.
A token's vector is computed the first time a text holds it and kept for the process, so an index
build runs the transformer once per distinct *token* (a few thousand), not once per text: encoding
is tokenising and averaging.

It is not the same vector space as the model's: an index built with it names its own model id
(:data:`STATIC_MODEL_ID`) in its manifest, so it is served only with this embedder (and its
snapshot id differs). It reads words, not sentences — word order and context are lost — which is why
it is opt-in: ``replay-sim index build --embedding minilm-static`` (README "Index build on CPU").
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from replay_sim.resolve.embedding import MAX_TEXT_CHARS, SentenceTransformerEmbedder

__all__ = ["STATIC_MODEL_ID", "StaticEmbedder"]

STATIC_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2+static-tokens-v1"
"""The id an index of static vectors names; bump the suffix whenever the recipe changes."""

_TOKEN_BATCH = 1024  # token forward passes per batch: three positions each, so cheap


class StaticEmbedder:
    """An :class:`~replay_sim.resolve.embedding.Embedder` of averaged static token vectors.

    Args:
        model: The sentence-transformers model the token vectors come from (its tokenizer too);
            the packaged MiniLM when None.
    """

    model_id = STATIC_MODEL_ID

    def __init__(self, model: SentenceTransformerEmbedder | None = None) -> None:
        self.model = model or SentenceTransformerEmbedder()
        self._table: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    @property
    def dimension(self) -> int:
        """Length of each vector (the model's)."""
        return self.model.dimension

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Encode texts (each cut to :data:`MAX_TEXT_CHARS`) into unit vectors.

        A text with no tokens (empty, or only whitespace) gets the vector of the empty sentence.
        """
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        st = self.model.load()
        tokenizer = st.tokenizer
        limit = int(st.max_seq_length) - 2  # what the model itself would read
        ids: list[list[int]] = tokenizer(
            [t[:MAX_TEXT_CHARS] for t in texts], add_special_tokens=False, truncation=True, max_length=limit
        )["input_ids"]
        table = self._vectors(st, {i for row in ids for i in row} | {-1})
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        for n, row in enumerate(ids):
            out[n] = np.mean([table[i] for i in row], axis=0) if row else table[-1]
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return np.ascontiguousarray(out / np.maximum(norms, 1e-12), dtype=np.float32)

    def _vectors(self, st: Any, wanted: set[int]) -> dict[int, np.ndarray]:
        """The token table, with every token of ``wanted`` in it (-1: the empty sentence)."""
        with self._lock:
            missing = sorted(wanted - self._table.keys())
            if missing:
                import torch

                tokenizer = st.tokenizer
                cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
                if -1 in missing:
                    missing.remove(-1)
                    self._table[-1] = self._forward(st, torch.tensor([[cls, sep]]))[0]
                for start in range(0, len(missing), _TOKEN_BATCH):
                    chunk = missing[start : start + _TOKEN_BATCH]
                    rows = torch.tensor([[cls, token, sep] for token in chunk])
                    for token, vector in zip(chunk, self._forward(st, rows), strict=True):
                        self._table[token] = vector
            return self._table

    @staticmethod
    def _forward(st: Any, input_ids: Any) -> np.ndarray:
        """The model's normalised sentence embeddings of rows of token ids (no padding)."""
        import torch

        features = {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "token_type_ids": torch.zeros_like(input_ids),
        }
        with torch.inference_mode():
            vectors = st(features)["sentence_embedding"]
        return np.ascontiguousarray(vectors.numpy(), dtype=np.float32)
