"""Prompt log-probabilities on ``/v1/completions`` against a frontend and mocker workers
(docs/api.md, "Prompt log-probabilities"): the request lm-evaluation-harness's
``local-completions`` sends for every multiple-choice and perplexity task, scored as it
scores it, and vLLM's ``prompt_logprobs``."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from dynamoctl.frontend.choices import Choices
from dynamoctl.frontend.errors import OpenAIError
from dynamoctl.frontend.generate import Job
from dynamoctl.tokenizer import load_tokenizer
from dynamoctl.wire.engine import GenerateRequest, TokenLogprobs
from tests.frontend.conftest import MODEL, Deployment

pytestmark = pytest.mark.openai_compat

CONTEXT = "Question: What is the capital of France?\nAnswer:"
ANSWERS = [" Paris", " Lyon"]


def lm_eval_score(choice: dict[str, Any], ctxlen: int) -> tuple[float, bool]:
    """lm-evaluation-harness 0.4.13's ``LocalCompletionsAPI.parse_logprobs`` for one
    choice: the continuation's log-likelihood and whether it is greedy."""
    logprobs = choice["logprobs"]
    total = sum(logprobs["token_logprobs"][ctxlen:-1])
    greedy = all(
        tok == max(top.values())
        for tok, top in zip(
            logprobs["token_logprobs"][ctxlen:-1], logprobs["top_logprobs"][ctxlen:-1], strict=True
        )
    )
    return total, greedy


async def test_lm_eval_loglikelihood_request(deployment: Deployment) -> None:
    """``echo: true, logprobs: 1, max_tokens: 1`` on a batch of token-id prompts (context
    plus each answer), as ``LocalCompletionsAPI._create_payload`` builds it: the prompt's
    tokens lead ``logprobs`` (the first scoreless), then the one generated token."""
    tok = load_tokenizer("builtin")  # the mocker's model card names it
    context = tok.encode(CONTEXT)
    prompts = [context + tok.encode(a, add_special_tokens=False) for a in ANSWERS]
    payload = {"model": MODEL, "prompt": prompts, "temperature": 0, "max_tokens": 1,
               "logprobs": 1, "seed": 1234, "echo": True}  # fmt: skip
    async with httpx.AsyncClient(base_url=deployment.frontend_url, timeout=30) as http:
        reply = await http.post("/v1/completions", json=payload)
        assert reply.status_code == 200, reply.text
        again = (await http.post("/v1/completions", json=payload)).json()
    body = reply.json()
    choices = sorted(body["choices"], key=lambda c: c["index"])
    assert len(choices) == 2
    scores = []
    for prompt, choice in zip(prompts, choices, strict=True):
        lp = choice["logprobs"]
        n = len(prompt) + 1  # the prompt's tokens, then the generated one
        assert [len(lp[k]) for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")] \
            == [n] * 4  # fmt: skip
        assert lp["tokens"][: len(prompt)] == [
            tok.decode([i], skip_special_tokens=False) for i in prompt
        ]
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert all(isinstance(p, float) and p <= 0 for p in lp["token_logprobs"][1:])
        for token, p, top in zip(lp["tokens"][1:], lp["token_logprobs"][1:],
                                 lp["top_logprobs"][1:], strict=True):  # fmt: skip
            assert top[token] == p and 1 <= len(top) <= 2  # the token and the most likely
        offsets = [0]
        for token in lp["tokens"][:-1]:
            offsets.append(offsets[-1] + len(token))
        assert lp["text_offset"] == offsets
        assert choice["text"].startswith(tok.decode(prompt))
        total, greedy = lm_eval_score(choice, len(context))
        answer = lp["token_logprobs"][len(context) : len(prompt)]
        assert total == pytest.approx(sum(answer)) and total < 0
        assert isinstance(greedy, bool)
        scores.append(total)
    assert scores[0] != scores[1]  # different continuations score differently
    # Equal prompts score equally (lm-eval compares answers across requests).
    again_choices = sorted(again["choices"], key=lambda c: c["index"])
    assert [c["logprobs"]["token_logprobs"][:-1] for c in again_choices] == [
        c["logprobs"]["token_logprobs"][:-1] for c in choices
    ]
    assert body["usage"]["prompt_tokens"] == sum(map(len, prompts))
    assert body["usage"]["completion_tokens"] == 2


async def test_vllm_prompt_logprobs(deployment: Deployment) -> None:
    """vLLM's ``prompt_logprobs: k``: per prompt token ``{id: {logprob, rank,
    decoded_token}}`` for the token and the ``k`` most likely, the first null; the
    same values ``echo`` with ``logprobs`` gives."""
    tok = load_tokenizer("builtin")
    prompt = tok.encode(CONTEXT)
    base = {"model": MODEL, "prompt": prompt}
    async with httpx.AsyncClient(base_url=deployment.frontend_url, timeout=30) as http:
        reply = await http.post("/v1/completions", json={**base, "max_tokens": 2,
                                                         "prompt_logprobs": 2})  # fmt: skip
        assert reply.status_code == 200, reply.text
        echoed = await http.post("/v1/completions", json={**base, "max_tokens": 1,
                                                          "echo": True, "logprobs": 2})  # fmt: skip
        stream = {**base, "echo": True, "logprobs": 1, "stream": True}
        streamed = await http.post("/v1/completions", json=stream)
    choice = reply.json()["choices"][0]
    assert choice["logprobs"] is None and not choice["text"].startswith(CONTEXT)
    scored = choice["prompt_logprobs"]
    assert len(scored) == len(prompt) and scored[0] is None
    echo = echoed.json()["choices"][0]["logprobs"]
    for i, (token_id, entry) in enumerate(zip(prompt[1:], scored[1:], strict=True), 1):
        own = entry[str(token_id)]
        assert own["logprob"] == echo["token_logprobs"][i] <= 0
        assert own["decoded_token"] == tok.decode([token_id], skip_special_tokens=False)
        assert own["rank"] >= 1
        ranks = sorted(e["rank"] for k, e in entry.items() if k != str(token_id))
        assert ranks == ([1, 2] if own["rank"] > 2 else [r for r in (1, 2) if r != own["rank"]])
        assert len(entry) == (3 if own["rank"] > 2 else 2)
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "echo"


def test_an_engine_without_prompt_scores_fails_the_request() -> None:
    """An engine that ignores ``prompt_logprobs`` (SGLang's and TensorRT-LLM's adapters
    today) fails the request with a 501 naming the parameter, never answers without them."""
    job = Job("cmpl-1", MODEL, GenerateRequest("", [1, 2, 3], 1, prompt_logprobs=1))
    choices = Choices("cmpl-1", [job], 3, logprobs=True)
    choices.echo_logprobs = True
    with pytest.raises(OpenAIError) as refused:
        choices.check_prompt_logprobs()
    assert (refused.value.status, refused.value.param) == (501, "echo")
    choices.outcomes[0].prompt_logprobs = [None, TokenLogprobs(-1.0), TokenLogprobs(-2.0)]
    choices.check_prompt_logprobs()  # all there
