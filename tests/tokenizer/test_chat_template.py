"""Chat templates: the builtin Llama-3 layout, transformers' environment, clear failures."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dynamoctl.tokenizer import ChatTemplateError, Tokenizer, load_tokenizer
from tests.tokenizer.conftest import MakeModelDir

SYSTEM_USER = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 2 + 2?"},
]


def test_builtin_system_user_prompt(builtin: Tokenizer) -> None:
    assert builtin.apply_chat_template(SYSTEM_USER) == (
        "<|begin_of_text|>"
        "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2 + 2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_builtin_without_generation_prompt(builtin: Tokenizer) -> None:
    prompt = builtin.apply_chat_template(SYSTEM_USER, add_generation_prompt=False)
    assert prompt.endswith("What is 2 + 2?<|eot_id|>")
    assert builtin.apply_chat_template(SYSTEM_USER).startswith(prompt)


def test_builtin_multi_turn_trims_and_has_no_system_by_default(builtin: Tokenizer) -> None:
    messages = [
        {"role": "user", "content": "  Hi!\n"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    assert builtin.apply_chat_template(messages, add_generation_prompt=False) == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
    )


def test_builtin_prompt_encodes_to_special_tokens(builtin: Tokenizer) -> None:
    ids = builtin.encode(builtin.apply_chat_template(SYSTEM_USER), add_special_tokens=False)
    assert ids[0] == builtin.bos_token_id and ids.count(builtin.bos_token_id) == 1
    assert ids.count(builtin.token_to_id("<|eot_id|>")) == 2
    assert ids[-1] != builtin.token_to_id("<|eot_id|>")


def test_builtin_content_parts_and_tools(builtin: Tokenizer) -> None:
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [
            {"type": "text", "text": "Add "}, {"type": "text", "text": "1+2"}
        ]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
    ]  # fmt: skip
    prompt = builtin.apply_chat_template(messages, tools=tools)
    assert "<|start_header_id|>user<|end_header_id|>\n\nAdd 1+2<|eot_id|>" in prompt
    assert '\n\n{"name": "add", "parameters": {"a": 1}}<|eot_id|>' in prompt
    assert "<|start_header_id|>ipython<|end_header_id|>\n\n3<|eot_id|>" in prompt
    system = prompt.split("<|eot_id|>")[0]
    assert json.dumps(tools[0], indent=4) in system  # tojson(indent=4), not HTML-escaped


def test_no_chat_template_is_a_clear_error(make_model_dir: MakeModelDir) -> None:
    tok = load_tokenizer(str(make_model_dir(config={"eos_token": "</s>"})))
    assert tok.chat_template is None
    with pytest.raises(ChatTemplateError, match=r"has no chat template.*chat_template"):
        tok.apply_chat_template(SYSTEM_USER)


def test_transformers_environment(make_model_dir: MakeModelDir) -> None:
    template = (
        "{% for m in messages %}{% if m['role'] == 'bad' %}"
        "{{ raise_exception('no bad roles') }}{% endif %}"
        "{% if loop.index > 2 %}{% break %}{% endif %}"  # loopcontrols
        "{{ bos_token }}{{ m | tojson }}|{% endfor %}"
        "{{ strftime_now('%Y')[:2] }}{{ extra }}"
    )
    tok = load_tokenizer(
        str(make_model_dir(config={"bos_token": "</s>", "chat_template": template}))
    )
    out = tok.apply_chat_template([{"role": "u", "content": "<é>"}] * 3, extra="!")
    assert out == '</s>{"role": "u", "content": "<é>"}|' * 2 + "20!"
    with pytest.raises(ChatTemplateError, match="no bad roles"):
        tok.apply_chat_template([{"role": "bad", "content": ""}])


@pytest.mark.parametrize(
    "template",
    [
        "{{ messages.append(1) }}",  # immutable: no mutating the request
        "{{ messages.__class__.__mro__ }}",  # sandbox: no reaching Python internals
        "{{ messages[0]['content'] + 1 }}",  # a TypeError on request data
    ],
)
def test_template_failures_are_chat_template_errors(
    make_model_dir: MakeModelDir, template: str
) -> None:
    tok = load_tokenizer(str(make_model_dir(config={"chat_template": template})))
    with pytest.raises(ChatTemplateError, match="rejected the conversation"):
        tok.apply_chat_template(SYSTEM_USER)


def test_syntax_error_names_the_file(make_model_dir: MakeModelDir) -> None:
    tok = load_tokenizer(str(make_model_dir(config={"chat_template": "{% if %}"})))
    with pytest.raises(ChatTemplateError, match=r"does not compile .*tokenizer_config.json"):
        tok.apply_chat_template(SYSTEM_USER)


def test_named_templates_and_tool_use(make_model_dir: MakeModelDir) -> None:
    config = {
        "chat_template": [
            {"name": "default", "template": "plain"},
            {"name": "tool_use", "template": "tools:{{ tools | length }}"},
        ]
    }
    tok = load_tokenizer(str(make_model_dir(config=config)))
    assert tok.chat_template_names == {"default", "tool_use"}
    assert tok.apply_chat_template(SYSTEM_USER) == "plain"
    assert tok.apply_chat_template(SYSTEM_USER, tools=[{"a": 1}]) == "tools:1"
    assert tok.apply_chat_template(SYSTEM_USER, template_name="tool_use", tools=[]) == "tools:0"
    with pytest.raises(ChatTemplateError, match=r"no chat template named 'x' \(it has: "):
        tok.apply_chat_template(SYSTEM_USER, template_name="x")


def test_template_files_take_priority(make_model_dir: MakeModelDir) -> None:
    root = make_model_dir(
        config={"chat_template": "from config"},
        files={
            "chat_template.jinja": "from jinja file",
            "additional_chat_templates/rag.jinja": "rag",
        },
    )
    tok = load_tokenizer(str(root))
    assert tok.apply_chat_template(SYSTEM_USER) == "from jinja file"
    assert tok.apply_chat_template(SYSTEM_USER, template_name="rag") == "rag"
