"""The tool-call and reasoning parsers, and the shaper that turns a chat answer into
``reasoning_content``, ``content`` and ``tool_calls``: what each format reads, what it
leaves as content, and that a stream cut anywhere says exactly what the whole answer
says."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynamoctl.parsers import REASONING_PARSERS, TOOL_PARSERS
from dynamoctl.parsers.shaper import ChatShaper, ForcedCall
from dynamoctl.settings import OutputParserSettings

pytestmark = pytest.mark.openai_compat

CASES: list[tuple[dict[str, Any], str, dict[str, Any]]] = [
    # (shaper arguments, model output, expected message)
    ({"tools": "hermes"},
     'Checking.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
     '<tool_call>{"name": "g", "arguments": {}}</tool_call>',
     {"content": "Checking.\n\n", "calls": [("f", {"a": 1}), ("g", {})]}),
    ({"tools": "hermes"}, '<tool_call>{"name": "f", "arguments": {"a": [1, 2]}}',  # cut short
     {"content": None, "calls": [("f", {"a": [1, 2]})]}),
    ({"tools": "hermes"}, '<tool_call>{"name": broken</tool_call>',
     {"content": '<tool_call>{"name": broken</tool_call>', "calls": []}),
    ({"tools": "hermes"},  # one broken call among good ones: only it is content
     '<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>{bad</tool_call>'
     '<tool_call>{"name": "g", "arguments": {"z": null}}</tool_call>',
     {"content": "<tool_call>{bad</tool_call>", "calls": [("f", {}), ("g", {"z": None})]}),
    ({"tools": "hermes"}, "a < b and <tool_ is not a tag",
     {"content": "a < b and <tool_ is not a tag", "calls": []}),
    ({"tools": "llama3_json"},
     '<|python_tag|>{"name": "f", "parameters": {"x": "y"}}; {"name": "g", "parameters": {}}',
     {"content": None, "calls": [("f", {"x": "y"}), ("g", {})]}),
    ({"tools": "llama3_json"}, 'Sure: {"name": "f", "parameters": {}}',
     {"content": 'Sure: {"name": "f", "parameters": {}}', "calls": []}),
    ({"tools": "llama3_json"}, '{"name": "f", "parameters": ',
     {"content": '{"name": "f", "parameters": ', "calls": []}),
    ({"tools": "hermes"}, '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
     {"content": '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', "calls": []}),
    # A JSON answer that is not a call (no arguments): content, as the model wrote it.
    ({"tools": "llama3_json"}, '{"name": "f", "age": 3}',
     {"content": '{"name": "f", "age": 3}', "calls": []}),
    ({"tools": "mistral"}, '[TOOL_CALLS][{"name": "f", "arguments": {"q": 1}}]',
     {"content": None, "calls": [("f", {"q": 1})]}),
    ({"reasoning": "deepseek_r1"}, "<think>\nhmm </thi\n</think>\n\nThe answer",
     {"reasoning": "\nhmm </thi\n", "content": "The answer"}),
    ({"reasoning": "deepseek_r1"}, "no opening tag</think>answer",
     {"reasoning": "no opening tag", "content": "answer"}),
    ({"reasoning": "deepseek_r1"}, "still thinking when cut",
     {"reasoning": "still thinking when cut", "content": ""}),
    ({"reasoning": "qwen3"}, "no thinking</think>", {"reasoning": None,
                                                      "content": "no thinking</think>"}),
    ({"reasoning": "qwen3", "tools": "hermes"},
     '<think>t</think>\n<tool_call>{"name": "f", "arguments": {}}</tool_call>',
     {"reasoning": "t", "content": None, "calls": [("f", {})]}),
    ({"forced": ForcedCall()}, '[{"name": "f", "parameters": {"a": 1}}]',
     {"content": None, "calls": [("f", {"a": 1})]}),
    ({"forced": ForcedCall("f")}, '{"a": 1}', {"content": None, "calls": [("f", {"a": 1})]}),
    ({"forced": ForcedCall("f")}, '{"a": 1', {"content": '{"a": 1', "calls": []}),
    ({"tools": "hermes", "parallel_tool_calls": False},
     '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
     '<tool_call>{"name": "g", "arguments": {}}</tool_call>',
     {"content": None, "calls": [("f", {})]}),
]  # fmt: skip


def shaper(args: dict[str, Any]) -> ChatShaper:
    reasoning, tools = args.get("reasoning"), args.get("tools")
    return ChatShaper(
        REASONING_PARSERS[reasoning]() if reasoning else None,
        TOOL_PARSERS[tools]() if tools else None,
        args.get("forced"),
        args.get("parallel_tool_calls", True),
        offered=("f", "g"),
    )


@pytest.mark.parametrize(("args", "output", "expected"), CASES)
def test_whole_answer(args: dict[str, Any], output: str, expected: dict[str, Any]) -> None:
    sh = shaper(args)
    message = sh.message(output)
    assert message["content"] == expected["content"]
    if "reasoning" in expected:
        assert message["reasoning_content"] == expected["reasoning"]
    calls = [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in message.get("tool_calls", [])
    ]
    assert calls == expected.get("calls", [])
    assert sh.finish_reason("stop") == ("tool_calls" if calls else "stop")
    assert sh.finish_reason("length") == "length"


@settings(max_examples=60, deadline=None)
@given(case=st.sampled_from(CASES), seed=st.integers(0, 2**32))
def test_any_stream_cut_says_what_the_whole_says(
    case: tuple[dict[str, Any], str, dict[str, Any]], seed: int
) -> None:
    args, output, _ = case
    whole = shaper(args).message(output)
    rng, sh = random.Random(seed), shaper(args)
    deltas, at = [], 0
    while at < len(output):
        step = rng.randint(1, 6)
        deltas += sh.push(output[at : at + step])
        at += step
    deltas += sh.close()
    joined: dict[str, Any] = {"content": "", "reasoning_content": "", "tool_calls": []}
    for delta in deltas:
        for key, value in delta.items():
            joined[key] += value
    if whole["content"] is None:  # only calls: at most whitespace was streamed around them
        assert not joined["content"].strip()
    else:
        assert joined["content"] == whole["content"]
    assert joined["reasoning_content"] == (whole.get("reasoning_content") or "")
    assert [c["function"] for c in joined["tool_calls"]] == [
        c["function"] for c in whole.get("tool_calls", [])
    ]
    assert [c["index"] for c in joined["tool_calls"]] == list(range(len(joined["tool_calls"])))


@pytest.mark.parametrize("name", TOOL_PARSERS.names())
def test_what_a_format_writes_it_reads(name: str) -> None:
    parser = TOOL_PARSERS[name]()
    written = parser.write("lookup", json.dumps({"q": "Paris é", "n": [1, 2]}))
    start = parser.start(written)
    assert start is not None
    parsed = parser.parse(written[start:])
    assert parsed is not None
    calls, rest = parsed
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("lookup", {"q": "Paris é", "n": [1, 2]})
    ]
    assert rest == ""


def test_parser_names_are_checked() -> None:
    assert OutputParserSettings(tool_call_parser="hermes").tool_call_parser == "hermes"
    with pytest.raises(ValueError, match="unknown tool call parser 'hermez'; valid: hermes"):
        OutputParserSettings(tool_call_parser="hermez")
    with pytest.raises(ValueError, match="unknown reasoning parser 'r1'; valid: deepseek_r1"):
        OutputParserSettings(reasoning_parser="r1")


def test_a_closed_call_streams_before_the_answer_ends() -> None:
    sh = shaper({"tools": "hermes"})
    assert sh.push("Let me look. <tool_") == [{"content": "Let me look. "}]
    assert sh.push('call>{"name": "f", "arguments": {"a"') == []
    delta, between = sh.push(": 1}}</tool_call>\n<tool_call>")
    assert between == {"content": "\n"}
    assert delta["tool_calls"][0]["index"] == 0
    assert delta["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert sh.push('{"name": "g", "arguments": {}}') == []  # not closed yet
    (last,) = sh.close()  # the end of the answer closes it
    assert last["tool_calls"][0]["index"] == 1 and sh.finish_reason("stop") == "tool_calls"
