"""A request's choices beyond plain text (:mod:`dynamoctl.structured`,
:mod:`dynamoctl.parsers`): the structured output each job asks of its engine, and each
chat choice's shaper turning its text into reasoning, content and tool-call deltas
(streamed) or message fields (whole), with the finish reason a tool call implies; and
which choices can stream plain text through the pre-split frame instead."""

from __future__ import annotations

from typing import Any

import msgspec

from dynamoctl.frontend.choices import Choices
from dynamoctl.frontend.generate import Job
from dynamoctl.frontend.shape import Shape, sse_data
from dynamoctl.parsers.shaper import MessageDelta
from dynamoctl.structured.plan import OutputPlan


def planned(jobs: list[Job], plan: OutputPlan) -> list[Job]:
    """``jobs`` asking their engine for ``plan``'s structured output."""
    if plan.spec is not None:
        for job in jobs:
            job.engine = msgspec.structs.replace(job.engine, output=plan.spec)
    return jobs


def text_frames(
    shape: Shape, choices: Choices, include_usage: bool
) -> list[tuple[bytes, bytes] | None]:
    """Per choice, the pre-split SSE frame of a plain text delta (the per-token hot path);
    None where a delta needs more: log-probabilities, a shaper's reasoning and tool calls."""
    if choices.logprobs or choices.shapers:
        return [None] * len(choices.jobs)
    return [shape.text_frame(include_usage, i) for i in range(len(choices.jobs))]


def delta_events(
    shape: Shape, choices: Choices, index: int, deltas: list[MessageDelta], include_usage: bool
) -> list[bytes]:
    """SSE events of a chat choice's deltas (reasoning, content, tool calls); the tokens'
    log-probabilities go with the first, and wait while a tag is held back."""
    events = []
    for i, delta in enumerate(deltas):
        logprobs = choices.new_logprobs(index) if i == 0 else None
        chunk = shape.chunk(None, index=index, logprobs=logprobs)
        chunk["choices"][0]["delta"] = delta
        events.append(sse_data(shape.with_usage(chunk, include_usage)))
    return events


def finish_events(shape: Shape, choices: Choices, index: int, include_usage: bool) -> list[bytes]:
    """A choice's last chunks: what its shaper still held, then its finish reason (a tool
    call's when it made one) and the log-probabilities not sent yet."""
    reason = choices.outcomes[index].finish_reason
    events = []
    if choices.shapers:
        shaper = choices.shapers[index]
        events = delta_events(shape, choices, index, shaper.close(), include_usage)
        reason = shaper.finish_reason(reason)
    final = shape.chunk(None, reason, index=index, logprobs=choices.new_logprobs(index))
    events.append(sse_data(shape.with_usage(final, include_usage)))
    return events


def shape_messages(whole: Any, choices: Choices, texts: list[str]) -> None:
    """A whole chat response's messages as their shapers read them (reasoning, tool
    calls) and the finish reasons that follow."""
    for i, shaper in enumerate(choices.shapers):
        choice = whole["choices"][i]
        choice["message"].update(shaper.message(texts[i]))
        choice["finish_reason"] = shaper.finish_reason(choice["finish_reason"])
