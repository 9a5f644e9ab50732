"""OpenAI's Responses API through the official ``openai`` client, against mocker workers
whose recipes name a tool-call and a reasoning parser (as ``test_tools``): whole and
streamed responses, instructions, function calls and their outputs, reasoning items,
``text.format`` structured outputs, ``previous_response_id`` over the store, ``GET`` and
``DELETE`` (docs/api.md, "Responses")."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
import pytest_asyncio

from tests.frontend.conftest import WEATHER, Deployment, parsed_models

pytestmark = [pytest.mark.openai_compat, pytest.mark.asyncio(loop_scope="module")]

HERMES = "mt-hermes"  # hermes tool calls, deepseek_r1 thinking
PLAIN = "mt-plain"  # no parser
TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
ASK = "What is the weather in Paris?"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def dep(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Deployment]:
    tmp = Path(tmp_path_factory.mktemp("responses"))
    async with parsed_models(tmp, [HERMES, PLAIN], "--max-stored-responses", "4") as d:
        yield d


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(dep: Deployment) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=f"{dep.frontend_url}/v1", api_key="unused", max_retries=0
    ) as client:
        yield client


async def test_whole_response_with_instructions_and_usage(client: openai.AsyncOpenAI) -> None:
    response = await client.responses.create(
        model=PLAIN, input=ASK, instructions="Answer briefly.", max_output_tokens=12,
        metadata={"team": "a"},
    )  # fmt: skip
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status in ("completed", "incomplete") and response.model == PLAIN
    assert response.output_text and response.metadata == {"team": "a"}
    assert response.output[0].type == "message"
    usage = response.usage
    assert usage is not None and 1 <= usage.output_tokens <= 12
    bare = await client.responses.create(model=PLAIN, input=ASK, max_output_tokens=1)
    assert bare.usage is not None and usage.input_tokens > bare.usage.input_tokens
    assert bare.status == "incomplete"  # one token: the limit ended it
    assert bare.incomplete_details is not None
    assert bare.incomplete_details.reason == "max_output_tokens"


async def test_stream_events_build_the_same_response(client: openai.AsyncOpenAI) -> None:
    kinds: list[str] = []
    sequence: list[int] = []
    async with client.responses.stream(
        model=PLAIN, input=ASK, max_output_tokens=1000, temperature=0.0
    ) as stream:
        async for event in stream:
            kinds.append(event.type)
            sequence.append(event.sequence_number)
        final = await stream.get_final_response()
    whole = await client.responses.create(
        model=PLAIN, input=ASK, max_output_tokens=1000, temperature=0.0
    )
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert "response.output_text.delta" in kinds and "response.output_item.done" in kinds
    assert sequence == list(range(len(sequence)))
    assert final.output_text == whole.output_text  # greedy: the same answer
    assert final.usage is not None and whole.usage is not None
    assert final.usage.output_tokens == whole.usage.output_tokens
    # At the limit, the stream ends with response.incomplete, the reason in it.
    cut = await client.responses.create(model=PLAIN, input=ASK, max_output_tokens=1, stream=True)
    events = [event async for event in cut]
    assert events[-1].type == "response.incomplete"
    details = events[-1].response.incomplete_details
    assert details is not None and details.reason == "max_output_tokens"


async def test_function_call_and_its_output(client: openai.AsyncOpenAI) -> None:
    first = await client.responses.create(
        model=HERMES, input=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    # The next turn: the call's output, continuing the stored response.
    second = await client.responses.create(
        model=HERMES, previous_response_id=first.id, tools=TOOLS, tool_choice="none",
        input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                "output": "18 degrees, sunny"}],
        max_output_tokens=20,
    )  # fmt: skip
    assert not [i for i in second.output if i.type == "function_call"]
    assert second.previous_response_id == first.id
    # The same turn sent whole instead of by reference: the same prompt.
    resent = await client.responses.create(
        model=HERMES, tools=TOOLS, tool_choice="none", max_output_tokens=20,
        input=[{"role": "user", "content": ASK},
               {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
                "arguments": calls[0].arguments},
               {"type": "function_call_output", "call_id": calls[0].call_id,
                "output": "18 degrees, sunny"}],
    )  # fmt: skip
    assert second.usage is not None and resent.usage is not None
    assert second.usage.input_tokens == resent.usage.input_tokens


async def test_streamed_function_call(client: openai.AsyncOpenAI) -> None:
    async with client.responses.stream(
        model=HERMES,
        input=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "name": "get_weather"},
    ) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    calls = [item for item in final.output if item.type == "function_call"]
    assert calls and all(c.name == "get_weather" for c in calls)
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), WEATHER)


async def test_reasoning_is_an_output_item(client: openai.AsyncOpenAI) -> None:
    response = await client.responses.create(model=HERMES, input=ASK, tools=TOOLS)
    kinds = [item.type for item in response.output]
    assert kinds[0] == "reasoning"
    reasoning = response.output[0]
    assert reasoning.type == "reasoning" and reasoning.content
    assert "Let me think" in reasoning.content[0].text


async def test_text_format_json_schema_is_enforced(client: openai.AsyncOpenAI) -> None:
    response = await client.responses.create(
        model=PLAIN, input=ASK, max_output_tokens=200,
        text={"format": {"type": "json_schema", "name": "weather", "schema": WEATHER,
                         "strict": True}},
    )  # fmt: skip
    jsonschema.validate(json.loads(response.output_text), WEATHER)


async def test_store_get_delete_and_bound(client: openai.AsyncOpenAI) -> None:
    kept = await client.responses.create(model=PLAIN, input="one", max_output_tokens=2)
    got = await client.responses.retrieve(kept.id)
    assert got.id == kept.id and got.output_text == kept.output_text
    unstored = await client.responses.create(
        model=PLAIN, input="two", max_output_tokens=2, store=False
    )
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(unstored.id)
    await client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(kept.id)
    # The store keeps 4 (--max-stored-responses): the oldest of 5 is gone.
    made = [await client.responses.create(model=PLAIN, input="x", max_output_tokens=1)
            for _ in range(5)]  # fmt: skip
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(made[0].id)
    assert (await client.responses.retrieve(made[-1].id)).id == made[-1].id
    with pytest.raises(openai.NotFoundError) as caught:
        await client.responses.create(
            model=PLAIN, input="x", max_output_tokens=1, previous_response_id=made[0].id
        )
    assert caught.value.body["param"] == "previous_response_id"  # type: ignore[index]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "bogus": 1}, "bogus"),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "conversation": "c"}, "conversation"),
        ({"input": "x", "tool_choice": "required"}, "tool_choice"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools.0"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input.0"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
async def test_bad_requests_name_the_parameter(
    dep: Deployment, body: dict[str, Any], param: str
) -> None:
    async with httpx.AsyncClient(base_url=dep.frontend_url) as http:
        response = await http.post("/v1/responses", json={"model": PLAIN, **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"].startswith(param), response.text


async def test_requests_are_counted_under_responses(
    dep: Deployment, client: openai.AsyncOpenAI
) -> None:
    await client.responses.create(model=PLAIN, input="x", max_output_tokens=1)
    async with httpx.AsyncClient(base_url=dep.frontend_url) as http:
        text = (await http.get("/metrics")).text
    lines = [
        line for line in text.splitlines()
        if line.startswith("dynamoctl_frontend_requests_total") and 'endpoint="responses"' in line
    ]  # fmt: skip
    assert lines and float(lines[0].rsplit(" ", 1)[1]) >= 1
