"""What the mocker answers structured requests with, and what each engine is asked:
instances of JSON Schemas and matches of regular expressions that validate (over many
seeds), refusals that say why, the constraint in vLLM's, SGLang's and TensorRT-LLM's
terms, and the constraint travelling on the wire."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import jsonschema
import pytest

from dynamoctl.engines.api import GenerateRequest
from dynamoctl.engines.mocker.output import Scripts, answer_text
from dynamoctl.structured.engines import refusal, sglang_params, trtllm_fields, vllm_fields
from dynamoctl.structured.instances import Unsupported, json_instance, regex_instance
from dynamoctl.tokenizer import load_tokenizer
from dynamoctl.wire import engine as wire_engine
from dynamoctl.wire.ids import packed
from dynamoctl.wire.structured import OutputConstraint, OutputSpec, ToolOffer

pytestmark = pytest.mark.openai_compat

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"type": "array", "items": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
     "minItems": 2, "maxItems": 4},
    {"type": "string", "format": "date-time"},
    {"type": "string", "format": "uuid"},
    {"type": ["integer", "null"], "multipleOf": 7, "minimum": 10, "maximum": 40},
    {"enum": ["x", 1, None]},
    {"const": {"k": [1]}},
    {"type": "object", "properties": {"p": {"$ref": "#/$defs/p"}}, "required": ["p"],
     "$defs": {"p": {"type": "string", "pattern": "^[A-Z][a-z]{2,5}$"}}},
    {"allOf": [{"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]},
               {"properties": {"b": {"type": "null"}}, "required": ["b"]}]},
    {"oneOf": [{"type": "string", "maxLength": 3}, {"type": "integer", "minimum": 5}]},
    {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}],
     "items": False, "minItems": 2},
    {"type": "object", "properties": {"v": {"type": "integer"},
     "kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["v", "kids"]},
    {"type": "object", "additionalProperties": {"type": "integer"}, "required": ["x", "y"]},
]  # fmt: skip


@pytest.mark.parametrize("schema", SCHEMAS)
def test_json_instances_validate(schema: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator.check_schema(schema)
    for seed in range(40):
        value = json_instance(schema, random.Random(seed))
        jsonschema.validate(value, schema)


@pytest.mark.parametrize(
    "pattern",
    [r"\d{3}-\d{4}", r"(cat|dog)s?", r"[A-Fa-f0-9]{8}", r"[^,\s]+(, [^,\s]+)*",
     r"^\w+@\w+\.(com|org)$", r"a.b*c+d?", r"[.\-_]{2}", r"(?:x|yz){2,3}"],
)  # fmt: skip
def test_regex_instances_match(pattern: str) -> None:
    for seed in range(40):
        assert re.fullmatch(pattern, regex_instance(pattern, random.Random(seed)))


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ({"not": {"type": "string"}}, "keyword 'not'"),
        ({"type": "object", "patternProperties": {"^a": {}}}, "keyword 'patternProperties'"),
        ({"type": "integer", "minimum": 5, "maximum": 1}, "bounds are empty"),
        ({"$ref": "https://example.com/s.json"}, "only local references"),
        ({"type": "string", "pattern": "(?=a)a"}, "regular expression construct"),
        ({"type": "string", "minLength": 5, "maxLength": 2}, "could not satisfy"),
    ],
)
def test_what_the_generator_refuses(schema: dict[str, Any], why: str) -> None:
    with pytest.raises(Unsupported, match=re.escape(why)):
        json_instance(schema, random.Random(0))


def test_engine_refusals() -> None:
    every = [
        OutputConstraint(json_schema={"type": "array", "uniqueItems": True}),
        OutputConstraint(json_object=True),
        OutputConstraint(regex="a+"),
        OutputConstraint(choice=["a", "b"]),
        OutputConstraint(grammar='root ::= "a"'),
    ]
    assert all(refusal("vllm", c) is None for c in every)
    for engine in ("sglang", "trtllm"):
        why = refusal(engine, every[0])
        assert why is not None and "xgrammar" in why and "'uniqueItems' (at #)" in why
        assert all(refusal(engine, c) is None for c in every[1:])
    assert refusal("mocker", every[4]) == "it cannot generate text from a grammar"
    assert refusal(None, every[1]) is not None and "which engine" in (refusal(None, every[1]) or "")


def test_constraint_in_each_engines_terms() -> None:
    schema = {"type": "object"}
    assert vllm_fields(OutputConstraint(json_schema=schema)) == {"json": schema}
    assert vllm_fields(OutputConstraint(choice=["a"])) == {"choice": ["a"]}
    assert vllm_fields(OutputConstraint(json_object=True)) == {"json_object": True}
    assert sglang_params(OutputConstraint(json_schema=schema)) == {
        "json_schema": '{"type": "object"}'
    }
    assert sglang_params(OutputConstraint(choice=["a.b", "c"])) == {"regex": r"(a\.b|c)"}
    assert sglang_params(OutputConstraint(grammar="g")) == {"ebnf": "g"}
    assert trtllm_fields(OutputConstraint(json_schema=schema)) == {"json": schema}
    assert trtllm_fields(OutputConstraint(choice=["x"])) == {"regex": "(x)"}
    assert trtllm_fields(OutputConstraint(json_object=True)) == {"json_object": True}


def test_spec_travels_on_the_generate_request() -> None:
    spec = OutputSpec(
        constraint=OutputConstraint(json_schema={"type": "object", "required": ["a"]}),
        tools=[ToolOffer("f", {"type": "object"})],
        tool_format="hermes",
    )
    request = GenerateRequest("r", packed([1, 2]), 5, [9], output=spec)
    assert wire_engine.decode_request(wire_engine.encode(request)) == request
    plain = GenerateRequest("r", [1, 2], 5)
    assert wire_engine.decode_request(wire_engine.encode(plain)).output is None


def test_mocker_script_ends_with_eos_and_decodes_to_the_answer() -> None:
    spec = OutputSpec(tools=[ToolOffer("f", SCHEMAS[0])], tool_format="hermes",
                      reasoning_format="deepseek_r1")  # fmt: skip
    text, complete = answer_text(spec, random.Random(4))
    assert complete and text.startswith("<think>\n") and "<tool_call>" in text
    request = GenerateRequest("r", [1], 200, [8188, 8191], output=spec)
    script = Scripts("builtin").script(request, seed=4)
    assert script is not None and script[-1] == 8188
    assert load_tokenizer("builtin").decode(script) == text
    # Thinking alone is not an answer: sampled text follows, no end-of-sequence.
    thinking = OutputSpec(reasoning_format="qwen3")
    assert answer_text(thinking, random.Random(0))[1] is False
    ignore = GenerateRequest("r", [1], 200, [], ignore_eos=True, output=spec)
    assert 8188 not in (Scripts("builtin").script(ignore, seed=4) or [])
    assert json.loads(answer_text(OutputSpec(constraint=OutputConstraint(json_object=True)),
                                  random.Random(0))[0])  # fmt: skip


def test_schema_checks_are_cached_within_bounds() -> None:
    from dynamoctl.structured import engines

    calls: list[bytes] = []

    def check(encoded: bytes) -> str | None:
        calls.append(encoded)
        return f"seen {len(calls)}"

    engines._cache.clear()
    assert engines.cached("t", lambda: check(b"a"), b"a") == "seen 1"
    assert engines.cached("t", lambda: check(b"a"), b"a") == "seen 1"  # remembered
    assert engines.cached("u", lambda: check(b"a"), b"a") == "seen 2"  # another kind
    big = b"x" * (engines.CACHE_MAX_BYTES + 1)
    engines.cached("t", lambda: check(big), big)
    engines.cached("t", lambda: check(big), big)
    assert calls.count(big) == 2 and all(key[1] != big for key in engines._cache)
    for i in range(engines.CACHE_ENTRIES + 10):
        engines.cached("t", lambda: None, str(i).encode())
    assert len(engines._cache) == engines.CACHE_ENTRIES
