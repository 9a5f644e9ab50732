"""Probes per component kind: when an instance is ready, and whether it is healthy.

A registry by component name (``etcd``, ``router``, ``worker``, ``frontend``): a new kind
of component is a new :class:`ComponentProbe` subclass, not another branch. The HTTP and
discovery mechanics they share are :class:`dynamoctl.supervisor.health.Probes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar
from urllib.parse import urlsplit

import httpx
import msgspec

from dynamoctl.discovery import store_from_url
from dynamoctl.launch.api import InstanceSpec
from dynamoctl.supervisor.health import Probes
from dynamoctl.util.registry import Registry
from dynamoctl.wire.control import DiscoveryStatus
from dynamoctl.wire.health import WorkerHealth
from dynamoctl.wire.planner import PlannerStatus
from dynamoctl.wire.records import InstanceRecord


@dataclass(frozen=True)
class Health:
    """One health probe of a running instance."""

    answering: bool
    """Registered in discovery (where that applies) and answering its probe."""
    tokens: float | None = None
    """A worker with requests in flight: its generated-token counter, which must keep
    moving; None when progress is not in question."""
    sample: WorkerHealth | PlannerStatus | None = None
    """What a worker's or the planner's ``/health`` said (``status`` shows it)."""
    silent: bool = False
    """Its process gave no answer at all within ``probe_timeout``: the wedge check's
    input (:mod:`dynamoctl.supervisor.wedge`). False when it answered, even unhealthy,
    or when nothing was asked (no discovery record to find it by). A gang leader that
    answers while its collective waits on a member for longer than ``probe_timeout`` is
    silent too: the gang, as one instance, answers nothing."""
    silence: str = "answered no probe"
    """What the silence is, for the logs and ``status``."""


class Prober(Protocol):
    """What the supervision loop asks about an instance's current process."""

    async def ready(self, spec: InstanceSpec) -> bool:
        """Whether a STARTING instance is ready to serve."""

    async def health(self, spec: InstanceSpec) -> Health:
        """How a READY instance is doing."""

    async def reset(self) -> None:
        """Drop connections: discovery (a managed etcd) has just come up."""

    def discovery(self) -> DiscoveryStatus:
        """Whether the probes reach discovery (``status`` shows it)."""

    async def close(self) -> None: ...


def base_url(spec: InstanceSpec, port: str) -> str:
    """Where the supervisor reaches an instance's declared port (its address, not the
    name people use: a head node may resolve its own name to loopback)."""
    return f"http://{spec.address}:{spec.ports[port]}"


H = TypeVar("H", bound=msgspec.Struct)

PROBES: Registry[type[ComponentProbe]] = Registry("component probe")
"""Probes by component name; a :class:`ComponentProbe` subclass registers itself."""


class ComponentProbe:
    """How one kind of component is probed. Subclasses register under their component's
    name: ``class EtcdProbe(ComponentProbe, component="etcd")``."""

    def __init_subclass__(cls, component: str, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        PROBES.add(component, cls)

    def __init__(self, probes: Probes, model: str) -> None:
        self.probes = probes
        self.model = model

    async def ready(self, spec: InstanceSpec) -> bool:
        raise NotImplementedError

    async def health(self, spec: InstanceSpec) -> Health:
        """Default: healthy while it would still pass its readiness probe."""
        return Health(await self.ready(spec))


class EtcdProbe(ComponentProbe, component="etcd"):
    """Never wedged: a managed etcd that stops answering is discovery's outage, which
    every component rides out on its last known records (docs/discovery.md, "Outages");
    killing it would turn a pause into a loss. ``hang_timeout`` still applies."""

    async def ready(self, spec: InstanceSpec) -> bool:
        if spec.secrets:  # TLS with client certificates: ask through discovery's client
            return await self.probes.store_answers()
        return await self.probes.ok(f"{base_url(spec, 'client')}/health")


class FrontendProbe(ComponentProbe, component="frontend"):
    """Probed through its process's own port, which its record names: the frontends of one
    host share ``frontend.port`` (``SO_REUSEPORT``), where the kernel hands a connection
    to any of them, so a probe there could find a sibling ready and not this process."""

    async def ready(self, spec: InstanceSpec) -> bool:
        """Registered, and through its own port it lists the model and completes a
        one-token request: it can reach workers."""
        await self.probes.refresh_records()
        for record in self.probes.every_record.get(spec.name, []):  # a killed one's lingers
            if await self.probes.frontend_ready(_own_base(spec, record) + "/v1", self.model):
                return True
        return False

    async def health(self, spec: InstanceSpec) -> Health:
        # Liveness, not readiness: /health is 503 while no worker serves a model (a pool
        # scaled to 0, a long gang restart), which is the load balancer's business; a
        # restart would not bring a worker back. /live answers while the loop turns.
        await self.probes.refresh_records()
        record = self.probes.record_of(spec.name)
        base = _own_base(spec, record) if record is not None else base_url(spec, "http")
        return _answer(await self.probes.reply(f"{base}/live"))


def _own_base(spec: InstanceSpec, record: InstanceRecord) -> str:
    """The frontend's own port (from its record) at the address the supervisor reaches
    it by (the record holds the address it listens on, maybe a wildcard)."""
    port = urlsplit(record.health_url or "").port
    return f"http://{spec.address}:{port}" if port else base_url(spec, "http")


class RouterProbe(ComponentProbe, component="router"):
    """Ready once registered under its label; healthy while registered and ``/health``
    answers (its HTTP port is chosen at run time: the record says where)."""

    async def ready(self, spec: InstanceSpec) -> bool:
        await self.probes.refresh_records()
        # A stale listing may hold the previous process's record: not proof of this one.
        return self.probes.reachable and spec.name in self.probes.records

    async def health(self, spec: InstanceSpec) -> Health:
        await self.probes.refresh_records()
        record = self.probes.record_of(spec.name)
        if record is None or record.health_url is None:
            return Health(False)
        return _answer(await self.probes.reply(record.health_url))


class WorkerProbe(RouterProbe, component="worker"):
    """Ready once registered (the instance record means ready; a warm spare's standby record
    means on standby); healthy while registered and its ``/health`` says ready (or
    standby), with its token counter when requests are in flight."""

    async def health(self, spec: InstanceSpec) -> Health:
        await self.probes.refresh_records()
        record = self.probes.record_of(spec.name)
        if record is None or record.health_url is None:
            return Health(False)
        reply = await self.probes.reply(record.health_url)
        sample = _typed(reply, WorkerHealth)
        if sample is None or sample.status not in ("ready", "standby"):  # a spare: STANDBY
            return Health(False, silent=reply is None)
        tokens = sample.output_tokens if sample.inflight > 0 else None
        if sample.stalled_s > self.probes.health_timeout:  # a gang member is frozen
            return Health(True, tokens, sample, silent=True, silence="its gang's step stalled")
        return Health(True, tokens, sample)


class PlannerProbe(RouterProbe, component="planner"):
    """Ready once registered; healthy while registered and its ``/health`` answers its
    :class:`~dynamoctl.wire.planner.PlannerStatus` (the planner line of ``status``)."""

    async def health(self, spec: InstanceSpec) -> Health:
        await self.probes.refresh_records()
        record = self.probes.record_of(spec.name)
        if record is None or record.health_url is None:
            return Health(False)
        reply = await self.probes.reply(record.health_url)
        status = _typed(reply, PlannerStatus)
        return Health(status is not None, sample=status, silent=reply is None)


def _answer(reply: httpx.Response | None) -> Health:
    """Healthy on a 200; silent on no answer at all."""
    return Health(reply is not None and reply.status_code == 200, silent=reply is None)


def _typed(reply: httpx.Response | None, kind: type[H]) -> H | None:
    """A ``/health`` answer decoded as ``kind`` (whatever its status code), or None."""
    if reply is None:
        return None
    try:
        return msgspec.json.decode(reply.content, type=kind)
    except msgspec.DecodeError:
        return None


def probe_kind(component: str) -> type[ComponentProbe]:
    """The probe of ``component``; a name no probe knows fails, listing those it knows."""
    return PROBES[component]


class DeploymentProber:
    """The production :class:`Prober`: one HTTP client and one discovery listing shared
    by every instance's probe, opened on first use."""

    def __init__(
        self,
        discovery_url: str,
        namespace: str,
        model: str,
        max_age: float,
        api_key: str | None = None,
        health_timeout: float = 1.0,
    ) -> None:
        self.health_timeout = health_timeout
        """Seconds a READY instance's probe waits for an answer (``probe_timeout``)."""
        self.api_key = api_key
        """A key of the frontend's (its readiness probe asks the API), when it has keys."""
        self.discovery_url = discovery_url
        self.namespace = namespace
        self.model = model
        self.max_age = max_age
        """Seconds one discovery listing serves every instance's probe."""
        self._probes: Probes | None = None
        self._by_component: dict[str, ComponentProbe] = {}

    def _for(self, spec: InstanceSpec) -> ComponentProbe:
        if self._probes is None:
            store = store_from_url(self.discovery_url)
            self._probes = Probes(
                store,
                self.namespace,
                self.max_age,
                api_key=self.api_key,
                health_timeout=self.health_timeout,
            )
        probe = self._by_component.get(spec.component)
        if probe is None:
            probe = probe_kind(spec.component)(self._probes, self.model)
            self._by_component[spec.component] = probe
        return probe

    async def ready(self, spec: InstanceSpec) -> bool:
        return await self._for(spec).ready(spec)

    async def health(self, spec: InstanceSpec) -> Health:
        return await self._for(spec).health(spec)

    async def reset(self) -> None:
        await self.close()

    def discovery(self) -> DiscoveryStatus:
        if self._probes is None:
            return DiscoveryStatus(reachable=True)  # not asked yet: nothing to say
        return self._probes.discovery_status()

    async def close(self) -> None:
        probes, self._probes = self._probes, None
        self._by_component.clear()
        if probes is not None:
            await probes.close()
