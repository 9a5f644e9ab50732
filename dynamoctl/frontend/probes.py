"""The frontend's routes beside the APIs, on its FastAPI app: the served models
(``/v1/models``), the probes the supervisor and load balancers read (``/health``: ready
while a model is served; ``/live``: the process answers) and ``/metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from prometheus_client import generate_latest
from starlette.responses import JSONResponse, PlainTextResponse, Response

from dynamoctl.frontend.metrics import FrontendMetrics
from dynamoctl.frontend.models import ModelRegistry


def serve_models_and_probes(
    app: FastAPI, registry: ModelRegistry, metrics: FrontendMetrics
) -> None:
    """``/v1/models``, the probes (``/health``, ``/live``) and ``/metrics``."""

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {
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
