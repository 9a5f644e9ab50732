"""``dynamoctl worker``: a process hosting one or more worker instances until SIGTERM.

With ``--standby`` the instances are warm spares until promoted (:mod:`.standby`).
SIGTERM or SIGINT drains (deregister, finish in-flight within ``drain_grace``, abort the
rest), then closes everything and revokes the process's lease. A second signal during the
drain skips the rest of the grace period. An instance whose engine dies fails its requests
and deregisters; the others drain, and the process exits non-zero naming the cause (for
its supervisor to restart it).
"""

from __future__ import annotations

import asyncio
import logging

from dynamoctl.component.runtime import ComponentRuntime
from dynamoctl.engines.registry import create_engine
from dynamoctl.modelcache.stage import stage_engine_weights
from dynamoctl.settings import WorkerOptions
from dynamoctl.wire.model_cache import StagingReport
from dynamoctl.wire.records import Component
from dynamoctl.wire.structured import OutputTraits
from dynamoctl.worker.http import build_app
from dynamoctl.worker.instance import WorkerInstance
from dynamoctl.worker.standby import promote_when_asked

log = logging.getLogger(__name__)


async def run_worker(opts: WorkerOptions) -> None:
    runtime = ComponentRuntime(Component.WORKER, opts)
    draining: list[asyncio.Task[int]] = []
    instances: list[WorkerInstance] = []
    started: list[WorkerInstance] = []

    def on_signal(count: int) -> None:
        for inst in instances:  # before any engine process the signal reached can die
            inst.stopping = True
        if count > 1:
            log.warning("second signal: skipping the rest of the drain")
            for task in draining:
                task.cancel()

    runtime.on_signal = on_signal
    ready = [False]
    staging: list[StagingReport] = []
    runtime.serve_http(build_app(instances, ready, staging), opts.http_port)
    # before any engine: its weights argument then names the node's copy (model.cache)
    staged = await asyncio.to_thread(
        stage_engine_weights, opts.engine, opts.engine_options, opts.model_cache
    )
    if staged.report is not None:
        staging.append(staged.report)
    instances += [
        WorkerInstance(
            create_engine(opts.engine, staged.engine_options),
            runtime.discovery,
            namespace=opts.namespace,
            role=opts.role,
            host=opts.host,
            instance_id=f"{runtime.instance_id}-{i}",
            metrics_url=runtime.metrics_url,
            health_url=runtime.health_url,
            label=opts.label,
            traits=OutputTraits(engine=opts.engine, **opts.parsers.model_dump()),
            tracer=runtime.tracer,
        )
        for i in range(opts.num_workers)
    ]

    async def close_instances() -> None:
        for inst in started:
            await inst.close()

    runtime.on_close(close_instances)
    async with runtime:
        for inst in instances:
            await inst.start(standby=opts.standby)
            started.append(inst)
        ready[0] = True
        what = "on standby" if opts.standby else "ready"
        log.info("%d instance(s) %s; metrics on %s", len(instances), what, runtime.metrics_url)
        promotion = asyncio.create_task(
            promote_when_asked(runtime.discovery, opts.namespace, started), name="promotion"
        )
        watches = [asyncio.create_task(inst.watch_engine()) for inst in started]
        stopping = asyncio.create_task(runtime.stop.wait())
        await asyncio.wait([stopping, *watches], return_when=asyncio.FIRST_COMPLETED)
        for task in [stopping, promotion, *watches]:
            task.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
        live = [inst for inst in started if inst.death is None]
        draining.extend(asyncio.create_task(inst.drain(opts.drain_grace)) for inst in live)
        await asyncio.gather(*draining, return_exceptions=True)
        if dead := [inst.death for inst in started if inst.death is not None]:
            raise dead[0]  # the CLI prints it as one line and exits 1
