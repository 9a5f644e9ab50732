"""vLLM's tokenizer endpoints, so that clients which use the served model's tokenizer
(lm-evaluation-harness's ``tokenizer_backend=remote``, which it tries first without a
local tokenizer) need no copy of it: ``POST /tokenize``, ``POST /detokenize`` and
``GET /tokenizer_info``, with vLLM's request and response shapes.

The model is the frontend's tokenizer for it (the one its requests are counted with);
``model`` may be left out while exactly one model is served, as vLLM serves one. Bodies
are read and parsed as the completion endpoints' are (size limit, strict JSON, the
compatibility policy of :mod:`dynamoctl.frontend.compat`, 400s naming the parameter);
API keys, refusals and ``dynamoctl_frontend_requests_total`` apply as everywhere.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dynamoctl.frontend import compat
from dynamoctl.frontend.asgi import read_body
from dynamoctl.frontend.body import decode_body
from dynamoctl.frontend.compat_policy import Endpoint
from dynamoctl.frontend.errors import OpenAIError, ParamError, bad_request
from dynamoctl.frontend.longtext import INLINE_CHARS, LongTextEncoder
from dynamoctl.frontend.metrics import FrontendMetrics
from dynamoctl.frontend.models import ModelRegistry, ServedModel
from dynamoctl.frontend.protocol import ChatMessage
from dynamoctl.structured.request import ToolSpec

TOKENIZER_CLASS = "PreTrainedTokenizerFast"
"""What ``/tokenizer_info`` calls every tokenizer here: a ``tokenizers`` pipeline read
from ``tokenizer.json``, as transformers' fast tokenizer is."""
INLINE_IDS = 65536
"""Longer id lists are decoded on the tokenising threads, off the event loop."""


class _Policed(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    ENDPOINT: ClassVar[Endpoint]

    @model_validator(mode="before")
    @classmethod
    def _policy(cls, data: Any) -> Any:
        return compat.check_unsupported(data, cls.ENDPOINT)


class TokenizeRequest(_Policed):
    """vLLM's two forms in one: ``prompt`` (text) or ``messages`` (a chat)."""

    ENDPOINT: ClassVar[Endpoint] = "tokenize"

    model: str | None = Field(default=None, min_length=1)
    """Served model name; may be left out while one model is served."""
    prompt: str | None = None
    """Text to tokenise."""
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    """A chat, rendered by the model's chat template, then tokenised."""
    add_special_tokens: bool | None = None
    """The tokenizer's special tokens (BOS); null: true for ``prompt``, false for
    ``messages`` (the template writes them), as vLLM."""
    add_generation_prompt: bool | None = None
    """``messages``: open the assistant's turn (null: true)."""
    tools: list[ToolSpec] | None = Field(default=None, max_length=128)
    """``messages``: functions the chat template renders."""
    return_token_strs: bool | None = None
    """Also return each token's text."""

    @model_validator(mode="after")
    def _one_form(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ParamError("prompt", "give either prompt or messages")
        if self.prompt is not None:
            for chat_only in ("add_generation_prompt", "tools"):
                if getattr(self, chat_only) is not None:
                    raise ParamError(chat_only, f"{chat_only} goes with messages, not prompt")
        return self


class DetokenizeRequest(_Policed):
    ENDPOINT: ClassVar[Endpoint] = "detokenize"

    model: str | None = Field(default=None, min_length=1)
    """Served model name; may be left out while one model is served."""
    tokens: list[Annotated[int, Field(ge=0, lt=2**31)]]
    """Token ids, each below the vocabulary's size."""


class Tokenization:
    """The three endpoints' handlers (routes of the router: they are not the hot path)."""

    def __init__(
        self,
        registry: ModelRegistry,
        metrics: FrontendMetrics,
        encoder: LongTextEncoder,
        max_body_bytes: int,
    ) -> None:
        self.registry = registry
        self.metrics = metrics
        self.encoder = encoder
        self.max_body_bytes = max_body_bytes

    async def tokenize(self, request: Request) -> Response:
        raw = await read_body(request.scope, request.receive, self.max_body_bytes)
        if raw is None:
            return Response(status_code=400)  # the client left: nobody reads this
        body = decode_body(raw, TokenizeRequest)
        model = self._model(body.model)
        tokenizer = model.tokenizer
        if body.messages is not None:
            text = _render(model, body)
            special = bool(body.add_special_tokens)
        else:
            text = body.prompt or ""
            special = body.add_special_tokens is not False
        if len(text) <= INLINE_CHARS:
            ids = tokenizer.encode(text, add_special_tokens=special)
        else:  # a count past any context is an answer here: no limit, so always the ids
            encoded = await self.encoder.encode(model, text, special, sys.maxsize)
            ids = encoded if isinstance(encoded, list) else []
        strs = [tokenizer.backend.id_to_token(i) for i in ids] if body.return_token_strs else None
        reply = {"count": len(ids), "max_model_len": model.card.context_length, "tokens": ids,
                 "token_strs": strs}  # fmt: skip
        return self._ok(model, "tokenize", reply)

    async def detokenize(self, request: Request) -> Response:
        raw = await read_body(request.scope, request.receive, self.max_body_bytes)
        if raw is None:
            return Response(status_code=400)
        body = decode_body(raw, DetokenizeRequest)
        model = self._model(body.model)
        tokenizer = model.tokenizer
        vocab = tokenizer.vocab_size
        for i, token in enumerate(body.tokens):
            if token >= vocab:
                raise bad_request(
                    f"tokens.{i}: {token} is not a token id of this model (its vocabulary "
                    f"has {vocab})",
                    f"tokens.{i}",
                )
        ids = body.tokens
        if len(ids) <= INLINE_IDS:
            text = tokenizer.decode(ids, skip_special_tokens=False)
        else:
            loop = asyncio.get_running_loop()
            text = await loop.run_in_executor(self.encoder.pool, tokenizer.decode, ids, False)
        return self._ok(model, "detokenize", {"prompt": text})

    async def tokenizer_info(self, request: Request) -> Response:
        name = request.query_params.get("model")
        model = self._model(name or None)
        tokenizer = model.tokenizer
        info: dict[str, Any] = {
            "tokenizer_class": TOKENIZER_CLASS,
            **tokenizer.special_tokens,
            "model_max_length": model.card.context_length,
        }
        if tokenizer.chat_template is not None:
            info["chat_template"] = tokenizer.chat_template
        return self._ok(model, "tokenizer_info", info)

    def _model(self, name: str | None) -> ServedModel:
        if name is not None:
            return self.registry.resolve(name)
        served = self.registry.models()
        if len(served) == 1:
            return served[0]
        names = ", ".join(sorted(m.name for m in served))
        if not served:
            raise OpenAIError(503, "no model is served right now; retry later",
                              type="service_unavailable", param="model",
                              code="model_unavailable", retry_after=1.0)  # fmt: skip
        raise bad_request(f"several models are served ({names}): name one in 'model'", "model")

    def _ok(self, model: ServedModel, endpoint: str, reply: dict[str, Any]) -> Response:
        self.metrics.requests.labels(model.name, endpoint, "200").inc()
        return JSONResponse(reply)


def _render(model: ServedModel, body: TokenizeRequest) -> str:
    """The chat's prompt text, as ``/v1/chat/completions`` renders it."""
    for i, message in enumerate(body.messages or []):
        if message.image_urls():
            raise bad_request("image parts are not tokenised here (their token count is "
                              "the model's, see /v1/models)", f"messages.{i}.content")  # fmt: skip
    messages = [m.for_template() for m in body.messages or []]
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    try:
        return model.tokenizer.apply_chat_template(
            messages, add_generation_prompt=body.add_generation_prompt is not False, tools=tools
        )
    except Exception as exc:  # a template that raises on these messages
        raise bad_request(f"chat template failed: {exc}", "messages") from exc
