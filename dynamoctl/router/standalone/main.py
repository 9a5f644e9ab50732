"""``dynamoctl router``: a router replica until SIGTERM.

Start: bookings stream and its record first (the other replicas start applying ours),
then the model routers, a bounded warm-up (workers known, the other replicas' bookings
applied), and last the instance record frontends act on. SIGTERM/SIGINT: the instance
record goes first (frontends stop asking), calls in flight get ``drain_grace`` seconds,
then everything closes and the lease is revoked (the other replicas drop our bookings).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket

from dynamoctl import wire
from dynamoctl.discovery import keys
from dynamoctl.router.standalone.http import build_app
from dynamoctl.router.standalone.server import ROUTE, RouteServer
from dynamoctl.settings import RouterOptions
from dynamoctl.util.http import BoundServer
from dynamoctl.wire.records import Component

log = logging.getLogger(__name__)

COMPONENT = Component.ROUTER


async def run_router(opts: RouterOptions) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    settings = opts.router
    discovery = opts.open_discovery()
    instance_id = f"{socket.gethostname()}-{os.getpid()}"
    server = RouteServer(
        discovery,
        opts.namespace,
        instance_id,
        settings,
        host=opts.host,
        booking_ttl=opts.booking_ttl,
    )
    ready = [False]
    http = BoundServer(build_app(server, ready), opts.host, opts.http_port)
    http_task = asyncio.create_task(http.run_bound(), name="router-http")
    key = keys.instance_key(opts.namespace, COMPONENT, ROUTE, instance_id)
    try:
        await discovery.start()
        await server.start()
        await server.bookings.register()
        if not await server.warm_up(opts.warm_up):
            log.warning("serving before every model had a worker and every peer its state")
        record = wire.InstanceRecord(
            instance_id=instance_id,
            component=COMPONENT,
            endpoint=ROUTE,
            address=server.server.address,
            host=socket.gethostname(),
            pid=os.getpid(),
            metrics_url=f"http://{opts.host}:{http.port}/metrics",
            label=opts.label,
        )
        await discovery.register(key, wire.encode_json(record))
        ready[0] = True
        log.info(
            "routing (%s) on %s, metrics on http://%s:%d/metrics, namespace %s",
            settings.mode,
            server.server.address,
            opts.host,
            http.port,
            opts.namespace,
        )
        await stop.wait()
        log.info("stopping: leaving discovery")
        with contextlib.suppress(Exception):  # discovery down: the lease expiry does it
            await discovery.unregister(key)
        # Frontends see the record go within milliseconds; calls in flight take less.
        await asyncio.sleep(opts.drain_grace)
    finally:
        await server.close()
        http.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await http_task
        await discovery.close()
        log.info("router stopped")
