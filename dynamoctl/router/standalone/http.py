"""The router process's HTTP side: ``/metrics`` (Prometheus), ``/health``, ``/live``.

Read at scrape time from the routers, so nothing on the route path updates gauges. The
booked-load gauges count every replica's bookings as this replica applies them: equal
values on two replicas mean they see the same load (names in docs/metrics.md).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from dynamoctl.router.standalone.server import RouteServer

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_PREFIX = "dynamoctl_router_"


class RouterCollector(Collector):
    def __init__(self, server: RouteServer) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        per_worker = {
            "booked_prefill_tokens": "Prompt tokens booked for prefill (all replicas).",
            "booked_active_blocks": "KV blocks booked by requests in flight (all replicas).",
            "booked_requests": "Requests in flight booked on the worker (all replicas).",
        }
        worker_families = {
            name: GaugeMetricFamily(_PREFIX + name, doc, labels=["model", "worker"])
            for name, doc in per_worker.items()
        }
        workers = GaugeMetricFamily(
            _PREFIX + "workers", "Routable agg and decode workers.", labels=["model"]
        )
        prefill_workers = GaugeMetricFamily(
            _PREFIX + "prefill_workers", "Prefill workers (disaggregation).", labels=["model"]
        )
        bookings = GaugeMetricFamily(
            _PREFIX + "bookings", "Bookings held, by origin (own, peers).",
            labels=["model", "origin"],
        )  # fmt: skip
        picks = CounterMetricFamily(
            _PREFIX + "picks", "Route calls by outcome.", labels=["model", "outcome"]
        )
        srv, sync = self.server, self.server.bookings
        for model, pools in srv.models.items():
            workers.add_metric([model], len(pools.main.router.workers()))
            prefill_workers.add_metric([model], pools.prefill_workers())
            for router in (pools.main.router, pools.prefill.router):
                load = router.load
                for worker in router.workers():
                    values = {
                        "booked_prefill_tokens": load.prefill_tokens(worker),
                        "booked_active_blocks": load.active_blocks(worker),
                        "booked_requests": load.requests(worker),
                    }
                    for name, value in values.items():
                        worker_families[name].add_metric([model, worker], float(value))
            bookings.add_metric([model, "own"], sync.own_bookings(model))
            bookings.add_metric([model, "peers"], sync.peer_bookings(model))
        for (model, outcome), count in sorted(srv.picks.items()):
            picks.add_metric([model, outcome], count)
        yield from worker_families.values()
        yield workers
        yield prefill_workers
        yield bookings
        yield picks
        yield GaugeMetricFamily(
            _PREFIX + "peers", "Other router replicas whose bookings are applied.",
            value=len(sync.peers()),
        )  # fmt: skip
        yield CounterMetricFamily(
            _PREFIX + "notifications", "Booking releases received from frontends.",
            value=srv.notifications,
        )  # fmt: skip
        yield CounterMetricFamily(
            _PREFIX + "expired_bookings", "Own bookings released by the TTL.", value=sync.expired
        )
        yield GaugeMetricFamily(
            _PREFIX + "pending_peer_bookings",
            "Other replicas' bookings waiting for their model or worker to be known here.",
            value=sync.pending(),
        )


def build_app(server: RouteServer, ready: list[bool]) -> Starlette:
    """``ready[0]`` flips to True once the route endpoint is registered."""
    registry = CollectorRegistry()
    registry.register(RouterCollector(server))

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE)

    async def health(_: Request) -> Response:
        models = [m for m, _ in server.models.items()]
        if not ready[0]:
            return JSONResponse({"status": "starting"}, status_code=503)
        return JSONResponse({"status": "ready", "models": models, "peers": server.bookings.peers()})

    async def live(_: Request) -> Response:
        return PlainTextResponse("ok")

    return Starlette(
        routes=[Route("/metrics", metrics), Route("/health", health), Route("/live", live)]
    )
