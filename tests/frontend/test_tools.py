"""Tool calling and reasoning through the official ``openai`` client, against a frontend
and mocker workers whose recipes name a tool-call and a reasoning parser: the mocker
writes calls and thinking in the model's format, the frontend parses them back
(docs/api.md, "Structured outputs, tools and reasoning")."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
import pytest_asyncio

from tests.frontend.conftest import WEATHER, parsed_models

pytestmark = [pytest.mark.openai_compat, pytest.mark.asyncio(loop_scope="module")]

HERMES = "mt-hermes"  # hermes tool calls, deepseek_r1 thinking
LLAMA = "mt-llama"  # llama3_json tool calls, qwen3 thinking
PLAIN = "mt-plain"  # no parser
MODELS = [HERMES, LLAMA, PLAIN]
TIME = {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def oai(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[openai.AsyncOpenAI]:
    """One mocker worker per model, one frontend."""
    async with parsed_models(Path(tmp_path_factory.mktemp("tools")), MODELS) as dep:
        client = openai.AsyncOpenAI(
            base_url=f"{dep.frontend_url}/v1", api_key="unused", max_retries=0
        )
        yield client
        await client.close()


def check_call(call: Any) -> dict[str, Any]:
    """A parsed call names an offered function with arguments valid for it."""
    assert call.type == "function" and call.id.startswith("call_")
    arguments: dict[str, Any] = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return arguments


@pytest.mark.parametrize("model", [HERMES, LLAMA])
async def test_auto_tool_call_is_parsed(oai: openai.AsyncOpenAI, model: str) -> None:
    plain = await oai.chat.completions.create(model=model, messages=ASK, max_tokens=1)
    chat = await oai.chat.completions.create(model=model, messages=ASK, tools=TOOLS, seed=3)
    choice = chat.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.tool_calls is not None and len(choice.message.tool_calls) == 1
    check_call(choice.message.tool_calls[0])
    assert not choice.message.content  # the call is not left in the text
    # The tools went through the chat template: the prompt grew by their schemas.
    assert chat.usage is not None and plain.usage is not None
    assert chat.usage.prompt_tokens > plain.usage.prompt_tokens + 20


@pytest.mark.parametrize("model", [HERMES, LLAMA])
async def test_streamed_tool_call_deltas_reassemble(oai: openai.AsyncOpenAI, model: str) -> None:
    whole = await oai.chat.completions.create(model=model, messages=ASK, tools=TOOLS, seed=5)
    stream = await oai.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, seed=5, stream=True
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    async for chunk in stream:
        delta = chunk.choices[0].delta
        for part in delta.tool_calls or []:
            call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += part.id or ""
            assert part.function is not None
            call["name"] += part.function.name or ""
            call["arguments"] += part.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    expected = whole.choices[0].message.tool_calls
    assert expected is not None
    # Same seed, same answer: the stream's calls are the whole answer's (ids differ).
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [
        (c.function.name, json.loads(c.function.arguments)) for c in expected
    ]


async def test_reasoning_content_whole_and_streamed(oai: openai.AsyncOpenAI) -> None:
    whole = await oai.chat.completions.create(model=HERMES, messages=ASK, tools=TOOLS, seed=7)
    message = whole.choices[0].message
    reasoning = (message.model_extra or {}).get("reasoning_content")
    assert reasoning and "Let me think" in reasoning and "<think>" not in reasoning
    assert message.tool_calls is not None  # thinking, then the call

    stream = await oai.chat.completions.create(
        model=HERMES, messages=ASK, tools=TOOLS, seed=7, stream=True
    )
    thought = content = ""
    async for chunk in stream:
        delta = chunk.choices[0].delta
        thought += (delta.model_extra or {}).get("reasoning_content") or ""
        content += delta.content or ""
    assert thought == reasoning and content == ""


async def test_tool_result_is_answered_in_words(oai: openai.AsyncOpenAI) -> None:
    first = await oai.chat.completions.create(model=LLAMA, messages=ASK, tools=TOOLS, seed=1)
    calls = first.choices[0].message.tool_calls
    assert calls is not None
    conversation: list[Any] = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]},
        {"role": "tool", "tool_call_id": calls[0].id, "content": "18 degrees, sunny"},
    ]
    answer = await oai.chat.completions.create(
        model=LLAMA, messages=conversation, tools=TOOLS, max_tokens=80,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    choice = answer.choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls is None
    assert choice.message.content  # free text: an agent loop ends


async def test_required_and_named_tool_choice(oai: openai.AsyncOpenAI) -> None:
    # A model without a parser: forced calls are constrained JSON, no format needed.
    required = await oai.chat.completions.create(
        model=PLAIN, messages=ASK, tools=TOOLS, tool_choice="required", seed=2,
        parallel_tool_calls=False,
    )  # fmt: skip
    calls = required.choices[0].message.tool_calls
    assert required.choices[0].finish_reason == "tool_calls"
    assert calls is not None and len(calls) == 1
    check_call(calls[0])
    named = await oai.chat.completions.create(
        model=PLAIN, messages=ASK, tools=TOOLS, stream=False,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )  # fmt: skip
    calls = named.choices[0].message.tool_calls
    assert calls is not None and [c.function.name for c in calls] == ["get_time"]
    check_call(calls[0])


async def test_tool_choice_none_answers_in_words(oai: openai.AsyncOpenAI) -> None:
    chat = await oai.chat.completions.create(
        model=HERMES, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=5,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert chat.choices[0].message.tool_calls is None


async def test_unparsable_tool_call_is_content(oai: openai.AsyncOpenAI) -> None:
    # The mocker writes exactly this (a regex constraint): a call whose JSON is broken.
    broken = '<tool_call>{"name": get_weather</tool_call>'
    for stream in (False, True):
        chat = await oai.chat.completions.create(
            model=HERMES, messages=ASK, tools=TOOLS, stream=stream,
            extra_body={"structured_outputs": {"choice": [broken]}},
        )  # fmt: skip
        if isinstance(chat, openai.AsyncStream):
            text = "".join([c.choices[0].delta.content or "" async for c in chat])
        else:
            assert chat.choices[0].finish_reason == "stop"
            assert chat.choices[0].message.tool_calls is None
            text = chat.choices[0].message.content or ""
        assert text == broken


async def test_tool_requests_refused(oai: openai.AsyncOpenAI) -> None:
    async def refused(**fields: Any) -> openai.BadRequestError:
        with pytest.raises(openai.BadRequestError) as caught:
            await oai.chat.completions.create(messages=ASK, **fields)
        return caught.value

    error = await refused(model=PLAIN, tools=TOOLS)
    assert error.body["param"] == "tool_choice" and "tool_call_parser" in error.message
    error = await refused(model=HERMES, tool_choice="required")
    assert "tool_choice needs tools" in error.message
    error = await refused(
        model=HERMES, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "x"}}
    )
    assert "not in tools" in error.message
    bad_tool = [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]
    error = await refused(model=HERMES, tools=bad_tool)
    assert error.body["param"] == "tools.0.function.parameters"
    error = await refused(
        model=HERMES, tools=TOOLS, tool_choice="required",
        response_format={"type": "json_object"},
    )  # fmt: skip
    assert "both constrain the output" in error.message


async def test_each_choice_is_read_apart(oai: openai.AsyncOpenAI) -> None:
    """n choices (docs/api.md, "Choices"): each streams its own thinking and call."""
    stream = await oai.chat.completions.create(
        model=HERMES, messages=ASK, tools=TOOLS, n=2, seed=11, stream=True, logprobs=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    calls: dict[int, list[Any]] = {0: [], 1: []}
    thoughts = {0: "", 1: ""}
    finish: dict[int, str] = {}
    logprobs, usage = 0, None
    async for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            calls[choice.index] += choice.delta.tool_calls or []
            thoughts[choice.index] += (choice.delta.model_extra or {}).get(
                "reasoning_content"
            ) or ""
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
            if choice.logprobs and choice.logprobs.content:
                logprobs += len(choice.logprobs.content)
    assert finish == {0: "tool_calls", 1: "tool_calls"}
    for index in (0, 1):
        assert thoughts[index].startswith("\nLet me think")
        assert len(calls[index]) == 1
        check_call(calls[index][0])
    # Every token's log-probability, carried on the deltas that were sent (held-back
    # text's on the next one).
    assert usage is not None and logprobs == usage.completion_tokens
    whole = await oai.chat.completions.create(model=HERMES, messages=ASK, tools=TOOLS, n=2, seed=11)
    assert [c.finish_reason for c in whole.choices] == ["tool_calls", "tool_calls"]
    assert all(c.message.tool_calls for c in whole.choices)


async def test_a_json_answer_is_not_mistaken_for_a_call(oai: openai.AsyncOpenAI) -> None:
    # Llama 3's calls are bare JSON objects; an answer constrained to a schema with a
    # "name" is still the answer (a call needs its "parameters", and an offered name).
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "parameters": {"type": "object"}},
        "required": ["name", "parameters"],
        "additionalProperties": False,
    }
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
    chat = await oai.chat.completions.create(
        model=LLAMA, messages=ASK, tools=TOOLS, response_format=fmt, seed=4
    )
    message = chat.choices[0].message
    assert message.tool_calls is None and chat.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(message.content or ""), schema)
