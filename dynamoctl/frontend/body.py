"""A request body: parsed and validated in one pass (every failure a 400 naming the
parameter), then checked against the model's context and turned into a generation job."""

from __future__ import annotations

import re
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from dynamoctl.frontend.errors import OpenAIError, bad_request
from dynamoctl.frontend.generate import Job
from dynamoctl.frontend.models import ServedModel
from dynamoctl.frontend.protocol import ChatCompletionRequest, CompletionRequest

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
    if kind == "model_type" and not first["loc"]:
        return bad_request("request body must be a JSON object")
    if kind == "extra_forbidden":
        name = ".".join(str(p) for p in first["loc"])[:200]  # a client's key: maybe huge
        return bad_request(f"unknown or unsupported parameter '{name}'", name)
    # Of a union's failures, the deepest says most ([1.0] as a prompt: not "a string").
    top = first["loc"][:1]
    first = max((e for e in errors if e["loc"][:1] == top), key=lambda e: len(e["loc"]))
    parts = [p for p in first["loc"] if isinstance(p, int) or not TYPE_TAG.fullmatch(p)]
    param = ".".join(map(str, parts)) or None
    return bad_request(f"{param}: {first['msg']}" if param else first["msg"], param)


def too_long(context: int, prompt_tokens: int, param: str) -> OpenAIError:
    return bad_request(
        f"This model's maximum context length is {context} tokens; the prompt has "
        f"{prompt_tokens} tokens.",
        param,
    )


def job_of(
    model: ServedModel, body: ChatCompletionRequest | CompletionRequest, ids: list[int], rid: str
) -> Job:
    context = model.card.context_length
    if len(ids) >= context:
        param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
        raise too_long(context, len(ids), param)
    limit = body.token_limit()
    if limit is not None and len(ids) + limit > context:
        raise bad_request(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{len(ids) + limit} tokens ({len(ids)} in the prompt, {limit} in the completion).",
            "max_tokens",
        )
    return Job(
        request_id=rid,
        model=model.name,
        prompt_ids=ids,
        max_tokens=limit if limit is not None else context - len(ids),
        stop=body.stop_strings(),
        ignore_eos=body.ignore_eos,
        seed=body.seed,
        temperature=body.temperature,
    )
