"""The OpenAI-compatible HTTP API: routes, body handling, SSE framing.

Bodies are read and parsed here rather than by FastAPI's dependency injection so that every
failure (oversized, not JSON, invalid UTF-8, wrong types, unknown fields) becomes an
OpenAI-shaped 4xx; the request schemas are still declared for ``/openapi.json``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from prometheus_client import generate_latest
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from dynamoctl import __version__
from dynamoctl.frontend.errors import OpenAIError, bad_request, model_not_found
from dynamoctl.frontend.generate import Generator, Job, Outcome
from dynamoctl.frontend.metrics import FrontendMetrics
from dynamoctl.frontend.models import ModelRegistry, ServedModel
from dynamoctl.frontend.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    usage,
)

Body = TypeVar("Body", bound=BaseModel)
MAX_BODY_BYTES = 4 * 1024 * 1024
"""Larger bodies get 413 before they are read in full."""


def build_app(registry: ModelRegistry, generator: Generator, metrics: FrontendMetrics) -> FastAPI:
    app = FastAPI(title="dynamoctl", version=__version__, docs_url=None, redoc_url=None)

    @app.exception_handler(OpenAIError)
    async def _openai_error(_: Request, exc: OpenAIError) -> Response:
        return exc.response()

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, exc: HTTPException) -> Response:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return OpenAIError(exc.status_code, str(exc.detail), type=kind).response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> Response:
        return bad_request(str(exc)).response()

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": m.name, "object": "model", "created": m.created, "owned_by": "dynamoctl"}
                for m in registry.models()
            ],
        }

    @app.get("/health")
    async def health() -> Response:
        names = [m.name for m in registry.models()]
        status = 200 if names else 503
        body = {"status": "healthy" if names else "no models", "models": names}
        return JSONResponse(body, status_code=status)

    @app.get("/live")
    async def live() -> Response:
        return PlainTextResponse("ok")

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type="text/plain; version=0.0.4")

    @app.post("/v1/chat/completions", openapi_extra=_schema(ChatCompletionRequest))
    async def chat(request: Request) -> Response:
        body = await _parse(request, ChatCompletionRequest)
        model = _model(registry, body.model)
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            prompt = model.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        except Exception as exc:  # a template that raises on these messages
            raise bad_request(f"chat template failed: {exc}", "messages") from exc
        ids = model.tokenizer.encode(prompt, add_special_tokens=False)
        job = _job(model, body, ids, f"chatcmpl-{uuid.uuid4().hex}")
        return await _respond(request, "chat", model, body, job)

    @app.post("/v1/completions", openapi_extra=_schema(CompletionRequest))
    async def completions(request: Request) -> Response:
        body = await _parse(request, CompletionRequest)
        model = _model(registry, body.model)
        if isinstance(body.prompt, str):
            ids = model.tokenizer.encode(body.prompt, add_special_tokens=True)
        else:
            ids = list(body.prompt)
        job = _job(model, body, ids, f"cmpl-{uuid.uuid4().hex}")
        return await _respond(request, "completions", model, body, job)

    async def _respond(
        request: Request,
        endpoint: str,
        model: ServedModel,
        body: ChatCompletionRequest | CompletionRequest,
        job: Job,
    ) -> Response:
        metrics.input_tokens.labels(model.name).inc(len(job.prompt_ids))
        outcome = Outcome()
        deltas = generator.run(job, model.tokenizer, model.picker, outcome)
        shape = _Shape(endpoint, job.request_id, model.name)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            events = _sse(deltas, shape, outcome, len(job.prompt_ids), include_usage)
            counted = _counted(events, metrics, model.name, endpoint, outcome, len(job.prompt_ids))
            return StreamingResponse(counted, media_type="text/event-stream")
        text = await _until_disconnect(request, _collect(deltas), metrics, model.name)
        _count(metrics, model.name, endpoint, outcome, "200")
        return JSONResponse(shape.full(text, outcome, len(job.prompt_ids)))

    return app


class _Shape:
    """OpenAI response objects for one request."""

    def __init__(self, endpoint: str, request_id: str, model: str) -> None:
        self.chat = endpoint == "chat"
        self.id = request_id
        self.model = model
        self.created = int(time.time())
        self.object = "chat.completion" if self.chat else "text_completion"

    def _choice(self, text: str | None, finish: str | None, *, first: bool = False) -> Any:
        if self.chat:
            delta: dict[str, str] = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}

    def chunk(self, text: str | None, finish: str | None = None, first: bool = False) -> Any:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [self._choice(text, finish, first=first)],
        }

    def full(self, text: str, outcome: Outcome, prompt_tokens: int) -> Any:
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": outcome.finish_reason,
            }
        else:
            choice = self._choice(text, outcome.finish_reason)
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": _usage(outcome, prompt_tokens),
        }


def _usage(outcome: Outcome, prompt_tokens: int) -> Any:
    return usage(prompt_tokens, outcome.completion_tokens, outcome.cached_tokens).model_dump()


def _data(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def _sse(
    deltas: AsyncIterator[str],
    shape: _Shape,
    outcome: Outcome,
    prompt_tokens: int,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    def with_usage(obj: Any) -> Any:
        if include_usage:
            obj["usage"] = None
        return obj

    try:
        if shape.chat:
            yield _data(with_usage(shape.chunk("", first=True)))
        async for text in deltas:
            yield _data(with_usage(shape.chunk(text)))
        yield _data(with_usage(shape.chunk(None, outcome.finish_reason)))
        if include_usage:
            final = shape.chunk(None)
            final["choices"] = []
            final["usage"] = _usage(outcome, prompt_tokens)
            yield _data(final)
    except OpenAIError as exc:  # headers are sent: report in-band, as OpenAI does
        yield _data(exc.body())
    yield b"data: [DONE]\n\n"


async def _counted(
    events: AsyncIterator[bytes],
    metrics: FrontendMetrics,
    model: str,
    endpoint: str,
    outcome: Outcome,
    prompt_tokens: int,
) -> AsyncIterator[bytes]:
    metrics.inflight.labels(model).inc()
    try:
        async for event in events:
            yield event
    except asyncio.CancelledError:  # client went away: the worker stream is cancelled too
        metrics.cancellations.labels(model).inc()
        raise
    finally:
        metrics.inflight.labels(model).dec()
        _count(metrics, model, endpoint, outcome, "200" if outcome.finish_reason else "error")


def _count(
    metrics: FrontendMetrics, model: str, endpoint: str, outcome: Outcome, status: str
) -> None:
    metrics.requests.labels(model, endpoint, status).inc()
    metrics.output_tokens.labels(model).inc(outcome.completion_tokens)
    metrics.cached_tokens.labels(model).inc(outcome.cached_tokens)


async def _collect(deltas: AsyncIterator[str]) -> str:
    return "".join([text async for text in deltas])


async def _until_disconnect(
    request: Request, work: Awaitable[str], metrics: FrontendMetrics, model: str
) -> str:
    """Run ``work``; cancel it (and so the worker's stream) if the client disconnects."""
    task = asyncio.ensure_future(work)
    metrics.inflight.labels(model).inc()
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.5)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                metrics.cancellations.labels(model).inc()
                raise asyncio.CancelledError
    finally:
        metrics.inflight.labels(model).dec()
        if not task.done():
            task.cancel()


async def _parse(request: Request, model: type[Body]) -> Body:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise OpenAIError(413, f"request body exceeds {MAX_BODY_BYTES} bytes")
    raw = bytearray()
    async for part in request.stream():
        raw += part
        if len(raw) > MAX_BODY_BYTES:
            raise OpenAIError(413, f"request body exceeds {MAX_BODY_BYTES} bytes")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise bad_request(f"request body is not valid UTF-8: {exc}") from exc
    except ValueError as exc:
        raise bad_request(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        kind = first["type"]
        message = (
            f"unknown or unsupported parameter '{param}'"
            if kind == "extra_forbidden"
            else f"{param}: {first['msg']}"
            if param
            else first["msg"]
        )
        raise bad_request(message, param) from exc


def _model(registry: ModelRegistry, name: str) -> ServedModel:
    model = registry.get(name)
    if model is None:
        raise model_not_found(name, [m.name for m in registry.models()])
    return model


def _job(
    model: ServedModel, body: ChatCompletionRequest | CompletionRequest, ids: list[int], rid: str
) -> Job:
    context = model.card.context_length
    if len(ids) >= context:
        raise bad_request(
            f"This model's maximum context length is {context} tokens; the prompt has "
            f"{len(ids)} tokens.",
            "messages" if isinstance(body, ChatCompletionRequest) else "prompt",
        )
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


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }
