"""A request's choices running together: ``n`` per prompt and a batched completion's
prompts, each a :class:`~dynamoctl.frontend.generate.Job` generated on its own (routed,
migrated), their text deltas merged into one stream tagged with the choice's index.

One choice (nearly every request) is read in place; several are read by one task each
into a queue, so a slow choice never holds back another's tokens. The first failure
ends the request, and closing the merged stream cancels every choice."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from dynamoctl.frontend.errors import OpenAIError
from dynamoctl.frontend.generate import Generator, Job, Outcome
from dynamoctl.frontend.logprobs import LogprobsRenderer, PromptEntries
from dynamoctl.frontend.models import ServedModel
from dynamoctl.parsers.shaper import ChatShaper

Delta = tuple[int, str | None]
"""A choice's index and its next text; None: the choice has finished."""


@dataclass
class Choices:
    """The choices of one request and what their responses need."""

    request_id: str
    """The response's id; a choice's job is named after it."""
    jobs: list[Job]
    prompt_tokens: int
    """Each prompt's tokens once, however many choices it has (OpenAI's usage)."""
    echo: list[str] = field(default_factory=list)
    """Per choice, the prompt text that precedes its completion (``echo``); empty: none."""
    logprobs: bool = False
    """The client asked for log-probabilities."""
    echo_logprobs: bool = False
    """``echo`` with ``logprobs``: the prompt's tokens lead each choice's ``logprobs``."""
    prompt_logprobs: bool = False
    """vLLM's ``prompt_logprobs``: each choice has its own list of them."""
    shapers: list[ChatShaper] = field(default_factory=list)
    """Per choice, the reader of its reasoning and tool calls (:mod:`dynamoctl.structured`);
    empty: a choice's text is its content."""
    outcomes: list[Outcome] = field(init=False)
    renderers: list[LogprobsRenderer] = field(init=False, default_factory=list)
    prompt_renderer: LogprobsRenderer | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.outcomes = [Outcome() for _ in self.jobs]

    def setup_logprobs(self, model: ServedModel, chat: bool) -> None:
        if self.prompt_logprobs:
            self.prompt_renderer = LogprobsRenderer(model.tokenizer, chat)
        if self.logprobs:
            self.renderers = [
                LogprobsRenderer(model.tokenizer, chat, self._text_offset(i))
                for i in range(len(self.jobs))
            ]

    def _text_offset(self, index: int) -> int:
        """Where the choice's first scored token starts: after an echoed prompt, unless
        the prompt's tokens are scored too."""
        return len(self.echo[index]) if self.echo and not self.echo_logprobs else 0

    def cached_tokens(self, n: int) -> int:
        """Prompt tokens served from cache: each prompt's first choice's."""
        return sum(o.cached_tokens for o in self.outcomes[::n])

    def running_usage(self, index: int) -> Any:
        """Choice ``index``'s usage so far: its prompt's tokens and the tokens generated
        until now (vLLM's ``continuous_usage_stats``)."""
        prompt = len(self.jobs[index].prompt_ids)
        completion = len(self.outcomes[index].generated)
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}  # fmt: skip

    def done(self) -> bool:
        """Every choice has finished (called per token: one choice is the common case)."""
        outcomes = self.outcomes
        if len(outcomes) == 1:
            return outcomes[0].finish_reason is not None
        return all(o.finish_reason is not None for o in outcomes)

    def new_logprobs(self, index: int) -> Any:
        """Log-probabilities of the choice's tokens not written yet (None if not asked)."""
        if not self.logprobs:
            return None
        return self.renderers[index].render(self.outcomes[index].new_logprobs())

    def all_logprobs(self, index: int) -> Any:
        if not self.logprobs:
            return None
        if self.echo_logprobs:
            return self.renderers[index].echoed(self._prompt(index), self.outcomes[index].logprobs)
        return self.renderers[index].render(self.outcomes[index].logprobs)

    def check_prompt_logprobs(self) -> None:
        """Every choice got its prompt's log-probabilities (an engine that gives none, or
        too few, fails the request rather than answer without them)."""
        for job, outcome in zip(self.jobs, self.outcomes, strict=True):
            if len(outcome.prompt_logprobs) != len(job.prompt_ids):
                raise OpenAIError(
                    501,
                    f"the engine returned {len(outcome.prompt_logprobs)} prompt "
                    f"log-probabilities for {len(job.prompt_ids)} prompt tokens (vLLM and "
                    "the mocker return them)",
                    type="server_error",
                    param="prompt_logprobs" if self.prompt_logprobs else "echo",
                )

    def add_prompt_logprobs(self, whole: dict[str, Any]) -> None:
        """vLLM's ``prompt_logprobs`` in each choice of the whole response."""
        renderer = self.prompt_renderer
        assert renderer is not None  # setup_logprobs made it
        for i, choice in enumerate(whole["choices"]):
            choice["prompt_logprobs"] = renderer.prompt_logprobs(self._prompt(i))

    def _prompt(self, index: int) -> PromptEntries:
        ids = self.jobs[index].prompt_ids
        return list(zip(ids, self.outcomes[index].prompt_logprobs, strict=False))

    def run(self, generator: Generator, model: ServedModel) -> AsyncIterator[Delta]:
        streams = [
            generator.run(job, model.tokenizer, model.picker, outcome)
            for job, outcome in zip(self.jobs, self.outcomes, strict=True)
        ]
        return _one(streams[0]) if len(streams) == 1 else _merged(streams)


async def _one(stream: AsyncIterator[str]) -> AsyncIterator[Delta]:
    async for text in stream:
        yield 0, text
    yield 0, None


async def _merged(streams: Sequence[AsyncIterator[str]]) -> AsyncIterator[Delta]:
    queue: asyncio.Queue[tuple[int, str | None, BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[str]) -> None:
        try:
            async with contextlib.aclosing(stream):  # type: ignore[type-var]
                async for text in stream:
                    queue.put_nowait((index, text, None))
            queue.put_nowait((index, None, None))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            queue.put_nowait((index, None, exc))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(tasks)
        while left:
            index, text, error = await queue.get()
            if error is not None:
                raise error
            if text is None:
                left -= 1
            yield index, text
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
