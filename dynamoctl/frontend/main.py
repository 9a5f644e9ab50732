"""``dynamoctl frontend``: the OpenAI-compatible HTTP endpoint, with the router embedded
or asking the standalone ``dynamoctl router`` replicas (``--router``).

Several frontends of one deployment (``--share-bookings``) share their embedded routers'
bookings; those of one host share the port (``--reuse-port``). See docs/operations.md,
"Many frontends".

SIGTERM/SIGINT: the frontend leaves discovery, stops accepting connections, lets open
streams finish for ``drain_grace`` seconds, then closes.

API keys (``--api-keys-file``/``--api-keys-env``) are read before anything starts: a
source that is named but holds no key stops the frontend rather than leave it open. The
file is read again whenever it changes (:mod:`dynamoctl.frontend.tenants`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from dynamoctl.component.runtime import ComponentRuntime
from dynamoctl.discovery import keys
from dynamoctl.frontend.app import build_app
from dynamoctl.frontend.disagg import Prefiller
from dynamoctl.frontend.generate import Admission, Generator
from dynamoctl.frontend.longtext import limit_malloc_arenas
from dynamoctl.frontend.metrics import FrontendMetrics
from dynamoctl.frontend.models import ModelRegistry
from dynamoctl.frontend.routing import EmbeddedRouting, create_routing
from dynamoctl.frontend.tenants.reload import background
from dynamoctl.frontend.tenants.service import Tenants
from dynamoctl.frontend.tenants.shared import SharedLimits
from dynamoctl.planes.request import RequestClient
from dynamoctl.settings import FrontendOptions
from dynamoctl.wire.records import Component, Endpoint

log = logging.getLogger(__name__)


async def run_frontend(opts: FrontendOptions) -> None:
    limit_malloc_arenas()  # before any thread: memory goes back after bursts
    runtime = ComponentRuntime(Component.FRONTEND, opts)
    metrics = FrontendMetrics()
    tenants = _tenants(opts, runtime, metrics)
    silence = opts.streams.stream_silence_timeout
    client = RequestClient(heartbeat_interval=silence / 4, heartbeat_timeout=silence)
    routing = create_routing(
        opts.routing, runtime.discovery, opts.namespace, opts.router, opts.route_timeout
    )
    if opts.share_bookings and isinstance(routing, EmbeddedRouting):
        routing.share_bookings(runtime.instance_id, _reachable(opts.host))
    routing.register_metrics(metrics.registry)
    registry = ModelRegistry(runtime.discovery, opts.namespace, routing.make_picker)
    admission = Admission(opts.admission, on_queued=tenants.queued if tenants else None)
    if tenants is not None:
        tenants.on_reload = admission.wake_all  # a revoked key's queued requests leave
    generator = Generator(
        client, metrics, admission=admission, prefiller=Prefiller(client, metrics, opts.disagg)
    )
    app = build_app(
        registry,
        generator,
        metrics,
        tenants=tenants,
        max_body_bytes=opts.http.max_body_bytes,
        max_stored_responses=opts.responses.max_stored_responses,
        images=opts.images,
    )
    served: Any = app
    if runtime.tracer is not None:  # off: not even installed (docs/operations.md, "Traces")
        from dynamoctl.tracing.asgi import TracingMiddleware

        served = TracingMiddleware(app, runtime.tracer)
    http = runtime.serve_http(
        served,
        opts.port,
        limits=opts.http,
        reuse_port=opts.reuse_port,
        timeout_graceful_shutdown=opts.drain_grace,  # open streams finish on the way out
    )
    if tenants is not None and tenants.shared is not None:
        runtime.on_close(tenants.shared.close)  # slots and overruns handed back first
    for closer in (client.close, routing.close, registry.close):
        runtime.on_close(closer)  # closed after HTTP, in reverse: registry first
    async with runtime:
        await routing.start()
        await registry.start()
        if tenants is not None:
            label = opts.label or runtime.instance_id
            ns, instance = opts.namespace, runtime.instance_id
            for work in background(tenants, runtime.discovery, ns, instance, label):
                runtime.on_close(_cancelling(asyncio.create_task(work, name="keys")))
        base = f"http://{opts.host}:{http.port}"
        key = keys.instance_key(
            opts.namespace, Component.FRONTEND, Endpoint.HTTP, runtime.instance_id
        )
        await runtime.register(key, runtime.record(Endpoint.HTTP, base))
        log.info(
            "OpenAI API on %s/v1 (namespace %s, router %s, %s)",
            base,
            opts.namespace,
            opts.router.mode if opts.routing == "embedded" else opts.routing,
            "API keys required" if tenants else "no API keys",
        )
        await runtime.stop.wait()
        log.info("stopping: leaving discovery, finishing open streams")
        await runtime.leave()


def _tenants(
    opts: FrontendOptions, runtime: ComponentRuntime, metrics: FrontendMetrics
) -> Tenants | None:
    """The keys, with limits shared with the deployment's other frontends when it runs
    several (``--shared-limits N``)."""
    if not opts.api_keys.has_keys():
        return None
    shared = None
    if opts.shared_limits > 1:
        shared = SharedLimits(
            runtime.discovery.store, opts.namespace, runtime.instance_id, opts.shared_limits
        )
    return Tenants(opts.api_keys, metrics.registry, shared)


def _reachable(host: str) -> str:
    """An address of this host the other frontends reach: ``host`` unless a wildcard."""
    return socket.gethostbyname(socket.gethostname()) if host in ("0.0.0.0", "::") else host


def _cancelling(task: asyncio.Task[None]) -> Callable[[], Awaitable[None]]:
    async def cancel() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return cancel
