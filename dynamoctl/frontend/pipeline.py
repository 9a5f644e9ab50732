"""What the endpoints built on chat completions (Anthropic's Messages, OpenAI's
Responses) use of it: a chat request's prompt and its choices, ready to run, and the
pieces every endpoint shares (:class:`dynamoctl.frontend.app._Completions` is the one)."""

from __future__ import annotations

from typing import Protocol

from dynamoctl.frontend.choices import Choices
from dynamoctl.frontend.generate import Generator
from dynamoctl.frontend.metrics import FrontendMetrics
from dynamoctl.frontend.models import ServedModel
from dynamoctl.frontend.protocol import ChatCompletionRequest
from dynamoctl.frontend.refusals import Refusals
from dynamoctl.structured.plan import OutputPlan


class ChatPipeline(Protocol):
    generator: Generator
    metrics: FrontendMetrics
    refusals: Refusals
    max_body_bytes: int

    async def chat_prompt(
        self, body: ChatCompletionRequest
    ) -> tuple[ServedModel, OutputPlan, list[int]]: ...

    async def chat_choices(
        self, body: ChatCompletionRequest, rid: str
    ) -> tuple[ServedModel, Choices]: ...
