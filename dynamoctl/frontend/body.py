"""A request body: parsed and validated in one pass (every failure a 400 naming the
parameter), then checked against the model's context and turned into a generation job."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from dynamoctl.frontend.errors import OpenAIError, ParamError, bad_request
from dynamoctl.frontend.generate import Job
from dynamoctl.frontend.longtext import INLINE_CHARS, LongTextEncoder
from dynamoctl.frontend.models import ServedModel
from dynamoctl.frontend.protocol import INT64, ChatCompletionRequest, CompletionRequest
from dynamoctl.structured.errors import StructuredError
from dynamoctl.wire.engine import GenerateRequest
from dynamoctl.wire.ids import packed

Body = TypeVar("Body", bound=BaseModel)


def decode_body(raw: bytes, model: type[Body]) -> Body:
    """``raw`` parsed and validated in one pass by pydantic's JSON parser (strict: no
    coercion; depth-limited; lone surrogates refused); any failure is a 400."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise invalid_body(raw, exc) from None


TYPE_TAG = re.compile(r"str|int|float|bool|.*\W.*")
"""Parts of an error location that name a union member's type, not a parameter
(``prompt.str``, ``prompt.list[int].0``)."""


def invalid_body(raw: bytes, exc: ValidationError) -> OpenAIError:
    errors = exc.errors(include_url=False, include_input=False)
    first = errors[0]
    kind = first["type"]
    if kind == "json_invalid":
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as err:
            return bad_request(f"request body is not valid UTF-8: {err}")
        return bad_request(f"request body is not valid JSON: {first['msg']}")
    if kind == "unsupported":  # the compatibility policy (compat.py)
        return bad_request(first["msg"], str(first["ctx"]["param"]))
    if kind == "model_type" and not first["loc"]:
        return bad_request("request body must be a JSON object")
    if kind == "extra_forbidden":
        name = ".".join(str(p) for p in first["loc"])[:200]  # a client's key: maybe huge
        return bad_request(f"unknown or unsupported parameter '{name}'", name)
    # Of a union's failures, the deepest says most ([1.0] as a prompt: not "a string").
    top = first["loc"][:1]
    first = max((e for e in errors if e["loc"][:1] == top), key=lambda e: len(e["loc"]))
    raised = first.get("ctx", {}).get("error")
    if isinstance(raised, ParamError | StructuredError):  # a check of several fields: it names one
        return bad_request(str(raised), raised.param)
    # A validator's own words, without pydantic's "Value error, " / "Assertion failed, ".
    message = str(raised) if isinstance(raised, Exception) else first["msg"]
    parts = [p for p in first["loc"] if isinstance(p, int) or not TYPE_TAG.fullmatch(p)]
    param = ".".join(map(str, parts)) or None
    return bad_request(f"{param}: {message}" if param else message, param)


def too_long(context: int, prompt_tokens: int, param: str) -> OpenAIError:
    return bad_request(
        f"This model's maximum context length is {context} tokens; the prompt has "
        f"{prompt_tokens} tokens.",
        param,
    )


async def prompt_ids(
    encoder: LongTextEncoder, model: ServedModel, text: str, special: bool, param: str
) -> list[int]:
    """``text``'s ids: inline when short, else on the encoder's threads (:mod:`longtext`);
    a prompt longer than the model's context is refused by its count alone."""
    if len(text) <= INLINE_CHARS:
        return model.tokenizer.encode(text, add_special_tokens=special)
    context = model.card.context_length
    ids = await encoder.encode(model, text, special, context)
    if isinstance(ids, int):
        raise too_long(context, ids, param)
    return ids


def jobs_of(
    model: ServedModel,
    body: ChatCompletionRequest | CompletionRequest,
    prompts: Sequence[Sequence[int]],
    rid: str,
    max_choices: int,
) -> list[Job]:
    """One job per choice: ``n`` per prompt, choice ``p * n + i`` for prompt ``p``."""
    n = body.choices()
    chat = isinstance(body, ChatCompletionRequest)
    check_choices(body, len(prompts), max_choices)
    context = model.card.context_length
    limit = body.token_limit()
    tokenizer = model.tokenizer
    eos = [] if body.ignore_eos else sorted(tokenizer.eos_token_ids)
    jobs: list[Job] = []
    for p, ids in enumerate(prompts):
        if len(ids) >= context:
            raise too_long(context, len(ids), "messages" if chat else "prompt")
        if limit is not None and len(ids) + limit > context:
            raise bad_request(
                f"This model's maximum context length is {context} tokens. However, you "
                f"requested {len(ids) + limit} tokens ({len(ids)} in the prompt, {limit} in "
                "the completion).",
                "max_tokens",
            )
        max_tokens = limit if limit is not None else context - len(ids)
        if body.min_tokens > max_tokens:
            raise bad_request(
                f"min_tokens ({body.min_tokens}) exceeds max_tokens ({max_tokens})", "min_tokens"
            )
        for i in range(n):
            index = p * n + i
            jobs.append(Job(
                request_id=rid if len(prompts) * n == 1 else f"{rid}-{index}",
                model=model.name,
                engine=engine_request(body, ids, max_tokens, eos, i, model.card.adapter),
                stop=body.stop_strings(),
                index=index,
            ))  # fmt: skip
    return jobs


def check_choices(
    body: ChatCompletionRequest | CompletionRequest, prompts: int, max_choices: int
) -> None:
    """A 400 when ``n`` times the prompts exceeds the frontend's bound, naming ``n`` (or
    ``prompt``: a batch of single choices) and how the bound is raised."""
    n = body.choices()
    if n * prompts > max_choices:
        asked = f"n={n}" + (f" times {prompts} prompts" if prompts > 1 else "")
        raise bad_request(
            f"{asked} asks for {n * prompts} choices; this frontend allows at most "
            f"{max_choices}: send fewer, or raise the limit (recipe field "
            "frontend.max_choices, or dynamoctl frontend --max-choices)",
            "prompt" if n == 1 else "n",
        )


def engine_request(
    body: ChatCompletionRequest | CompletionRequest,
    ids: Sequence[int],
    max_tokens: int,
    eos: list[int],
    choice: int,
    adapter: str | None = None,
) -> GenerateRequest:
    """What a worker is asked for one choice (the id is the attempt's)."""
    seed = body.seed
    if seed is not None and choice:  # distinct choices, reproducibly (as vLLM does)
        seed = seed + choice if seed + choice <= INT64[1] else seed - choice
    return GenerateRequest(
        request_id="",
        token_ids=packed(ids),
        max_tokens=max_tokens,
        stop_token_ids=eos,
        ignore_eos=body.ignore_eos,
        seed=seed,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        min_p=body.min_p,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        repetition_penalty=body.repetition_penalty,
        logit_bias=body.bias(),
        min_tokens=body.min_tokens,
        user_stop_token_ids=list(body.stop_token_ids or ()),
        logprobs=body.top_logprobs_count(),
        prompt_logprobs=(
            body.prompt_logprobs_count() if isinstance(body, CompletionRequest) else None
        ),
        adapter=adapter,
    )
