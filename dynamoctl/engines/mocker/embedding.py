"""The mocker's embedding model: a vector per prompt that is a pure function of its
tokens, as a real pooling model's is, at the cost of a prefill (the scheduler simulates
the prompt's forward pass; the vector is ready when it ends).

Each token id has a fixed random direction (one table per engine, drawn from a fixed
seed, so every replica agrees); a prompt's embedding is the mean of its tokens' vectors,
normalised to unit length (mean pooling, as sentence-transformers models do). Prompts
that share tokens point alike, so a retriever's ranking over mocker embeddings is not
noise; shortening to ``dimensions`` keeps the first ones and renormalises (a Matryoshka
model's rule).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from dynamoctl.engines.api import GenerateRequest, RequestRejected

if TYPE_CHECKING:
    import numpy as np

TABLE_SEED = 0x5EED
"""Seed of the token table: fixed, so two mockers of one model embed alike."""


class MockEmbedder:
    """One model's embeddings: ``size`` dimensions over a vocabulary of ``vocab_size``
    (ids past it wrap around)."""

    def __init__(self, size: int, vocab_size: int) -> None:
        self.size = size
        self._table: np.ndarray | None = None
        self._vocab = vocab_size

    def embed(self, token_ids: Sequence[int], dimensions: int | None = None) -> list[float]:
        """The unit-norm embedding of ``token_ids``, of ``dimensions`` (default: all)."""
        import numpy as np  # on first use: a generative mocker never imports it (~0.1 s a start)

        if self._table is None:  # drawn on first use: a generative mocker never pays it
            rng = np.random.default_rng(TABLE_SEED)
            self._table = rng.standard_normal((self._vocab, self.size), dtype=np.float32)
        ids = np.asarray(token_ids, dtype=np.int64) % self._vocab
        vector = self._table[ids].mean(axis=0, dtype=np.float64)[: dimensions or self.size]
        norm = float(np.linalg.norm(vector))
        if norm == 0.0:  # cannot happen with a Gaussian table; a unit axis if it does
            vector = np.zeros_like(vector)
            vector[0] = 1.0
            norm = 1.0
        result: list[float] = (vector / norm).tolist()
        return result


def pooled(
    request: GenerateRequest, embedder: MockEmbedder | None, matryoshka: bool
) -> tuple[GenerateRequest, list[float] | None]:
    """What the scheduler runs for ``request`` and, for an embedding request, the vector
    its stream ends with: its prompt's prefill (one step's output, never sampled) and the
    embedding. A request this engine's task cannot serve is :class:`RequestRejected`."""
    if embedder is None:
        if request.pooling is not None:
            raise RequestRejected("this mocker runs a generative model (task: generate)")
        return request, None
    if request.pooling is None:
        raise RequestRejected("this mocker runs an embedding model (task: embed)")
    dimensions = request.pooling.dimensions
    shortened = dimensions is not None and dimensions != embedder.size
    if shortened and not (matryoshka and 1 <= (dimensions or 0) <= embedder.size):
        raise RequestRejected(
            f"dimensions {dimensions}: this model's embeddings have {embedder.size}"
            + (" (at most)" if matryoshka else " and cannot be shortened")
        )
    prefill = msgspec.structs.replace(
        request, max_tokens=1, ignore_eos=True, logprobs=None, prompt_logprobs=None, output=None
    )
    return prefill, embedder.embed(request.token_ids, dimensions)
