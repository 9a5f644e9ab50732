"""What the running planner observes (docs/planner.md, "The running planner"):

- :class:`LoadWatch`: every worker's load stream (:class:`~dynamoctl.wire.engine.LoadMetrics`,
  published on change and at least every second), subscribed from the workers' discovery
  records, the latest sample of each kept with the time it came;
- :class:`FrontendScrape`: the frontends' ``/metrics`` (Prometheus text, parsed with
  prometheus_client's parser), as cumulative counters; two scrapes give a window's mean
  TTFT and ITL, request count and mean prompt and output lengths.

Both are read at each decision; neither decides anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from dataclasses import dataclass, field

import httpx
import msgspec
from prometheus_client.parser import text_string_to_metric_families

from dynamoctl.discovery import Discovery, keys
from dynamoctl.planes.events.subscriber import EventSubscriber
from dynamoctl.planes.events.tracker import Event, Snapshot
from dynamoctl.wire import frontend_metrics as names
from dynamoctl.wire.engine import LoadMetrics, decode_load
from dynamoctl.wire.records import Component, EventsRecord, InstanceRecord, decode_json

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerLoad:
    """The latest load sample of one worker instance."""

    role: str
    label: str
    """The supervisor's name of its process (``decode-1``)."""
    metrics: LoadMetrics
    at: float
    """When it arrived (monotonic)."""


class LoadWatch:
    """Follows the load streams of the workers serving ``model`` (every model when empty).
    :meth:`refresh` brings the subscriptions in line with discovery; call it each interval."""

    def __init__(self, discovery: Discovery, namespace: str, model: str = "") -> None:
        self.discovery = discovery
        self.namespace = namespace
        self.model = model
        self._subscriber = EventSubscriber(idle_poll=1.0)
        self._records: dict[str, InstanceRecord] = {}
        self._subscribed: dict[str, tuple[str, str]] = {}
        """Instance id → (publisher id, load address) of its current subscription."""
        self._latest: dict[str, tuple[LoadMetrics, float]] = {}
        self._gen = itertools.count()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._consume(), name="planner-load")

    async def close(self) -> None:
        await self._subscriber.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def refresh(self) -> None:
        """Subscribe to new workers, drop those gone (raises when discovery is down)."""
        instances = await self.discovery.list(keys.instances_prefix(self.namespace, "worker"))
        events = await self.discovery.list(keys.events_prefix(self.namespace, "worker"))
        records: dict[str, InstanceRecord] = {}
        for value in instances.values():
            with contextlib.suppress(msgspec.DecodeError):  # a newer writer's: skip it
                record = decode_json(value, InstanceRecord)
                if not self.model or record.model == self.model:
                    records[record.instance_id] = record
        streams: dict[str, EventsRecord] = {}
        for key, value in events.items():
            with contextlib.suppress(msgspec.DecodeError):
                streams[key.rpartition("/")[2]] = decode_json(value, EventsRecord)
        self._records = records
        for iid in list(self._subscribed):
            stream = streams.get(iid)
            if iid not in records or stream is None or stream.load != self._subscribed[iid][1]:
                publisher, _ = self._subscribed.pop(iid)
                await self._subscriber.remove_publisher(publisher)
                self._latest.pop(iid, None)
        for iid in records:
            stream = streams.get(iid)
            if stream is not None and iid not in self._subscribed:
                publisher = f"{iid}#{next(self._gen)}"
                self._subscribed[iid] = (publisher, stream.load)
                await self._subscriber.add_publisher(publisher, stream.load, stream.load_replay)

    def workers(self) -> list[WorkerLoad]:
        """The latest sample of every worker registered at the last refresh."""
        out = []
        for iid, record in self._records.items():
            latest = self._latest.get(iid)
            if latest is not None:
                out.append(WorkerLoad(record.role, record.label, latest[0], latest[1]))
        return out

    async def _consume(self) -> None:
        async for item in self._subscriber:
            iid, _, _ = item.publisher_id.rpartition("#")
            current = self._subscribed.get(iid)
            if current is None or current[0] != item.publisher_id:
                continue  # from a subscription replaced meanwhile
            if isinstance(item, Event | Snapshot):  # a lost update needs nothing: one follows
                try:
                    self._latest[iid] = (decode_load(item.payload), time.monotonic())
                except msgspec.DecodeError as exc:
                    log.warning("bad load sample from %s: %s", iid, exc)


SERVED = frozenset({"200", "error"})
"""``requests_total`` statuses of requests that were generated for (``error``: a stream
that failed after its headers); the others were refused (docs/metrics.md)."""

_FAMILIES = {
    names.REQUESTS_RECEIVED: {f"{names.REQUESTS_RECEIVED}_total": "received"},
    names.REQUESTS: {f"{names.REQUESTS}_total": "requests"},
    names.INPUT_TOKENS: {f"{names.INPUT_TOKENS}_total": "input_tokens"},
    names.OUTPUT_TOKENS: {f"{names.OUTPUT_TOKENS}_total": "output_tokens"},
    names.TIME_TO_FIRST_TOKEN: {
        f"{names.TIME_TO_FIRST_TOKEN}_sum": "ttft_sum",
        f"{names.TIME_TO_FIRST_TOKEN}_count": "ttft_count",
    },
    names.INTER_TOKEN_LATENCY: {
        f"{names.INTER_TOKEN_LATENCY}_sum": "itl_sum",
        f"{names.INTER_TOKEN_LATENCY}_count": "itl_count",
    },
}
"""Metric family → sample name → :class:`FrontendTotals` field (docs/metrics.md)."""
COUNTERS: tuple[str, ...] = tuple(f for names in _FAMILIES.values() for f in names.values())
"""The counters a scrape reads (the fields of :class:`FrontendTotals` but ``at``)."""


@dataclass(frozen=True)
class FrontendTotals:
    """The frontends' cumulative counters at one scrape (summed over frontends and models)."""

    at: float
    received: float
    """Requests accepted, counted on arrival (with their prompt tokens)."""
    requests: float
    """Requests ended, counted at their end (with their output tokens)."""
    input_tokens: float
    output_tokens: float
    ttft_sum: float
    ttft_count: float
    itl_sum: float
    itl_count: float
    queued: dict[str, float] = field(default_factory=dict)
    """Requests waiting in the frontends' admission queues now, by priority class (a
    gauge: every worker busy for them), summed over the frontends."""


@dataclass(frozen=True)
class Window:
    """What the frontends saw between two scrapes."""

    seconds: float
    requests: float
    """Requests that arrived (under a backlog, more than ended)."""
    mean_isl: float
    """Mean prompt length of those that arrived."""
    mean_osl: float
    """Mean output length of those that ended."""
    ttft: float | None
    """Mean time to first token; None when no request got one."""
    itl: float | None
    queued: dict[str, float] = field(default_factory=dict)
    """The frontends' admission queues at the window's end, by class."""


def window(before: FrontendTotals, after: FrontendTotals) -> Window | None:
    """The window between two scrapes; None when a counter went back (a frontend
    restarted: its counters started again) or no time passed."""
    d = {name: getattr(after, name) - getattr(before, name) for name in COUNTERS}
    seconds = after.at - before.at
    if seconds <= 0 or any(value < 0 for value in d.values()):
        return None
    arrived, ended = d["received"], d["requests"]
    return Window(
        seconds=seconds,
        requests=arrived,
        mean_isl=d["input_tokens"] / arrived if arrived else 0.0,
        mean_osl=d["output_tokens"] / ended if ended else 0.0,
        ttft=d["ttft_sum"] / d["ttft_count"] if d["ttft_count"] else None,
        itl=d["itl_sum"] / d["itl_count"] if d["itl_count"] else None,
        queued=after.queued,
    )


def parse_totals(text: str, at: float, model: str = "") -> FrontendTotals:
    """The counters the planner reads from one frontend's ``/metrics`` text."""
    values = dict.fromkeys(COUNTERS, 0.0)
    queued: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == names.CLASS_QUEUED:  # the frontend's, over its models
            for sample in family.samples:
                klass = sample.labels.get("class", "")
                queued[klass] = queued.get(klass, 0.0) + sample.value
            continue
        wanted = _FAMILIES.get(family.name)
        if wanted is None:
            continue
        for sample in family.samples:
            field = wanted.get(sample.name)
            if field is None or (model and sample.labels.get("model") != model):
                continue
            if sample.labels.get("status", "200") in SERVED:  # not the refused
                values[field] += sample.value
    return FrontendTotals(at=at, **values, queued=queued)


class FrontendScrape:
    """Scrapes every frontend of the namespace (found in discovery) and sums them."""

    def __init__(self, discovery: Discovery, namespace: str, model: str = "") -> None:
        self.discovery = discovery
        self.namespace = namespace
        self.model = model
        self._http = httpx.AsyncClient(timeout=5.0, trust_env=False)

    async def totals(self) -> FrontendTotals | None:
        """The summed counters now; None when no frontend is registered or one does not
        answer (a partial sum would read as a drop in traffic)."""
        prefix = keys.instances_prefix(self.namespace, Component.FRONTEND)
        urls = []
        for value in (await self.discovery.list(prefix)).values():
            with contextlib.suppress(msgspec.DecodeError):
                record = decode_json(value, InstanceRecord)
                if record.metrics_url:
                    urls.append(record.metrics_url)
        if not urls:
            return None
        at, parts = time.monotonic(), []
        for url in urls:
            try:
                reply = await self._http.get(url)
                reply.raise_for_status()
            except httpx.HTTPError as exc:
                log.warning("frontend metrics at %s: %s", url, exc)
                return None
            parts.append(parse_totals(reply.text, at, self.model))
        queued: dict[str, float] = {}
        for part in parts:
            for klass, count in part.queued.items():
                queued[klass] = queued.get(klass, 0.0) + count
        return FrontendTotals(
            at=at,
            **{name: sum(getattr(part, name) for part in parts) for name in COUNTERS},
            queued=queued,
        )

    async def close(self) -> None:
        await self._http.aclose()
