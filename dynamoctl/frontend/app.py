"""The OpenAI-compatible HTTP API: its routes and the two hot handlers.

Bodies are read (``asgi.py``) and parsed (``body.py``) by us rather than by a framework's
dependency injection so that every failure (oversized, not JSON, invalid UTF-8, wrong
types, unknown fields) becomes an OpenAI-shaped 4xx; the request schemas are still
declared for ``/openapi.json``.

The two hot routes (``POST /v1/completions`` and ``/v1/chat/completions``) are served by
:class:`FrontendApp`, a raw ASGI handler in front of Starlette's router: it writes SSE chunks
straight to ``send()`` and watches ``receive()`` for the client going away, skipping the
middleware stack and the per-response task group, which cost more CPU than the rest of a
streamed request. The router keeps everything else (``/v1/models``, ``/metrics``,
``/openapi.json``, :mod:`dynamoctl.frontend.openapi`) and still routes the hot paths to the
same handlers if reached directly.

Hostile input: bodies are parsed and validated by pydantic's own JSON parser in strict
mode (nesting past its depth limit, lone surrogates and non-UTF-8 are invalid JSON, not a
``RecursionError`` or a tokenizer's crash), so every refusal is a 4xx; a bug is a 500
with ``Connection: close`` (or, once a stream has started, an error event). Long texts
are tokenised on a thread so that one huge prompt does not stall every other request.
Limits on headers and slow clients are the HTTP server's (:mod:`dynamoctl.component.http`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from dynamoctl.frontend.anthropic.handler import AnthropicMessages
from dynamoctl.frontend.anthropic.protocol import CountTokensRequest, MessagesRequest
from dynamoctl.frontend.asgi import Receive, Scope, Send, read_body
from dynamoctl.frontend.auth import ApiKeys
from dynamoctl.frontend.body import check_choices, decode_body, jobs_of, prompt_ids
from dynamoctl.frontend.choices import Choices
from dynamoctl.frontend.embeddings import EmbeddingRequest, Embeddings
from dynamoctl.frontend.errors import OpenAIError, bad_request, internal_error
from dynamoctl.frontend.generate import Generator, with_images
from dynamoctl.frontend.images import ImagePart, ImageReader, image_parts, placed_images
from dynamoctl.frontend.longtext import LongTextEncoder, Trimmer
from dynamoctl.frontend.metrics import FrontendMetrics
from dynamoctl.frontend.models import ModelRegistry, ServedModel
from dynamoctl.frontend.openapi import OpenApi, RawRoute
from dynamoctl.frontend.probes import models_and_probes
from dynamoctl.frontend.protocol import ChatCompletionRequest, CompletionRequest
from dynamoctl.frontend.refusals import Refusals
from dynamoctl.frontend.respond import stream, whole
from dynamoctl.frontend.responses.handler import Responses
from dynamoctl.frontend.responses.protocol import ResponsesRequest
from dynamoctl.frontend.responses.store import ResponseStore
from dynamoctl.frontend.shape import Shape
from dynamoctl.frontend.shaping import planned
from dynamoctl.frontend.tenants.service import Tenants
from dynamoctl.frontend.tokenization import Tokenization
from dynamoctl.settings.images import ImageSettings
from dynamoctl.structured.errors import StructuredError
from dynamoctl.structured.plan import OutputPlan, plan_chat, plan_completion
from dynamoctl.tokenizer import Tokenizer
from dynamoctl.tokenizer.prefix import PrefixCache
from dynamoctl.tracing import TRACE
from dynamoctl.wire.engine import ImageInput
from dynamoctl.wire.ids import TokenIds

log = logging.getLogger(__name__)

_Body = ChatCompletionRequest | CompletionRequest

MAX_BODY_BYTES = 4 * 1024 * 1024
"""Larger bodies get 413 before they are read in full (default of ``--max-body-bytes``)."""
TRIM_AFTER_BYTES = 256 << 10
"""A body this large (or refused as too large) asks for a heap trim (:class:`Trimmer`)."""


def build_app(
    registry: ModelRegistry,
    generator: Generator,
    metrics: FrontendMetrics,
    *,
    api_keys: ApiKeys | None = None,
    tenants: Tenants | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    max_stored_responses: int = 1024,
    images: ImageSettings | None = None,
) -> FrontendApp:
    """The frontend's ASGI app; with ``api_keys``, every path but the probes' needs one."""
    refusals = Refusals(metrics)
    hot = _Completions(registry, generator, metrics, max_body_bytes, refusals, images)
    # vLLM's tokenizer endpoints (lm-evaluation-harness's remote tokenizer).
    tokens = Tokenization(registry, metrics, hot.long_text, max_body_bytes)
    anthropic = AnthropicMessages(hot)  # Anthropic's Messages API, on the chat pipeline
    embeddings = Embeddings(registry, generator, metrics, hot.long_text, refusals, max_body_bytes)
    responses = Responses(hot, ResponseStore(max_stored_responses))  # OpenAI's Responses API

    async def get_response(request: Request) -> Response:
        return JSONResponse(responses.get(request.path_params["response_id"]))

    async def delete_response(request: Request) -> Response:
        return JSONResponse(responses.delete(request.path_params["response_id"]))

    # FrontendApp answers the raw POST routes before the router sees them; they are
    # declared here for /openapi.json, and served by the same handler should a request
    # reach the router anyway (a root_path).
    routes = [
        *models_and_probes(registry, metrics),
        Route("/tokenize", tokens.tokenize, methods=["POST"]),
        Route("/detokenize", tokens.detokenize, methods=["POST"]),
        Route("/tokenizer_info", tokens.tokenizer_info, methods=["GET"]),
        RawRoute("/v1/chat/completions", hot.chat, ChatCompletionRequest),
        RawRoute("/v1/completions", hot.completions, CompletionRequest),
        RawRoute("/v1/messages", anthropic.messages, MessagesRequest),
        RawRoute("/v1/messages/count_tokens", anthropic.count_tokens, CountTokensRequest),
        RawRoute("/v1/embeddings", embeddings.create, EmbeddingRequest),
        RawRoute("/v1/responses", responses.create, ResponsesRequest),
        Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
        Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
    ]
    routes.append(Route("/openapi.json", OpenApi(routes).serve, methods=["GET"]))
    app = Starlette(routes=routes, exception_handlers=_error_answers(refusals))
    return FrontendApp(app, hot, anthropic, responses, api_keys, refusals, tenants)


def _error_answers(refusals: Refusals) -> dict[Any, Any]:
    """Every error the router meets answered as OpenAI's error object, counted and logged."""

    def refuse(request: Request, error: OpenAIError) -> Response:
        refusals.refused(request.method, request.url.path, error)
        return error.response()

    async def openai_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, OpenAIError)
        return refuse(request, exc)

    async def bug(request: Request, exc: Exception) -> Response:
        # Starlette logs and re-raises after this response; it only shapes it.
        return refuse(request, internal_error())

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)  # 404, 405: no route for this path or method
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return refuse(request, OpenAIError(exc.status_code, str(exc.detail), type=kind))

    return {OpenAIError: openai_error, HTTPException: http_error, Exception: bug}


class FrontendApp:
    """The frontend's ASGI application: API keys checked first (when configured), then
    the hot POST routes go straight to :class:`_Completions` (and Anthropic's Messages
    routes to :class:`AnthropicMessages`); everything else (and any other method) to
    Starlette's router."""

    def __init__(
        self,
        api: Starlette,
        hot: _Completions,
        messages: AnthropicMessages,
        responses: Responses,
        api_keys: ApiKeys | None = None,
        refusals: Refusals | None = None,
        tenants: Tenants | None = None,
    ) -> None:
        self.api = api
        self.hot = hot
        self.api_keys = api_keys
        self.tenants = tenants
        """Keys with names, classes and limits; when set, it checks the keys."""
        self.refusals = refusals or hot.refusals
        self.messages = messages
        self.responses = responses

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.tenants is not None and scope["type"] == "http":
            return await self.tenants.serve(scope, receive, send, self._route, self._refuse)
        if self.api_keys is not None and scope["type"] == "http":
            refused = self.api_keys.check(scope["path"], scope["headers"])
            if refused is not None:
                return await self._refuse(scope, receive, send, refused)
        await self._route(scope, receive, send)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, refused: OpenAIError
    ) -> None:
        if scope["path"].startswith("/v1/messages"):  # in Anthropic's shape
            return await self.messages.refuse(scope, receive, send, refused)
        self.refusals.refused(scope["method"], scope["path"], refused)
        await refused.response()(scope, receive, send)

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            path = scope["path"]
            if path == "/v1/completions":
                return await self.hot.completions(scope, receive, send)
            if path == "/v1/chat/completions":
                return await self.hot.chat(scope, receive, send)
            if path == "/v1/responses":
                return await self.responses.create(scope, receive, send)
            if path == "/v1/messages":
                return await self.messages.messages(scope, receive, send)
            if path == "/v1/messages/count_tokens":
                return await self.messages.count_tokens(scope, receive, send)
        await self.api(scope, receive, send)


class _Completions:
    """``POST /v1/completions`` and ``/v1/chat/completions`` as raw ASGI handlers."""

    def __init__(
        self,
        registry: ModelRegistry,
        generator: Generator,
        metrics: FrontendMetrics,
        max_body_bytes: int = MAX_BODY_BYTES,
        refusals: Refusals | None = None,
        images: ImageSettings | None = None,
    ) -> None:
        self.registry = registry
        self.generator = generator
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.refusals = refusals or Refusals(metrics)
        self._long = LongTextEncoder()
        self._prefixes: dict[int, tuple[Tokenizer, PrefixCache]] = {}
        """Per tokenizer (by id; the tuple holds it alive), its chat prompts' prefixes."""
        self._trim = Trimmer(self._long.pool)
        self._images = ImageReader(images or ImageSettings(), self._long.pool)

    async def chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._serve(scope, receive, send, "chat")

    async def completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._serve(scope, receive, send, "completions")

    async def _serve(self, scope: Scope, receive: Receive, send: Send, endpoint: str) -> None:
        raw: bytes | None = None
        try:
            raw = await read_body(scope, receive, self.max_body_bytes)
            if raw is None:
                return  # the client left before sending its whole body
            prepare = self._chat if endpoint == "chat" else self._completion
            model, body, choices = await prepare(raw)
        except OpenAIError as exc:
            self.refusals.refused("POST", scope["path"], exc)
            await exc.response()(scope, receive, send)
            return
        except Exception:
            log.exception("%s request failed", endpoint)
            bug = internal_error()
            self.refusals.refused("POST", scope["path"], bug)
            await bug.response()(scope, receive, send)
            return
        finally:
            if raw is None or len(raw) >= TRIM_AFTER_BYTES:  # None: left, or 413
                self._trim.soon()
        self.metrics.received.labels(model.name).inc()
        self.metrics.input_tokens.labels(model.name).inc(choices.prompt_tokens)
        choices.setup_logprobs(model, endpoint == "chat")
        deltas = choices.run(self.generator, model)
        shape = Shape(endpoint, choices.request_id, model.name)
        if body.stream:
            options = body.stream_options
            include_usage = bool(options and options.include_usage)
            if options is not None and options.usage_every_chunk():
                shape.running_usage = choices.running_usage
            await stream(self.metrics, receive, send, deltas, shape, choices, body.choices(),
                         include_usage)  # fmt: skip
        else:
            await whole(self.metrics, scope, receive, send, deltas, shape, choices, body.choices())

    async def _chat(self, raw: bytes) -> tuple[ServedModel, _Body, Choices]:
        body = decode_body(raw, ChatCompletionRequest)
        if (trace := TRACE.get()) is not None:
            trace.phase("parse")
        model, choices = await self.chat_choices(body, f"chatcmpl-{uuid.uuid4().hex}")
        if trace is not None:
            trace.phase("tokenize")  # the template and the tokeniser
        return model, body, choices

    async def chat_prompt(
        self, body: ChatCompletionRequest
    ) -> tuple[ServedModel, OutputPlan, Sequence[int]]:
        """The served model, output plan and prompt ids of a chat request (also the
        Messages API's, :mod:`dynamoctl.frontend.anthropic`)."""
        model = _model(self.registry, body.model)
        # Structured outputs, tools, reasoning (dynamoctl.structured): 400s before any work.
        try:
            plan = plan_chat(
                body, body.output_constraint(), model.card.traits, body.messages[-1].role
            )
        except StructuredError as exc:
            raise bad_request(str(exc), exc.param) from None
        prompt = _render(model, body.template_messages(), plan)
        return model, plan, await self._encode_chat(model, prompt)

    async def chat_choices(
        self, body: ChatCompletionRequest, rid: str
    ) -> tuple[ServedModel, Choices]:
        """A chat request's choices, named ``rid``, ready to run."""
        parts = image_parts(body.messages)
        ids: Sequence[int]
        if parts:
            model, plan, ids, images = await self._image_prompt(body, parts)
        else:
            (model, plan, ids), images = await self.chat_prompt(body), []
        jobs = planned(jobs_of(model, body, [ids], rid, self._max_choices), plan)
        if images:
            with_images(jobs, images)
        logprobs = body.top_logprobs_count() is not None
        choices = Choices(rid, jobs, len(ids), logprobs=logprobs)
        shapers = [plan.new_shaper() for _ in jobs]
        choices.shapers = [s for s in shapers if s is not None]
        return model, choices

    async def _completion(self, raw: bytes) -> tuple[ServedModel, _Body, Choices]:
        body = decode_body(raw, CompletionRequest)
        if (trace := TRACE.get()) is not None:
            trace.phase("parse")
        model = _model(self.registry, body.model)
        try:
            plan = plan_completion(body, model.card.traits)
        except StructuredError as exc:
            raise bad_request(str(exc), exc.param) from None
        prompts = body.prompts()
        check_choices(body, len(prompts), self._max_choices)  # before tokenising them all
        batch: list[list[int]] = []
        texts: list[str] = []
        for prompt in prompts:
            if isinstance(prompt, str):
                batch.append(await prompt_ids(self._long, model, prompt, True, "prompt"))
                texts.append(prompt)
            else:
                batch.append(list(prompt))
                texts.append(model.tokenizer.decode(prompt) if body.echo else "")
        rid = f"cmpl-{uuid.uuid4().hex}"
        jobs = planned(jobs_of(model, body, batch, rid, self._max_choices), plan)
        echo = [texts[job.index // body.choices()] for job in jobs] if body.echo else []
        logprobs = body.logprobs is not None
        choices = Choices(rid, jobs, sum(map(len, batch)), echo, logprobs=logprobs)
        choices.echo_logprobs = body.echo and logprobs
        choices.prompt_logprobs = body.prompt_logprobs is not None
        if trace is not None:
            trace.phase("tokenize")
        return model, body, choices

    async def _image_prompt(
        self, body: ChatCompletionRequest, parts: list[ImagePart]
    ) -> tuple[ServedModel, OutputPlan, list[int], list[ImageInput]]:
        """A chat prompt with images: each image part's file read and checked, its
        placeholder run in the ids (:mod:`dynamoctl.frontend.images`)."""
        model = _model(self.registry, body.model)
        vision = model.card.vision
        if vision is None:
            raise bad_request(f"model {model.name!r} takes no images", parts[0].param)
        files = await self._images.read(parts)
        try:
            plan = plan_chat(
                body, body.output_constraint(), model.card.traits, body.messages[-1].role
            )
        except StructuredError as exc:
            raise bad_request(str(exc), exc.param) from None
        if vision.at_start:  # the images' runs go first; the template sees none
            text = await self._encode_chat(model, _render(model, body.template_messages(), plan))
            return (model, plan, *placed_images([*([[]] * len(files)), text], files, vision))
        prompt = _render(model, body.template_messages(vision.placeholder), plan)
        pieces = prompt.split(vision.placeholder)
        if len(pieces) != len(files) + 1:
            raise bad_request(
                f"the chat prompt holds {len(pieces) - 1} image placeholders "
                f"({vision.placeholder!r}) for {len(files)} images: the messages' text must "
                "not contain the placeholder, and the model's chat template must keep each",
                "messages",
            )
        ids = [await prompt_ids(self._long, model, p, False, "messages") for p in pieces]
        return (model, plan, *placed_images(ids, files, vision))

    @property
    def long_text(self) -> LongTextEncoder:
        """The threads that tokenise long texts (shared with :mod:`tokenization`)."""
        return self._long

    @property
    def _max_choices(self) -> int:
        return self.generator.admission.settings.max_choices

    async def _encode_chat(self, model: ServedModel, prompt: str) -> TokenIds:
        """A rendered chat prompt's ids, tokenising only what follows the longest prefix
        an earlier turn left in the model's prefix cache (:mod:`dynamoctl.tokenizer.prefix`)."""
        tokenizer = model.tokenizer
        held = self._prefixes.get(id(tokenizer))
        if held is None or held[0] is not tokenizer:
            held = self._prefixes[id(tokenizer)] = (tokenizer, PrefixCache(tokenizer))
        cache = held[1]
        ids, rest = cache.split(prompt)  # a fresh array: extended in place
        if rest:
            ids.fromlist(await prompt_ids(self._long, model, rest, False, "messages"))
        cache.remember(prompt, ids, len(prompt) - len(rest))
        return ids


def _model(registry: ModelRegistry, name: str) -> ServedModel:
    model = registry.resolve(name)
    if model.card.embedding is not None:
        raise bad_request(
            f"model {name!r} is an embedding model: it generates no text (POST /v1/embeddings)",
            "model",
        )
    return model


def _render(model: ServedModel, messages: list[dict[str, Any]], plan: OutputPlan) -> str:
    try:
        return model.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tools=plan.template_tools
        )
    except Exception as exc:  # a template that raises on these messages
        raise bad_request(f"chat template failed: {exc}", "messages") from exc
