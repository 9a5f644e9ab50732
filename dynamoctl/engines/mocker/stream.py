"""A mocker request's output stream: the engine loop pushes each step's token into it and
the reader takes every token produced since its previous read (:class:`MockerStream`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from dynamoctl.engines.api import FinishReason, GenerateChunk
from dynamoctl.wire.engine import TokenLogprobs


class MockerStream(AsyncIterator[GenerateChunk]):
    """The output of one request. A chunk carries every token produced since the reader's
    previous one: one per step while it keeps up, several if it falls behind."""

    __slots__ = (
        "_abort",
        "_done",
        "_embedding",
        "_error",
        "_finish",
        "_handoff",
        "_header",
        "_logprobs",
        "_prompt_logprobs",
        "_tokens",
        "_waiter",
        "request_id",
    )

    def __init__(
        self, abort: Callable[[str], Awaitable[None]], request_id: str, prompt_tokens: int
    ) -> None:
        self._abort = abort  # the engine's abort
        self.request_id = request_id
        self._tokens: list[int] = []
        self._finish: FinishReason | None = None
        # (cached_tokens, prompt_tokens) for the first chunk; None once sent.
        self._header: tuple[int, int] | None = (0, prompt_tokens)
        self._handoff: dict[str, Any] | None = None  # on the last chunk
        self._logprobs: list[TokenLogprobs] | None = None  # aligned with _tokens, if asked
        self._prompt_logprobs: list[TokenLogprobs | None] | None = None  # first chunk's
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._done = False
        self._embedding: list[float] | None = None  # an embedding request's, at its end

    def _push(
        self, token: int | None, finish: FinishReason | None, logprobs: TokenLogprobs | None = None
    ) -> None:
        if token is not None:
            self._tokens.append(token)
            if logprobs is not None:
                if self._logprobs is None:
                    self._logprobs = []
                self._logprobs.append(logprobs)
        self._finish = finish
        self._wake()

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def __aiter__(self) -> MockerStream:
        return self

    async def __anext__(self) -> GenerateChunk:
        while not (self._done or self._tokens or self._finish or self._error):
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._done:
            raise StopAsyncIteration
        if self._error is not None:
            self._done = True
            raise self._error
        chunk = GenerateChunk(self._tokens, self._finish)
        if self._logprobs is not None:
            chunk.logprobs, self._logprobs = self._logprobs, None
        if self._finish is not None:
            chunk.kv_transfer_params = self._handoff
            chunk.embedding = self._embedding
        if self._header is not None:
            chunk.cached_tokens, chunk.prompt_tokens = self._header
            chunk.prompt_logprobs = self._prompt_logprobs
            self._header = None
        self._tokens = []
        self._done = self._finish is not None
        return chunk

    async def aclose(self) -> None:
        """Stop reading: aborts the request if it has not finished."""
        if not self._done:
            self._done = True
            await self._abort(self.request_id)
