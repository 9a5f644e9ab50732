"""Structured outputs and tool calls: what they cost the frontend and the mocker, per
request and per streamed token (docs/api.md, "Structured outputs, tools and reasoning").

    python benchmarks/output_parsing.py [--out benchmarks/results/output_parsing.json]

1. Per streamed delta: the frontend's plain text path (an SSE event from a pre-split
   frame) against a chat answer read by the shaper (reasoning, then a Hermes tool call):
   ``shaper.push`` plus the delta's SSE event, the same work ``frontend/app.py`` does.
2. Per request: the frontend's plan (schema checks, the mocker's dry-run generation) for
   a ``json_schema`` request and a ``tools`` request; the mocker's script (the answer
   generated, validated and tokenised).

In-process, one core, no servers: the numbers are the code's own costs.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from collections.abc import Callable
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import Any

from dynamoctl.engines.api import GenerateRequest
from dynamoctl.engines.mocker.output import Scripts, answer_text
from dynamoctl.frontend.protocol import ChatCompletionRequest
from dynamoctl.frontend.shape import Shape, sse_data
from dynamoctl.parsers import REASONING_PARSERS, TOOL_PARSERS
from dynamoctl.parsers.shaper import ChatShaper
from dynamoctl.structured.plan import plan_chat
from dynamoctl.tokenizer import load_tokenizer
from dynamoctl.wire.structured import OutputTraits

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "zip": {"pattern": "^[0-9]{5}$"}},
            "required": ["street", "zip"],
        },
    },
    "required": ["name", "age", "address"],
}
TOOLS = [
    {"type": "function", "function": {"name": f"tool_{i}", "parameters": SCHEMA}} for i in range(4)
]
TRAITS = OutputTraits(engine="mocker", tool_call_parser="hermes", reasoning_parser="deepseek_r1")


def per_call_us(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # warm
    began = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - began) / repeat * 1e6


def token_deltas() -> list[str]:
    """A thinking answer with a Hermes call, as the detokenizer hands it out (per token)."""
    tokenizer = load_tokenizer("builtin")
    thought = REASONING_PARSERS["deepseek_r1"]().write(" ".join(["consider the options"] * 60))
    call = TOOL_PARSERS["hermes"]().write("tool_0", json.dumps({"name": "x" * 30, "age": 7}))
    ids = tokenizer.encode(thought + call, add_special_tokens=False)
    return [tokenizer.decode([i]) for i in ids]


def streaming(deltas: list[str], repeat: int) -> dict[str, Any]:
    shape = Shape("chat", "chatcmpl-bench", "bench-model")
    frame = shape.text_frame(False)
    assert frame is not None
    head, tail = frame

    def plain() -> None:
        for text in deltas:
            head + encode_basestring_ascii(text).encode() + tail

    def shaped() -> None:
        shaper = ChatShaper(REASONING_PARSERS["deepseek_r1"](), TOOL_PARSERS["hermes"]())
        for text in [*deltas, None]:
            for delta in shaper.push(text) if text is not None else shaper.close():
                chunk = shape.chunk(None)
                chunk["choices"][0]["delta"] = delta
                sse_data(chunk)

    plain_us = per_call_us(plain, repeat) / len(deltas)
    shaped_us = per_call_us(shaped, repeat) / len(deltas)
    return {
        "deltas": len(deltas),
        "plain_us_per_delta": round(plain_us, 2),
        "shaped_us_per_delta": round(shaped_us, 2),
    }


def per_request(repeat: int) -> dict[str, Any]:
    ask = [{"role": "user", "content": "hi"}]
    schema_body = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": ask, "response_format": {
            "type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}}
    )  # fmt: skip
    tools_body = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": ask, "tools": TOOLS}
    )
    asked = schema_body.output_constraint()
    schema_plan = plan_chat(schema_body, asked, TRAITS, "user")
    tools_plan = plan_chat(tools_body, None, TRAITS, "user")
    assert schema_plan.spec is not None and tools_plan.spec is not None
    scripts = Scripts("builtin")
    stops = [8188]
    rng = random.Random(0)
    return {
        "plan_json_schema_us": round(
            per_call_us(lambda: plan_chat(schema_body, asked, TRAITS, "user"), repeat), 1
        ),
        "plan_tools_us": round(
            per_call_us(lambda: plan_chat(tools_body, None, TRAITS, "user"), repeat), 1
        ),
        "mocker_answer_json_schema_us": round(
            per_call_us(lambda: answer_text(schema_plan.spec, rng), repeat),
            1,  # type: ignore[arg-type]
        ),
        "mocker_script_tool_call_us": round(
            per_call_us(
                lambda: scripts.script(
                    GenerateRequest("r", [1], 512, stops, output=tools_plan.spec), 1
                ),
                repeat,
            ),
            1,
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/output_parsing.json"))
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    deltas = token_deltas()
    result = {
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "streaming": streaming(deltas, args.repeat),
        "per_request": per_request(args.repeat),
    }
    print(json.dumps(result, indent=2))
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
