"""``dynamoctl planner``: the SLA planner as a process, until SIGTERM.

Start: its HTTP side (``/metrics``, ``/health``), discovery, the performance profile
(refused, naming the difference, when it was measured for another model, engine or
replica size), the load streams; then its record, which means "running"; then a decision
every ``load_interval``. It scales nothing until the supervisor's control endpoint is in
discovery, and starts from the replica counts the supervisor reports."""

from __future__ import annotations

import logging
from pathlib import Path

from dynamoctl.component.runtime import ComponentRuntime
from dynamoctl.discovery import keys
from dynamoctl.planner.http import build_app
from dynamoctl.planner.perf import PerfModel, check_profile, load_profile
from dynamoctl.planner.service import PlannerService
from dynamoctl.planner.settings import PlannerOptions
from dynamoctl.wire.records import Component, Endpoint

log = logging.getLogger(__name__)

COMPONENT = Component.PLANNER


def perf_model(options: PlannerOptions) -> PerfModel | None:
    """The profile's model, checked against every pool; None without a profile (the
    throughput loop then holds). :class:`~dynamoctl.planner.perf.ProfileError` says why
    one cannot be used."""
    path = options.planner.profile
    if path is None:
        return None
    profile = load_profile(Path(path).expanduser())
    pools = options.pools
    for gpus in pools.gpus().values():
        model = pools.model or profile.model  # unnamed: not checked
        check_profile(profile, model=model, engine=pools.engine, gpus_per_replica=gpus)
    return PerfModel(profile)


async def run_planner(opts: PlannerOptions) -> None:
    runtime = ComponentRuntime(COMPONENT, opts)
    planner = PlannerService(opts, runtime.discovery, perf_model(opts))
    registered = [False]
    http = runtime.serve_http(build_app(planner, registered), opts.http_port)
    runtime.on_close(planner.close)
    async with runtime:
        await planner.start()
        key = keys.instance_key(opts.namespace, COMPONENT, Endpoint.PLAN, runtime.instance_id)
        address = f"http://{opts.host}:{http.port}"
        await runtime.register(key, runtime.record(Endpoint.PLAN, address, model=opts.pools.model))
        registered[0] = True
        settings = opts.planner
        log.info(
            "planning %s (mode %s, TTFT %g ms, ITL %g ms, GPU budget %d), metrics on %s/metrics",
            ", ".join(spec.role for spec in planner.specs),
            settings.mode,
            settings.ttft_target_ms,
            settings.itl_target_ms,
            settings.gpu_budget,
            address,
        )
        await planner.run(runtime.stop)
        log.info("stopping: leaving discovery")
        await runtime.leave()
