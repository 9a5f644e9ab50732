"""Anthropic's Messages API through the official ``anthropic`` client, against mocker
workers whose recipes name a tool-call and a reasoning parser (as ``test_tools``): whole
and streamed answers, tools and tool results, thinking, stop sequences, token counting,
and errors in Anthropic's shape (docs/api.md, "Anthropic Messages")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
import pytest_asyncio

from tests.frontend.conftest import WEATHER, Deployment, parsed_models

pytestmark = [pytest.mark.openai_compat, pytest.mark.asyncio(loop_scope="module")]

HERMES = "mt-hermes"  # hermes tool calls, deepseek_r1 thinking
PLAIN = "mt-plain"  # no parser
TOOLS: list[Any] = [{"name": "get_weather", "description": "Weather", "input_schema": WEATHER}]
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def dep(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Deployment]:
    async with parsed_models(Path(tmp_path_factory.mktemp("anthropic")), [HERMES, PLAIN]) as d:
        yield d


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(dep: Deployment) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(
        base_url=dep.frontend_url, api_key="unused", max_retries=0
    ) as client:
        yield client


def text_of(message: Any) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


async def test_whole_message_with_usage(client: anthropic.AsyncAnthropic) -> None:
    message = await client.messages.create(
        model=PLAIN, max_tokens=12, messages=ASK, system="Be brief.",
        metadata={"user_id": "u1"}, cache_control={"type": "ephemeral"},
    )  # fmt: skip
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.model == PLAIN
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert text_of(message)
    usage = message.usage
    assert usage.output_tokens >= 1 and usage.output_tokens <= 12
    # The system prompt reached the template: the prompt is longer with it.
    bare = await client.messages.create(model=PLAIN, max_tokens=1, messages=ASK)
    total = usage.input_tokens + (usage.cache_read_input_tokens or 0)
    assert total > bare.usage.input_tokens + (bare.usage.cache_read_input_tokens or 0)


async def test_max_tokens_is_the_stop_reason_at_the_limit(client: anthropic.AsyncAnthropic) -> None:
    long = [{"role": "user", "content": "Tell a long story " * 4}]
    message = await client.messages.create(model=PLAIN, max_tokens=3, messages=long,
                                           extra_body={"temperature": 0.0})  # fmt: skip
    # The mocker answers at length unless it samples its end: at 3 tokens, the limit.
    if message.stop_reason == "max_tokens":
        assert message.usage.output_tokens == 3
    else:
        assert message.stop_reason == "end_turn" and message.usage.output_tokens < 3


async def test_stream_events_rebuild_the_whole_message(client: anthropic.AsyncAnthropic) -> None:
    kinds: list[str] = []
    async with client.messages.stream(
        model=PLAIN, max_tokens=16, messages=ASK, extra_body={"temperature": 0.0}
    ) as stream:
        async for ev in stream:
            kinds.append(ev.type)
        final = await stream.get_final_message()
    whole = await client.messages.create(model=PLAIN, max_tokens=16, messages=ASK,
                                         extra_body={"temperature": 0.0})  # fmt: skip
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds
    assert kinds[-2] == "message_delta"
    assert text_of(final) == text_of(whole) and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


async def test_stop_sequence_is_named(client: anthropic.AsyncAnthropic) -> None:
    first = await client.messages.create(model=PLAIN, max_tokens=24, messages=ASK,
                                         extra_body={"temperature": 0.0})  # fmt: skip
    text = text_of(first)
    words = text.split()
    assert len(words) >= 3, text
    stop = " " + words[2]
    cut = text[: text.index(stop)]
    for stream in (False, True):
        kwargs: dict[str, Any] = {
            "model": PLAIN, "max_tokens": 24, "messages": ASK,
            "extra_body": {"temperature": 0.0}, "stop_sequences": [stop, "\x00never"],
        }  # fmt: skip
        if stream:
            async with client.messages.stream(**kwargs) as events:
                message = await events.get_final_message()
        else:
            message = await client.messages.create(**kwargs)
        assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
        assert text_of(message) == cut


async def test_tool_use_whole_and_streamed(client: anthropic.AsyncAnthropic) -> None:
    message = await client.messages.create(
        model=HERMES, max_tokens=200, messages=ASK, tools=TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )  # fmt: skip
    assert message.stop_reason == "tool_use"
    uses = [b for b in message.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather"  # one call: parallel disabled
    jsonschema.validate(uses[0].input, WEATHER)
    async with client.messages.stream(
        model=HERMES,
        max_tokens=200,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
    ) as stream:
        final = await stream.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and uses
    for use in uses:  # the SDK rebuilt each from its input_json deltas
        assert use.name == "get_weather"
        jsonschema.validate(use.input, WEATHER)


async def test_tool_result_turn_is_answered(client: anthropic.AsyncAnthropic) -> None:
    first = await client.messages.create(
        model=HERMES, max_tokens=200, messages=ASK, tools=TOOLS, tool_choice={"type": "any"}
    )
    use = next(b for b in first.content if b.type == "tool_use")
    conversation: list[Any] = [
        *ASK,
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use.id, "content": "18 degrees, sunny",
             "cache_control": {"type": "ephemeral"}},
        ]},
    ]  # fmt: skip
    none: Any = {"type": "none"}
    counted = await client.messages.count_tokens(
        model=HERMES, messages=conversation, tools=TOOLS, tool_choice=none
    )
    bare = await client.messages.count_tokens(
        model=HERMES, messages=ASK, tools=TOOLS, tool_choice=none
    )
    assert counted.input_tokens > bare.input_tokens + 5  # the call and its result templated
    answer = await client.messages.create(
        model=HERMES, max_tokens=40, messages=conversation, tools=TOOLS, tool_choice=none,
    )  # fmt: skip
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert not [b for b in answer.content if b.type == "tool_use"]
    total = answer.usage.input_tokens + (answer.usage.cache_read_input_tokens or 0)
    assert total == counted.input_tokens


async def test_thinking_shown_only_when_enabled(client: anthropic.AsyncAnthropic) -> None:
    asked = await client.messages.create(
        model=HERMES, max_tokens=2048, messages=ASK, tools=TOOLS,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )  # fmt: skip
    thoughts = [b for b in asked.content if b.type == "thinking"]
    assert thoughts and "Let me think" in thoughts[0].thinking
    assert "<think>" not in thoughts[0].thinking
    plain = await client.messages.create(model=HERMES, max_tokens=2048, messages=ASK, tools=TOOLS)
    assert not [b for b in plain.content if b.type == "thinking"]
    async with client.messages.stream(
        model=HERMES,
        max_tokens=2048,
        messages=ASK,
        tools=TOOLS,
        thinking={"type": "enabled", "budget_tokens": 1024},
    ) as stream:
        kinds = [ev.type async for ev in stream]
        final = await stream.get_final_message()
    assert "thinking" in kinds  # the SDK's event for a thinking delta
    assert next(b.type for b in final.content) == "thinking"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": 5, "messages": ASK, "bogus": 1}, "bogus"),
        ({"messages": ASK}, "max_tokens"),
        ({"max_tokens": 5, "messages": ASK, "container": "c"}, "container"),
        ({"max_tokens": 5, "messages": ASK, "service_tier": "priority"}, "service_tier"),
        ({"max_tokens": 5, "messages": ASK, "temperature": 1.5}, "temperature"),
        ({"max_tokens": 5, "messages": ASK, "stop_sequences": ["a"] * 5}, "stop_sequences"),
        ({"max_tokens": 2000, "messages": ASK,
          "thinking": {"type": "enabled", "budget_tokens": 4096}}, "thinking.budget_tokens"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                          "data": "AA=="}}]}]}, "messages.0.content"),
        ({"max_tokens": 5, "messages": ASK,
          "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)  # fmt: skip
async def test_bad_requests_get_anthropic_errors_naming_the_field(
    dep: Deployment, body: dict[str, Any], param: str
) -> None:
    async with httpx.AsyncClient(base_url=dep.frontend_url) as http:
        response = await http.post("/v1/messages", json={"model": PLAIN, **body})
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["param"].startswith(param), error


async def test_unknown_model_and_sdk_error_types(client: anthropic.AsyncAnthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        await client.messages.create(model="nope", max_tokens=5, messages=ASK)
    assert caught.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


async def test_requests_are_counted_under_messages(
    dep: Deployment, client: anthropic.AsyncAnthropic
) -> None:
    await client.messages.create(model=PLAIN, max_tokens=2, messages=ASK)
    async with httpx.AsyncClient(base_url=dep.frontend_url) as http:
        text = (await http.get("/metrics")).text
    lines = [
        line for line in text.splitlines()
        if line.startswith("dynamoctl_frontend_requests_total") and 'endpoint="messages"' in line
    ]  # fmt: skip
    assert lines and float(lines[0].rsplit(" ", 1)[1]) >= 1
    refused = [
        line for line in text.splitlines()
        if line.startswith("dynamoctl_frontend_requests_total")
        and 'endpoint="messages"' in line and 'status="400"' in line
    ]  # fmt: skip
    assert refused  # the bad requests above, counted under their endpoint
