"""``dynamoctl frontend``: the OpenAI-compatible HTTP endpoint, with the router embedded
or asking the standalone ``dynamoctl router`` replicas (``--router``).

SIGTERM/SIGINT: the frontend leaves discovery, stops accepting connections, lets open
streams finish for ``drain_grace`` seconds, then closes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket

from dynamoctl import wire
from dynamoctl.discovery import keys
from dynamoctl.frontend.app import build_app
from dynamoctl.frontend.disagg import Prefiller
from dynamoctl.frontend.generate import Admission, Generator
from dynamoctl.frontend.metrics import FrontendMetrics
from dynamoctl.frontend.models import ModelRegistry
from dynamoctl.frontend.routing import create_routing
from dynamoctl.planes.request import RequestClient
from dynamoctl.settings import FrontendOptions
from dynamoctl.util.http import BoundServer
from dynamoctl.wire.records import Component, Endpoint

log = logging.getLogger(__name__)


async def run_frontend(opts: FrontendOptions) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    discovery = opts.open_discovery()
    metrics = FrontendMetrics()
    client = RequestClient()
    settings = opts.router
    routing = create_routing(opts.routing, discovery, opts.namespace, settings, opts.route_timeout)
    routing.register_metrics(metrics.registry)
    registry = ModelRegistry(discovery, opts.namespace, routing.make_picker)
    http = BoundServer(
        build_app(
            registry,
            Generator(
                client,
                metrics,
                admission=Admission(opts.admission),
                prefiller=Prefiller(client, metrics, opts.disagg),
            ),
            metrics,
        ),
        opts.host,
        opts.port,
        timeout_graceful_shutdown=opts.drain_grace,
    )
    instance_id = f"{socket.gethostname()}-{os.getpid()}"
    key = keys.instance_key(opts.namespace, Component.FRONTEND, Endpoint.HTTP, instance_id)
    serving = asyncio.create_task(http.run_bound(), name="frontend-http")
    try:
        await discovery.start()
        await routing.start()
        await registry.start()
        record = wire.InstanceRecord(
            instance_id=instance_id,
            component="frontend",
            endpoint="http",
            address=f"http://{opts.host}:{http.port}",
            host=socket.gethostname(),
            pid=os.getpid(),
            metrics_url=f"http://{opts.host}:{http.port}/metrics",
            label=opts.label,
        )
        await discovery.register(key, wire.encode_json(record))
        log.info(
            "OpenAI API on http://%s:%d/v1 (namespace %s, router %s)",
            opts.host,
            http.port,
            opts.namespace,
            settings.mode if opts.routing == "embedded" else opts.routing,
        )
        await stop.wait()
        log.info("stopping: leaving discovery, finishing open streams")
        await discovery.unregister(key)
    finally:
        http.should_exit = True
        await serving
        await registry.close()
        await routing.close()
        await client.close()
        await discovery.close()
        log.info("frontend stopped")
