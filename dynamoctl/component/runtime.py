"""One life for every long-running component (worker, frontend, router), so that their
start-up and shutdown cannot drift apart:

1. SIGTERM/SIGINT set :attr:`ComponentRuntime.stop` and call ``on_signal`` with how many
   came (the worker marks its instances stopping at once, and skips the rest of its drain
   on a second one);
2. the HTTP server (``/metrics``, ``/health``, or the OpenAI API) listens first, so the
   port is known for the records; discovery starts;
3. the component starts its own parts, then :meth:`~ComponentRuntime.register` s its
   records, the last one meaning "ready" (the first also freezes the process's start-up
   heap: :func:`settle_heap_at_ready`);
4. on stop, :meth:`~ComponentRuntime.leave` deletes the records (an unreachable discovery
   is logged, not raised: the lease's expiry removes them), the component drains;
5. :meth:`~ComponentRuntime.close` stops the HTTP server (letting open streams finish
   within its graceful-shutdown time), runs the component's closers in reverse order of
   registration, and closes discovery last, which revokes the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from dynamoctl import tracing
from dynamoctl.component.http import BoundServer
from dynamoctl.discovery import Discovery, store_from_url
from dynamoctl.settings import ComponentSettings
from dynamoctl.util.aio import AsyncService
from dynamoctl.wire.records import Component, InstanceRecord, encode_json

log = logging.getLogger(__name__)

_settle_heap = False


def settle_heap_at_ready() -> None:
    """Have this process's first registered record freeze its heap (a component's own
    process; ``dynamoctl.cli.common.run_component`` calls this). What a component made
    while starting (modules, the model's card, its tokenizer and templates) lives as long
    as the process; ``gc.freeze`` moves it out of the collector's generations, so a full
    collection walks only what serving made since. Before, a frontend's full collections
    under load paused its event loop 35-44 ms each, every request in flight waiting
    (docs/operations.md, "Garbage collection")."""
    global _settle_heap
    _settle_heap = True


class ComponentRuntime(AsyncService):
    """The process-level parts of a component; use as ``async with``."""

    def __init__(self, component: Component, options: ComponentSettings) -> None:
        self.component = component
        self.options = options
        self.discovery = Discovery(
            store_from_url(options.discovery),
            lease_ttl=options.lease_ttl,
            connect_timeout=options.discovery_wait,
        )
        self.stop = asyncio.Event()
        self.signals = 0
        self.on_signal: Callable[[int], None] = lambda count: None
        self.instance_id = f"{socket.gethostname()}-{os.getpid()}"
        self.tracer = tracing.enable(options.tracing, component, options.label or self.instance_id)
        """OpenTelemetry spans (``--otlp-endpoint``); None: tracing off."""
        self.http: BoundServer | None = None
        self._http_task: asyncio.Task[None] | None = None
        self._keys: list[str] = []
        self._closers: list[Callable[[], Awaitable[Any]]] = []

    def serve_http(self, app: Any, port: int, **config: Any) -> BoundServer:
        """Listen on ``options.host``:``port`` (0: any) now; serve once started."""
        self.http = BoundServer(app, self.options.host, port, **config)
        return self.http

    @property
    def metrics_url(self) -> str | None:
        return self._url("/metrics")

    @property
    def health_url(self) -> str | None:
        return self._url("/health")

    def _url(self, path: str) -> str | None:
        # The process's own port: with a shared port (SO_REUSEPORT) a scrape or probe
        # there would reach any of the processes sharing it.
        if self.http is None:
            return None
        return f"http://{self.options.host}:{self.http.own_port}{path}"

    def on_close(self, closer: Callable[[], Awaitable[Any]]) -> None:
        """Run ``closer`` on the way out (closers run in reverse order, after HTTP stops)."""
        self._closers.append(closer)

    def record(self, endpoint: str, address: str, **fields: Any) -> InstanceRecord:
        """This process's instance record, with what every component puts in it."""
        return InstanceRecord(
            instance_id=fields.pop("instance_id", self.instance_id),
            component=self.component,
            endpoint=endpoint,
            address=address,
            host=socket.gethostname(),
            pid=os.getpid(),
            metrics_url=fields.pop("metrics_url", self.metrics_url),
            health_url=fields.pop("health_url", self.health_url),
            label=self.options.label,
            **fields,
        )

    async def register(self, key: str, record: InstanceRecord) -> None:
        await self.discovery.register(key, encode_json(record))
        self._keys.append(key)
        global _settle_heap
        if _settle_heap:
            _settle_heap = False
            gc.collect()  # start-up's garbage goes first: frozen, it would stay for good
            gc.freeze()

    async def leave(self) -> None:
        """Delete this process's records: routers and frontends stop sending to it."""
        for key in self._keys:
            try:
                await self.discovery.unregister(key)
            except Exception as exc:  # discovery down: the lease's expiry removes it
                log.warning("could not leave discovery (%s): its lease will expire", exc)
        self._keys.clear()

    def _on_signal(self) -> None:
        self.signals += 1
        self.stop.set()
        self.on_signal(self.signals)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal)
        if self.http is not None:
            self._http_task = asyncio.create_task(
                self.http.run_bound(), name=f"{self.component}-http"
            )
        await self.discovery.start()

    async def close(self) -> None:
        if self.http is not None:
            self.http.should_exit = True
        if self._http_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._http_task
        for closer in reversed(self._closers):
            await closer()
        await self.discovery.close()  # revokes the lease: anything left vanishes now
        if self.tracer is not None:  # the last spans sent
            await asyncio.to_thread(self.tracer.shutdown)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        log.info("%s stopped", self.component)
