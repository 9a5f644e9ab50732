"""vLLM's ``/tokenize``, ``/detokenize`` and ``/tokenizer_info`` against a frontend and
mocker workers (docs/api.md, "Tokenizer endpoints"): what lm-evaluation-harness's remote
tokenizer sends, the chat form agreeing with what chat completions count, and the
refusals (400 naming the parameter, counted in ``/metrics``)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from dynamoctl.tokenizer import load_tokenizer
from tests.frontend.conftest import MODEL, Deployment
from tests.frontend.test_refusals import requests_total

pytestmark = pytest.mark.openai_compat

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]


async def test_what_lm_eval_remote_tokenizer_asks(deployment: Deployment) -> None:
    """lm-evaluation-harness 0.4.13's ``RemoteTokenizer`` (``lm_eval/utils.py``): the
    tokenizer's info, then ``/tokenize`` without a model and without special tokens,
    ``/detokenize``, and the end-of-sequence id as the first id of its text."""
    local = load_tokenizer("builtin")  # the mocker's model card names it
    text = "The capital of France is Paris."
    async with httpx.AsyncClient(base_url=deployment.frontend_url, timeout=30) as http:
        info = (await http.get("/tokenizer_info")).json()
        assert info["eos_token"] == local.eos_token and info["bos_token"] == local.bos_token
        assert info["chat_template"] == local.chat_template
        assert info["tokenizer_class"] == "PreTrainedTokenizerFast"
        assert (await http.get("/tokenizer_info", params={"model": MODEL})).json() == info
        tokens = await http.post("/tokenize", json={"prompt": text, "add_special_tokens": False})
        reply = tokens.json()
        assert reply["tokens"] == local.encode(text, add_special_tokens=False)
        assert reply["count"] == len(reply["tokens"]) and reply["token_strs"] is None
        assert reply["max_model_len"] > 0
        eos = await http.post("/tokenize", json={"prompt": info["eos_token"],
                                                 "add_special_tokens": False})  # fmt: skip
        assert eos.json()["tokens"][0] == local.eos_token_id
        back = await http.post("/detokenize", json={"tokens": reply["tokens"]})
        assert back.json() == {"prompt": text}
        with_bos = await http.post("/tokenize", json={"model": MODEL, "prompt": text,
                                                      "return_token_strs": True})  # fmt: skip
        assert with_bos.json()["tokens"] == local.encode(text)  # special tokens by default
        assert with_bos.json()["token_strs"][0] == local.bos_token
        counts = requests_total((await http.get("/metrics")).text)
    assert counts[(MODEL, "tokenize", "200")] == 3
    assert counts[(MODEL, "detokenize", "200")] == 1
    assert counts[(MODEL, "tokenizer_info", "200")] == 2


async def test_chat_form_counts_what_chat_completions_count(deployment: Deployment) -> None:
    async with httpx.AsyncClient(base_url=deployment.frontend_url, timeout=30) as http:
        tokens = (await http.post("/tokenize", json={"model": MODEL, "messages": CHAT})).json()
        ask = {"model": MODEL, "messages": CHAT, "max_tokens": 1}
        chat = await http.post("/v1/chat/completions", json=ask)
        assert tokens["count"] == chat.json()["usage"]["prompt_tokens"]
        no_turn = await http.post("/tokenize", json={"messages": CHAT,
                                                     "add_generation_prompt": False})  # fmt: skip
        assert no_turn.json()["count"] < tokens["count"]  # the assistant's header is gone


REFUSALS: list[tuple[str, dict[str, Any], int, str]] = [
    ("/tokenize", {}, 400, "prompt"),
    ("/tokenize", {"prompt": "a", "messages": CHAT}, 400, "prompt"),
    ("/tokenize", {"prompt": "a", "tools": []}, 400, "tools"),
    ("/tokenize", {"prompt": 5}, 400, "prompt"),
    ("/tokenize", {"messages": CHAT, "chat_template": "{{ x }}"}, 400, "chat_template"),
    ("/tokenize", {"prompt": "a", "continue_final_message": True}, 400,
     "continue_final_message"),
    ("/tokenize", {"prompt": "a", "model": "nope"}, 404, "model"),
    ("/tokenize", {"prompt": "a", "bogus": 1}, 400, "bogus"),
    ("/detokenize", {"tokens": [1, 10**9]}, 400, "tokens.1"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens.0"),
    ("/detokenize", {}, 400, "tokens"),
]  # fmt: skip


async def test_refusals_name_the_parameter_and_are_counted(deployment: Deployment) -> None:
    expected: dict[tuple[str, str, str], float] = {}
    async with httpx.AsyncClient(base_url=deployment.frontend_url, timeout=30) as http:
        for path, body, status, param in REFUSALS:
            reply = await http.post(path, json=body)
            assert reply.status_code == status, (body, reply.text)
            error = reply.json()["error"]
            assert error["param"] == param, (body, error)
            assert not error["message"].startswith("Value error"), error
            key = ("", path.strip("/"), str(status))
            expected[key] = expected.get(key, 0) + 1
        counts = requests_total((await http.get("/metrics")).text)
    assert {k: counts[k] for k in expected} == expected


async def test_long_conversation_turns_count_what_a_whole_tokenisation_counts(
    deployment: Deployment,
) -> None:
    """An agent's turns (history long enough for the tokenisation prefix cache and the
    router's hash cache): each turn's prompt tokens are the whole rendered prompt's."""
    local = load_tokenizer("builtin")
    words = [
        "the",
        "agent",
        "reads",
        "a",
        "file",
        "then",
        "calls",
        "a",
        "tool",
        "and",
        "waits",
        "for",
        "its",
        "output",
    ]
    messages = [{"role": "user", "content": " ".join(words * 400)}]  # ~5.6k tokens
    async with httpx.AsyncClient(base_url=deployment.frontend_url, timeout=60) as http:
        for turn in range(4):
            ask = {"model": MODEL, "messages": messages, "max_tokens": 1}
            chat = (await http.post("/v1/chat/completions", json=ask)).json()
            prompt = local.apply_chat_template(messages, add_generation_prompt=True)
            whole = local.encode(prompt, add_special_tokens=False)
            assert chat["usage"]["prompt_tokens"] == len(whole), turn
            messages += [{"role": "assistant", "content": " ".join(words[turn:] * 3)},
                         {"role": "user", "content": " ".join(words[: turn + 2] * 20)}]  # fmt: skip
