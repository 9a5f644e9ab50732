"""``dynamoctl worker``: a process hosting one or more worker instances until SIGTERM.

SIGTERM or SIGINT drains (deregister, finish in-flight within ``drain_grace``, abort the
rest), then closes everything and revokes the process's lease. A second signal during the
drain skips the rest of the grace period. An instance whose engine dies fails its requests
and deregisters; the others drain, and the process exits non-zero naming the cause (for
its supervisor to restart it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket

from dynamoctl.engines.registry import create_engine
from dynamoctl.settings import WorkerOptions
from dynamoctl.util.http import BoundServer
from dynamoctl.worker.http import build_app
from dynamoctl.worker.instance import WorkerInstance

log = logging.getLogger(__name__)


async def run_worker(opts: WorkerOptions) -> None:
    stop = asyncio.Event()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        stop.set()
        for inst in instances:  # before any engine process the signal reached can die
            inst.stopping = True
        if signals > 1:
            log.warning("second signal: skipping the rest of the drain")
            for task in draining:
                task.cancel()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)

    draining: list[asyncio.Task[int]] = []
    instances: list[WorkerInstance] = []
    ready = [False]
    http = BoundServer(build_app(instances, ready), opts.host, opts.http_port)
    discovery = opts.open_discovery()
    instances += [
        WorkerInstance(
            create_engine(opts.engine, opts.engine_options),
            discovery,
            namespace=opts.namespace,
            role=opts.role,
            host=opts.host,
            instance_id=f"{socket.gethostname()}-{os.getpid()}-{i}",
            metrics_url=f"http://{opts.host}:{http.port}/metrics",
            label=opts.label,
        )
        for i in range(opts.num_workers)
    ]
    http_task = asyncio.create_task(http.run_bound(), name="worker-http")
    started: list[WorkerInstance] = []
    try:
        await discovery.start()
        for inst in instances:
            await inst.start()
            started.append(inst)
        ready[0] = True
        log.info(
            "%d instance(s) ready; metrics on http://%s:%d/metrics",
            len(instances),
            opts.host,
            http.port,
        )
        watches = [asyncio.create_task(inst.watch_engine()) for inst in started]
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait([stopping, *watches], return_when=asyncio.FIRST_COMPLETED)
        for task in [stopping, *watches]:
            task.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
        live = [inst for inst in started if inst.death is None]
        draining.extend(asyncio.create_task(inst.drain(opts.drain_grace)) for inst in live)
        await asyncio.gather(*draining, return_exceptions=True)
        if dead := [inst.death for inst in started if inst.death is not None]:
            raise dead[0]  # the CLI prints it as one line and exits 1
    finally:
        for inst in started:
            await inst.close()
        http.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await http_task
        await discovery.close()  # revokes the lease: anything left vanishes now
        log.info("worker stopped")
