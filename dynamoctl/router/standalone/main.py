"""``dynamoctl router``: a router replica until SIGTERM.

Start: bookings stream and its record first (the other replicas start applying ours),
then the model routers, a bounded warm-up (workers known, the other replicas' bookings
applied), and last the instance record frontends act on. SIGTERM/SIGINT: the instance
record goes first (frontends stop asking), calls in flight get ``drain_grace`` seconds,
then everything closes and the lease is revoked (the other replicas drop our bookings).
"""

from __future__ import annotations

import asyncio
import logging

from dynamoctl.component.runtime import ComponentRuntime
from dynamoctl.discovery import keys
from dynamoctl.router.standalone.http import build_app
from dynamoctl.router.standalone.server import ROUTE, RouteServer
from dynamoctl.settings import RouterOptions
from dynamoctl.wire.records import Component

log = logging.getLogger(__name__)

COMPONENT = Component.ROUTER


async def run_router(opts: RouterOptions) -> None:
    runtime = ComponentRuntime(COMPONENT, opts)
    server = RouteServer(
        runtime.discovery,
        opts.namespace,
        runtime.instance_id,
        opts.router,
        host=opts.host,
        booking_ttl=opts.replica.booking_ttl,
    )
    ready = [False]
    http = runtime.serve_http(build_app(server, ready), opts.http_port)
    runtime.on_close(server.close)
    async with runtime:
        await server.start()
        await server.bookings.register()
        if not await server.warm_up(opts.replica.warm_up):
            log.warning("serving before every model had a worker and every peer its state")
        key = keys.instance_key(opts.namespace, COMPONENT, ROUTE, runtime.instance_id)
        await runtime.register(key, runtime.record(ROUTE, server.server.address))
        ready[0] = True
        log.info(
            "routing (%s) on %s, metrics on http://%s:%d/metrics, namespace %s",
            opts.router.mode,
            server.server.address,
            opts.host,
            http.port,
            opts.namespace,
        )
        await runtime.stop.wait()
        log.info("stopping: leaving discovery")
        await runtime.leave()
        # Frontends see the record go within milliseconds; calls in flight take less.
        await asyncio.sleep(opts.drain_grace)
