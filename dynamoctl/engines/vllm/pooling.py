"""An embedding model on vLLM's pooling runner (recipe ``model.task: embed``: vLLM's
``--runner pooling``): a request carrying ``pooling`` goes to ``AsyncLLM.encode`` with
an ``embed`` task, and its one chunk carries the vector (normalised by vLLM's pooler,
shortened by it to ``dimensions`` on a Matryoshka model)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from dynamoctl.engines.api import GenerateChunk, GenerateRequest, RequestRejected
from dynamoctl.engines.vllm import cpu_build
from dynamoctl.engines.vllm.load import LoadTracker
from dynamoctl.wire.engine import EmbeddingTraits
from dynamoctl.wire.ids import as_list

cpu_build.pin_platform()  # before vLLM resolves its platform (its imports below do)
from vllm import PoolingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402


def embedding_traits(config: Any) -> EmbeddingTraits | None:
    """What the model card says of an embedding model (None: a generative one)."""
    model = config.model_config
    if model.runner_type != "pooling":
        return None
    return EmbeddingTraits(size=int(model.embedding_size), matryoshka=bool(model.is_matryoshka))


async def embed(
    engine: Any, request: GenerateRequest, load: LoadTracker
) -> AsyncIterator[GenerateChunk]:
    """``request``'s embedding as one chunk (vLLM's errors propagate to the caller)."""
    if request.pooling is None:
        raise RequestRejected("this worker runs an embedding model (--runner pooling)")
    params = PoolingParams(task="embed", dimensions=request.pooling.dimensions)
    prompt = TokensPrompt(prompt_token_ids=as_list(request.token_ids))
    rid = request.request_id
    load.started(rid, len(request.token_ids))
    try:
        async with contextlib.aclosing(engine.encode(prompt, params, rid)) as outputs:
            async for out in outputs:
                if not out.finished:
                    continue
                load.prefilled(rid)
                chunk = GenerateChunk([], "stop", prompt_tokens=len(request.token_ids))
                chunk.cached_tokens = out.num_cached_tokens or 0
                chunk.embedding = out.outputs.data.float().tolist()
                yield chunk
    finally:
        load.finished(rid)
