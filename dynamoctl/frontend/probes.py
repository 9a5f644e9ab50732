"""The frontend's routes beside the APIs: the served models
(``/v1/models``), the probes the supervisor and load balancers read (``/health``: ready
while a model is served; ``/live``: the process answers) and ``/metrics``."""

from __future__ import annotations

from typing import Any

from prometheus_client import generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from dynamoctl.frontend.metrics import FrontendMetrics
from dynamoctl.frontend.models import ModelRegistry


def models_and_probes(registry: ModelRegistry, metrics: FrontendMetrics) -> list[Route]:
    """``/v1/models``, the probes (``/health``, ``/live``) and ``/metrics``."""

    async def list_models(request: Request) -> Response:
        models: dict[str, Any] = {
            "object": "list",
            "data": [
                {
                    "id": m.name,
                    "object": "model",
                    "created": m.created,
                    "owned_by": "dynamoctl",
                    # vLLM's: a LoRA adapter names its base model
                    "root": m.card.parent or m.name,
                    "parent": m.card.parent,
                }
                for m in registry.models()
            ],
        }
        return JSONResponse(models)

    async def health(request: Request) -> Response:
        names = [m.name for m in registry.models()]
        status = 200 if names else 503
        body = {"status": "healthy" if names else "no models", "models": names}
        return JSONResponse(body, status_code=status)

    async def live(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def prometheus(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type="text/plain; version=0.0.4")

    return [
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/live", live, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
    ]
