"""The compatibility policy (docs/api.md) is one declaration: the table in the docs, the
request models and the validation all derive from ``dynamoctl/frontend/compat_policy.py``, and
every row behaves as it says (through the real body parser, as the frontend runs it)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from dynamoctl.frontend import compat, compat_policy
from dynamoctl.frontend.anthropic.protocol import CountTokensRequest, MessagesRequest
from dynamoctl.frontend.body import decode_body, engine_request
from dynamoctl.frontend.embeddings import EmbeddingRequest
from dynamoctl.frontend.errors import OpenAIError
from dynamoctl.frontend.protocol import ChatCompletionRequest, CompletionRequest, StreamOptions
from dynamoctl.frontend.responses.protocol import ResponsesRequest
from dynamoctl.frontend.tokenization import DetokenizeRequest, TokenizeRequest

pytestmark = pytest.mark.openai_compat

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
MODELS: dict[str, type[Any]] = {
    "chat": ChatCompletionRequest,
    "completions": CompletionRequest,
    "tokenize": TokenizeRequest,
    "detokenize": DetokenizeRequest,
    "messages": MessagesRequest,
    "count_tokens": CountTokensRequest,
    "responses": ResponsesRequest,
    "embeddings": EmbeddingRequest,
}
OBJECTS = {"stream_options": StreamOptions}
"""The object parameters whose keys have rows of their own (``stream_options.include_usage``)."""
BASE: dict[str, dict[str, Any]] = {
    "chat": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "completions": {"model": "m", "prompt": "hi"},
    "tokenize": {"prompt": "hi"},
    "detokenize": {"tokens": [1]},
    "messages": {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    "count_tokens": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "responses": {"model": "m", "input": "hi"},
    "embeddings": {"model": "m", "input": "hi"},
}
ROWS = [(e, p) for e in compat_policy.ENDPOINTS for p in compat.params(e).values()]
UNSUPPORTED = [(e, p) for e, p in ROWS if p.support is not compat_policy.Support.SUPPORTED]


def parse(endpoint: str, **fields: Any) -> Any:
    raw = json.dumps({**BASE[endpoint], **fields}).encode()
    return decode_body(raw, MODELS[endpoint])


def with_param(name: str, value: Any) -> dict[str, Any]:
    """Request fields that set the row ``name`` (a dotted row: a key of its object)."""
    within, _, key = name.rpartition(".")
    if not within:
        return {name: value}
    return {within: {key: value}, **({"stream": True} if within == "stream_options" else {})}


def test_docs_table_is_generated_from_the_policy() -> None:
    text = DOC.read_text(encoding="utf-8")
    start, end = text.index(compat.BEGIN), text.index(compat.END) + len(compat.END)
    assert text[start:end] == compat.render_table(), f"run: {compat.REGENERATE}"


@pytest.mark.parametrize("endpoint", compat_policy.ENDPOINTS)
def test_supported_rows_are_exactly_the_request_models_fields(endpoint: str) -> None:
    supported = set(compat.params(endpoint, compat_policy.Support.SUPPORTED))
    rows = set(compat.params(endpoint))
    objects = {name: m for name, m in OBJECTS.items() if name in MODELS[endpoint].model_fields}
    models: dict[str, type[Any]] = {"": MODELS[endpoint], **objects}
    for within, model in models.items():

        def level(names: set[str], within: str = within) -> set[str]:
            prefix = f"{within}." if within else ""
            keys = {n.removeprefix(prefix) for n in names if n.startswith(prefix)}
            return {k for k in keys if "." not in k}

        assert level(supported) == set(model.model_fields), within or "top level"
        assert not level(rows - supported) & set(model.model_fields), within or "top level"
    dotted = {n.partition(".")[0] for n in rows if "." in n}
    assert dotted <= set(objects)  # every object parameter with rows is checked here


def test_an_objects_rows_are_the_same_on_every_endpoint_with_it() -> None:
    # One model (StreamOptions) checks its keys for both endpoints: one policy for both.
    for p in compat_policy.POLICY:
        within = p.name.partition(".")[0]
        if "." in p.name:
            having = tuple(e for e in compat_policy.ENDPOINTS if within in compat.params(e))
            assert p.endpoints == having, p.name


def test_each_parameter_has_one_row_per_endpoint() -> None:
    for endpoint in compat_policy.ENDPOINTS:
        names = [p.name for p in compat_policy.POLICY if endpoint in p.endpoints]
        assert len(names) == len(set(names)), endpoint


@pytest.mark.parametrize(("endpoint", "param"), UNSUPPORTED, ids=lambda v: getattr(v, "name", v))
def test_neutral_values_are_accepted_and_others_refused_by_name(
    endpoint: str, param: compat_policy.Param
) -> None:
    within, _, key = param.name.rpartition(".")
    for value in (None, *param.neutral):
        body = parse(endpoint, **with_param(param.name, value))
        holder = getattr(body, within) if within else body
        assert key not in holder.model_fields_set
    for value in ({"asks": "something"}, "something", 7):
        if compat.is_neutral(value, param):
            continue
        with pytest.raises(OpenAIError) as refused:
            parse(endpoint, **with_param(param.name, value))
        assert refused.value.status == 400 and refused.value.param == param.name
        assert f"'{param.name}' is not supported" in refused.value.message


def test_what_sdks_send_by_default_is_accepted() -> None:
    # vllm bench serve's `openai` backend, and values SDKs and UIs fill in.
    parse("completions", repetition_penalty=1.0, logprobs=None, max_tokens=8, stream=True,
          stream_options={"include_usage": True}, ignore_eos=True)  # fmt: skip
    parse("completions", best_of=1, suffix=None, echo=False, n=1, logit_bias={},
          presence_penalty=0, frequency_penalty=0, max_completion_tokens=8)  # fmt: skip
    parse("chat", store=False, metadata={}, n=None, logprobs=False, top_logprobs=None,
          presence_penalty=0, frequency_penalty=0, tools=[], tool_choice="none",
          parallel_tool_calls=True, response_format={"type": "text"}, service_tier="auto",
          modalities=["text"], stream_options=None)  # fmt: skip


def test_a_dotted_row_is_a_key_of_its_object_only() -> None:
    # A top-level key spelt like an object's key is unknown, not the object's row.
    with pytest.raises(OpenAIError) as refused:
        parse("chat", **{"stream_options.include_obfuscation": False})
    assert refused.value.param == "stream_options.include_obfuscation"
    assert "unknown or unsupported parameter" in refused.value.message
    options = {"include_usage": True, "continuous_usage_stats": True,
               "include_obfuscation": False}  # fmt: skip
    for endpoint in compat_policy.BOTH:
        body = parse(endpoint, stream=True, stream_options=options)
        assert body.stream_options is not None and body.stream_options.usage_every_chunk()
        plain = parse(endpoint, stream=True, stream_options={"continuous_usage_stats": False})
        assert plain.stream_options is not None and not plain.stream_options.usage_every_chunk()


def test_neutral_comparison_is_by_json_type() -> None:
    best_of = compat.params("completions")["best_of"]
    assert compat.is_neutral(1, best_of) and compat.is_neutral(1.0, best_of)
    assert not compat.is_neutral(True, best_of)  # true is not 1 in JSON
    store = compat.params("chat")["store"]
    assert not compat.is_neutral(0, store)


def test_every_sampling_parameter_reaches_the_engine_request() -> None:
    body = parse(
        "chat", temperature=0.5, top_p=0.9, top_k=40, min_p=0.05, presence_penalty=0.5,
        frequency_penalty=-0.5, repetition_penalty=1.2, seed=11, stop_token_ids=[5, 6],
        logit_bias={"17": -100, "3": 2.5}, min_tokens=3, ignore_eos=True, logprobs=True,
        top_logprobs=4, n=3,
    )  # fmt: skip
    first = engine_request(body, [1, 2], 20, [], 0)
    assert (first.temperature, first.top_p, first.top_k, first.min_p) == (0.5, 0.9, 40, 0.05)
    assert (first.presence_penalty, first.frequency_penalty) == (0.5, -0.5)
    assert first.repetition_penalty == 1.2 and first.seed == 11
    assert first.user_stop_token_ids == [5, 6] and first.logit_bias == {17: -100.0, 3: 2.5}
    assert first.min_tokens == 3 and first.ignore_eos and first.logprobs == 4
    assert engine_request(body, [1, 2], 20, [], 2).seed == 13  # choice i: seed + i
    plain = engine_request(parse("completions"), [1], 5, [9], 0)
    assert plain.logprobs is None and plain.stop_token_ids == [9] and plain.top_p is None


@pytest.mark.parametrize(
    ("endpoint", "fields", "param"),
    [
        ("chat", {"top_logprobs": 2}, "top_logprobs"),
        ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("completions", {"logprobs": 21}, "logprobs"),
        ("completions", {"echo": True, "logprobs": 1, "stream": True}, "echo"),
        ("completions", {"prompt_logprobs": 0, "stream": True}, "prompt_logprobs"),
        ("completions", {"prompt_logprobs": -1}, "prompt_logprobs"),
        ("completions", {"stream_options": {"include_usage": True}}, "stream_options"),
        ("completions", {"stop": ["a"] * 5}, "stop"),
        ("completions", {"guided_json": "{not json"}, "guided_json"),
        ("completions", {"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
        ("completions", {"structured_outputs": {}}, "structured_outputs"),
        ("completions", {"structured_outputs": {"json": "[1]"}}, "structured_outputs.json"),
        ("chat", {"tool_choice": "required"}, "tool_choice"),
        ("chat", {"tools": [{"type": "function", "function": {"name": "f"}}],
                  "tool_choice": {"type": "function", "function": {"name": "g"}}},
         "tool_choice.function.name"),
        ("chat", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "messages.0.content"),
        ("completions", {"logit_bias": {"x": 1}}, "logit_bias"),
        ("completions", {"logit_bias": {"1": 101}}, "logit_bias.1"),
        ("completions", {"n": 0}, "n"),
        ("completions", {"prompt": ["a", [1]]}, "prompt"),
        ("completions", {"prompt": [[1], []]}, "prompt"),
        ("completions", {"stop_token_ids": [-1]}, "stop_token_ids"),
        ("chat", {"repetition_penalty": 0}, "repetition_penalty"),
        ("chat", {"messages": [{"role": "assistant", "tool_calls": [{"id": 1}]}]},
         "messages.0.tool_calls.0.id"),
    ],
)  # fmt: skip
def test_bad_values_of_supported_parameters_name_the_parameter(
    endpoint: str, fields: dict[str, Any], param: str | None
) -> None:
    with pytest.raises(OpenAIError) as refused:
        parse(endpoint, **fields)
    assert refused.value.status == 400 and refused.value.param == param
    # The frontend's words only: no library's prefix ("Value error, ", "Assertion failed, ").
    assert not re.search(r"(Value|Assertion) (error|failed), ", refused.value.message)


def test_batched_prompts_and_names() -> None:
    batch = parse("completions", prompt=[[1, 2], [3]])
    assert isinstance(batch, CompletionRequest) and batch.prompts() == [[1, 2], [3]]
    assert parse("completions", prompt=[4, 5]).prompts() == [[4, 5]]  # type: ignore[union-attr]
    chat = parse("chat", messages=[{"role": "user", "content": "x", "name": "ann"}])
    assert isinstance(chat, ChatCompletionRequest)
    assert chat.messages[0].for_template() == {"role": "user", "content": "x", "name": "ann"}
