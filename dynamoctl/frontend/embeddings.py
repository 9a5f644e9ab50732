"""``POST /v1/embeddings``: OpenAI's embeddings API, on an embedding model's workers
(recipe ``model.task: embed``; docs/api.md, "Embeddings").

Each input is one engine request carrying :class:`~dynamoctl.wire.engine.Pooling`: it
goes through the same pipeline as a generation (:class:`Generator`: admission, the
router's pick, a worker that dies is left for another), and its one chunk carries the
vector. Inputs of one request run at once, bounded like batched prompts by the
frontend's ``max_choices``. Body limits, API keys, the compatibility policy and
refusals apply as on every endpoint; a request for a text model, or a model's embedding
for text generation, is a 400 naming ``model``.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import struct
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.responses import JSONResponse

from dynamoctl.frontend import compat
from dynamoctl.frontend.asgi import Disconnect, Receive, Scope, Send, read_body
from dynamoctl.frontend.body import decode_body, prompt_ids, too_long
from dynamoctl.frontend.errors import OpenAIError, ParamError, bad_request, internal_error
from dynamoctl.frontend.generate import Generator, Job, Outcome
from dynamoctl.frontend.longtext import LongTextEncoder
from dynamoctl.frontend.metrics import FrontendMetrics
from dynamoctl.frontend.models import ModelRegistry, ServedModel
from dynamoctl.frontend.refusals import LINES, Refusals
from dynamoctl.frontend.respond import count_outcomes
from dynamoctl.wire.engine import EmbeddingTraits, GenerateRequest, Pooling
from dynamoctl.wire.ids import packed

log = logging.getLogger(__name__)

ENDPOINT = "embeddings"

TokenId = Annotated[int, Field(ge=0, lt=2**31)]


class EmbeddingRequest(BaseModel):
    """OpenAI's embeddings request (and the vLLM extensions docs/api.md lists)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    model: str = Field(min_length=1)
    """An embedding model's name."""
    input: str | list[str] | list[TokenId] | list[list[TokenId]]
    """Text(s) or token list(s) to embed."""
    encoding_format: Literal["float", "base64"] = "float"
    """``float``: a list of numbers; ``base64``: little-endian float32 bytes, base64."""
    dimensions: int | None = Field(default=None, ge=1)
    """Shorten each embedding to its first ``dimensions`` (a Matryoshka model)."""
    user: str | None = None
    """Informational."""
    add_special_tokens: bool = True
    """String inputs: add the tokenizer's special tokens (vLLM's extension)."""

    @model_validator(mode="before")
    @classmethod
    def _policy(cls, data: Any) -> Any:
        return compat.check_unsupported(data, "embeddings")

    @model_validator(mode="after")
    def _not_empty(self) -> EmbeddingRequest:
        if not self.input:
            raise ParamError("input", "input is empty: give a string, a list of strings or tokens")
        inputs = self.inputs()
        for i, item in enumerate(inputs):
            if not item:
                param = "input" if len(inputs) == 1 else f"input.{i}"
                raise ParamError(param, f"{param} is empty: nothing to embed")
        return self

    def inputs(self) -> list[str | list[int]]:
        """Each input to embed, in order."""
        value = self.input
        if isinstance(value, str):
            return [value]
        if isinstance(value[0], int):
            return [value]  # one token list
        return list(value)


class Embeddings:
    """The ``/v1/embeddings`` handler (raw ASGI: a client that leaves cancels its work)."""

    def __init__(
        self,
        registry: ModelRegistry,
        generator: Generator,
        metrics: FrontendMetrics,
        encoder: LongTextEncoder,
        refusals: Refusals,
        max_body_bytes: int,
    ) -> None:
        self.registry = registry
        self.generator = generator
        self.metrics = metrics
        self.encoder = encoder
        self.refusals = refusals
        self.max_body_bytes = max_body_bytes

    async def create(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            raw = await read_body(scope, receive, self.max_body_bytes)
            if raw is None:
                return  # the client left before sending its whole body
            body = decode_body(raw, EmbeddingRequest)
            model = self.registry.resolve(body.model)
            dimensions = _dimensions(model, body.dimensions)
            prompts = await self._prompts(model, body)
        except OpenAIError as exc:
            self.refusals.refused("POST", scope["path"], exc)
            await exc.response()(scope, receive, send)
            return
        except Exception:
            log.exception("embeddings request failed")
            bug = internal_error()
            self.refusals.refused("POST", scope["path"], bug)
            await bug.response()(scope, receive, send)
            return
        rid = f"embd-{uuid.uuid4().hex}"
        jobs = [
            Job(
                f"{rid}-{i}",
                model.name,
                GenerateRequest(f"{rid}-{i}", packed(ids), 1, pooling=Pooling(dimensions)),
                index=i,
            )
            for i, ids in enumerate(prompts)
        ]
        await self._serve(model, jobs, body.encoding_format, (scope, receive, send))

    async def _prompts(self, model: ServedModel, body: EmbeddingRequest) -> list[list[int]]:
        """Each input's token ids, checked against the batch limit and the context."""
        inputs = body.inputs()
        limit = self.generator.admission.settings.max_choices
        if len(inputs) > limit:
            raise bad_request(
                f"{len(inputs)} inputs exceed the frontend's limit of {limit}: send fewer, "
                "or raise it (recipe field frontend.max_choices, or dynamoctl frontend "
                "--max-choices)",
                "input",
            )
        context, vocab = model.card.context_length, model.tokenizer.vocab_size
        prompts: list[list[int]] = []
        for i, item in enumerate(inputs):
            param = "input" if len(inputs) == 1 else f"input.{i}"
            if isinstance(item, str):
                ids = await prompt_ids(self.encoder, model, item, body.add_special_tokens, param)
            else:
                ids = item
                if max(ids) >= vocab:
                    raise bad_request(
                        f"{param}: {max(ids)} is not a token id of this model (its "
                        f"vocabulary has {vocab})",
                        param,
                    )
            if len(ids) > context:
                raise too_long(context, len(ids), param)
            prompts.append(ids)
        return prompts

    async def _serve(
        self,
        model: ServedModel,
        jobs: list[Job],
        encoding: str,
        exchange: tuple[Scope, Receive, Send],
    ) -> None:
        scope, receive, send = exchange
        name, metrics = model.name, self.metrics
        outcomes = [Outcome() for _ in jobs]
        metrics.received.labels(name).inc()
        metrics.input_tokens.labels(name).inc(sum(len(j.prompt_ids) for j in jobs))
        metrics.inflight.labels(name).inc()
        watch = Disconnect(receive)
        error: BaseException | None = None
        try:
            pairs = zip(jobs, outcomes, strict=True)
            await asyncio.gather(*(self._embed(model, job, outcome) for job, outcome in pairs))
        except BaseException as exc:
            error = exc
        finally:
            watch.stop()
            metrics.inflight.labels(name).dec()
        if error is None:
            count_outcomes(metrics, name, ENDPOINT, outcomes, "200")
            reply = _reply(name, jobs, outcomes, encoding)
            await JSONResponse(reply)(scope, receive, send)
            return
        if isinstance(error, asyncio.CancelledError) and watch.gone:
            metrics.cancellations.labels(name).inc()
            watch.absorb()
            return
        if not isinstance(error, Exception):
            raise error
        if not isinstance(error, OpenAIError):
            log.error("embeddings request %s failed", jobs[0].request_id, exc_info=error)
        refused = error if isinstance(error, OpenAIError) else internal_error()
        count_outcomes(metrics, name, ENDPOINT, outcomes, str(refused.status))
        LINES.refused(f"{ENDPOINT} request {jobs[0].request_id}", refused)
        await refused.response()(scope, receive, send)

    async def _embed(self, model: ServedModel, job: Job, outcome: Outcome) -> None:
        async for _ in self.generator.run(job, model.tokenizer, model.picker, outcome):
            pass
        if outcome.embedding is None:
            raise RuntimeError(f"worker ended {job.request_id} without an embedding")


def _dimensions(model: ServedModel, asked: int | None) -> int | None:
    """What to ask the engine for: None (the model's size) or a shorter length."""
    traits: EmbeddingTraits | None = model.card.embedding
    if traits is None:
        raise bad_request(
            f"model {model.name!r} generates text; it serves no embeddings (an embedding "
            "model is a recipe with model.task: embed)",
            "model",
        )
    if asked is None or asked == traits.size:
        return None
    if not traits.matryoshka:
        raise bad_request(
            f"dimensions {asked}: this model's embeddings have {traits.size} dimensions and "
            "cannot be shortened",
            "dimensions",
        )
    if asked > traits.size:
        raise bad_request(
            f"dimensions {asked}: this model's embeddings have {traits.size} at most",
            "dimensions",
        )
    return asked


def _reply(name: str, jobs: list[Job], outcomes: list[Outcome], encoding: str) -> dict[str, Any]:
    data = []
    for job, outcome in zip(jobs, outcomes, strict=True):
        vector = outcome.embedding or []
        value: list[float] | str = vector
        if encoding == "base64":
            packed = struct.pack(f"<{len(vector)}f", *vector)  # float32, little-endian
            value = base64.b64encode(packed).decode("ascii")
        data.append({"object": "embedding", "index": job.index, "embedding": value})
    tokens = sum(len(j.prompt_ids) for j in jobs)
    return {
        "id": jobs[0].request_id.rpartition("-")[0],
        "object": "list",
        "created": int(time.time()),
        "model": name,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
