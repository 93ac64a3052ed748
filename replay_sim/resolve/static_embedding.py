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
it is opt-in: ``replay-sim index build --embedding minilm-static`` (docs: Benchmarks, "Index build on CPU").
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
        self._table: np.ndarray | None = None
        self._known = np.zeros(0, dtype=bool)
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
        with self._lock:  # a fast tokenizer called from two threads at once can fail ("Already borrowed")
            ids: list[list[int]] = tokenizer(
                [t[:MAX_TEXT_CHARS] for t in texts],
                add_special_tokens=False,
                truncation=True,
                max_length=limit,
            )["input_ids"]
        empty = int(tokenizer.vocab_size)  # the row of the empty sentence, after the vocabulary's
        rows = [row or [empty] for row in ids]
        flat = np.fromiter((i for row in rows for i in row), dtype=np.int64)
        table = self._table_with(st, flat)
        starts = np.cumsum([0] + [len(row) for row in rows[:-1]])
        sums = np.add.reduceat(table[flat], starts)  # the mean's direction is the sum's
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        return np.ascontiguousarray(sums / np.maximum(norms, 1e-12), dtype=np.float32)

    def _table_with(self, st: Any, tokens: np.ndarray) -> np.ndarray:
        """The token table (a row per vocabulary id, then the empty sentence), ``tokens`` filled in."""
        import torch

        with self._lock:
            tokenizer = st.tokenizer
            empty = int(tokenizer.vocab_size)
            if self._table is None:  # zeros: pages of tokens never seen take no memory
                self._table = np.zeros((empty + 1, self.dimension), dtype=np.float32)
                self._known = np.zeros(empty + 1, dtype=bool)
            missing = np.unique(tokens[~self._known[tokens]]).tolist()
            cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
            if missing and missing[-1] == empty:
                missing.pop()
                self._table[empty] = self._forward(st, torch.tensor([[cls, sep]]))[0]
                self._known[empty] = True
            for at in range(0, len(missing), _TOKEN_BATCH):
                chunk = missing[at : at + _TOKEN_BATCH]
                self._table[chunk] = self._forward(st, torch.tensor([[cls, token, sep] for token in chunk]))
                self._known[chunk] = True
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
