"""Structured outputs through the official ``openai`` client against a frontend and a
mocker worker: ``response_format`` (``json_object``, ``json_schema``) and vLLM's
``structured_outputs`` / ``guided_*`` extensions, answered with output that satisfies
them, streamed or not; and the refusals (docs/api.md, "Structured outputs, tools and
reasoning")."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
import pytest_asyncio

from tests.frontend.conftest import MODEL, Deployment

pytestmark = [pytest.mark.openai_compat, pytest.mark.asyncio(loop_scope="module")]

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": True},
        "address": {"$ref": "#/$defs/address"},
        "nickname": {"anyOf": [{"type": "null"}, {"type": "string"}]},
    },
    "required": ["name", "age", "zip", "address"],
    "additionalProperties": False,
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "number": {"type": "integer"}},
            "required": ["street", "number"],
        }
    },
}
ASK = [{"role": "user", "content": "Describe a person as JSON."}]
FORMAT: Any = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def oai(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[openai.AsyncOpenAI]:
    dep = Deployment(Path(tmp_path_factory.mktemp("structured")))
    try:
        # Paced tokens (~3 ms a decode step), so "streamed token by token" does not depend on
        # the frontend keeping up with 0.1 ms steps on a loaded machine (ci19 saw 3 parts).
        dep.worker("--speedup-ratio", "2")
        await dep.wait_for("worker", 1)
        await dep.start_frontend()
        client = openai.AsyncOpenAI(
            base_url=f"{dep.frontend_url}/v1", api_key="unused", max_retries=0
        )
        yield client
        await client.close()
    finally:
        dep.stop()


async def test_json_schema_answer_validates(oai: openai.AsyncOpenAI) -> None:
    for seed in range(4):
        chat = await oai.chat.completions.create(
            model=MODEL, messages=ASK, response_format=FORMAT, seed=seed
        )
        assert chat.choices[0].finish_reason == "stop"  # it ends when the JSON does
        jsonschema.validate(json.loads(chat.choices[0].message.content or ""), PERSON)


async def test_json_schema_streamed_reassembles(oai: openai.AsyncOpenAI) -> None:
    stream = await oai.chat.completions.create(
        model=MODEL, messages=ASK, response_format=FORMAT, stream=True, seed=9
    )
    parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    assert len([p for p in parts if p]) > 3  # token by token, not one blob
    jsonschema.validate(json.loads("".join(parts)), PERSON)


async def test_sdk_parse_with_a_pydantic_model(oai: openai.AsyncOpenAI) -> None:
    from pydantic import BaseModel

    class Weather(BaseModel):
        city: str
        celsius: float
        sunny: bool

    parsed = await oai.chat.completions.parse(model=MODEL, messages=ASK, response_format=Weather)
    assert isinstance(parsed.choices[0].message.parsed, Weather)


async def test_json_object(oai: openai.AsyncOpenAI) -> None:
    chat = await oai.chat.completions.create(
        model=MODEL, messages=ASK, response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(chat.choices[0].message.content or ""), dict)
    text = await oai.completions.create(
        model=MODEL, prompt="JSON:", extra_body={"response_format": {"type": "json_object"}}
    )
    assert isinstance(json.loads(text.choices[0].text), dict)


@pytest.mark.parametrize(
    ("extension", "check"),
    [
        ({"structured_outputs": {"regex": r"\d{3}-[a-z]{4}"}}, r"\d{3}-[a-z]{4}"),
        ({"guided_regex": r"(yes|no), because [a-z]+"}, r"(yes|no), because [a-z]+"),
        ({"structured_outputs": {"choice": ["red", "green"]}}, "red|green"),
        ({"guided_choice": ["positive", "negative"]}, "positive|negative"),
    ],
)
async def test_vllm_extensions(
    oai: openai.AsyncOpenAI, extension: dict[str, Any], check: str
) -> None:
    text = await oai.completions.create(model=MODEL, prompt="Answer:", extra_body=extension)
    assert re.fullmatch(check, text.choices[0].text), text.choices[0].text
    chat = await oai.chat.completions.create(model=MODEL, messages=ASK, extra_body=extension)
    assert re.fullmatch(check, chat.choices[0].message.content or "")


async def test_guided_json_on_completions(oai: openai.AsyncOpenAI) -> None:
    text = await oai.completions.create(
        model=MODEL, prompt="Person:", extra_body={"guided_json": json.dumps(PERSON)}
    )
    jsonschema.validate(json.loads(text.choices[0].text), PERSON)


async def test_max_tokens_cuts_the_answer(oai: openai.AsyncOpenAI) -> None:
    chat = await oai.chat.completions.create(
        model=MODEL, messages=ASK, response_format=FORMAT, max_tokens=4
    )
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage is not None and chat.usage.completion_tokens == 4


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        # The mocker (the engine here) cannot enforce these: 400 naming engine and why.
        ({"structured_outputs": {"grammar": 'root ::= "a"'}}, "structured_outputs.grammar",
         "engine (mocker) cannot enforce this grammar constraint"),
        ({"response_format": {"type": "json_schema", "json_schema": {
            "name": "n", "schema": {"type": "string", "not": {"const": "x"}}}}},
         "response_format.json_schema.schema", "does not model the keyword 'not'"),
        ({"guided_regex": r"(a)\1"}, "guided_regex", "regular expression construct"),
        # Not a JSON Schema at all.
        ({"response_format": {"type": "json_schema", "json_schema": {
            "name": "n", "schema": {"type": "strnig"}}}},
         "response_format.json_schema.schema", "not a valid JSON Schema"),
        ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
        # Two constraints, or a malformed one.
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice",
         "both constrain the output"),
        ({"response_format": {"type": "xml"}}, "response_format", "json_schema"),
        ({"structured_outputs": {"whitespace_pattern": " "}}, None, "whitespace_pattern"),
    ],
)  # fmt: skip
async def test_refusals(
    oai: openai.AsyncOpenAI, fields: dict[str, Any], param: str | None, says: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await oai.chat.completions.create(model=MODEL, messages=ASK, extra_body=fields)
    assert says in caught.value.message
    if param is not None:
        assert caught.value.body["param"] == param
