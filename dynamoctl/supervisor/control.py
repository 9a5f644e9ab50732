"""The supervisor's control endpoint (HTTP); its client is :mod:`dynamoctl.control.client`.

It listens on 127.0.0.1 for a local target, and on every interface for ssh and slurm ones
(``supervision.control_host``): there the supervisor runs on a node while operators run
``dynamoctl status/drain/scale`` on a login node that shares the run directory.
A random bearer token, stored in the run directory's owner-only ``state.json``, guards it:
other users (on a shared login node, or anywhere on the cluster's network) can reach the
port but cannot read the token.
``/metrics`` alone needs no token: it is read-only, reveals nothing a status table does
not, and Prometheus' file-based targets carry no per-target bearer token.
"""

from __future__ import annotations

import hmac
import socket
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
from prometheus_client import CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from dynamoctl.plan.build import PlanError
from dynamoctl.recipe.models import Recipe
from dynamoctl.recipe.targets import LocalTarget
from dynamoctl.supervisor.keys import reload_keys
from dynamoctl.supervisor.metrics import SupervisorCollector
from dynamoctl.supervisor.supervisor import Supervisor
from dynamoctl.util.net import resolve, source_address
from dynamoctl.wire.adapters import LoraLoadRequest, LoraUnloadRequest
from dynamoctl.wire.control import (
    ControlReply,
    DownRequest,
    DrainRequest,
    ScaleReply,
    ScaleRequest,
)
from dynamoctl.wire.tenants import KeysReloadRequest

T = TypeVar("T")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


ANY_ADDRESS = ("0.0.0.0", "")


def control_address(recipe: Recipe, head: str | None = None) -> tuple[str, str]:
    """(address to listen on, host to put in the recorded URL) for ``recipe``'s supervisor;
    ``head``: the address of the deployment's head host, where the planner runs.

    Listening on every interface rather than on the resolved host name: Debian maps a
    machine's own name to 127.0.1.1 in /etc/hosts, which other hosts cannot reach. For the
    same reason the URL names this machine only where its name resolves to the address it
    reaches the head host from; elsewhere (a loopback name, a name on another network) it
    carries that address.
    """
    host = recipe.supervision.control_host
    if host is None:
        host = "127.0.0.1" if isinstance(recipe.target, LocalTarget) else "0.0.0.0"
    if host not in ANY_ADDRESS:
        return host, host
    name = socket.gethostname()
    toward_head = source_address(head) if head is not None else None
    if toward_head is None or resolve(name) == toward_head:
        return host, name
    return host, toward_head


def _json(payload: msgspec.Struct, status: int = 200) -> Response:
    return Response(msgspec.json.encode(payload), status, media_type="application/json")


def _command(
    allowed: Callable[[Request], bool],
    kind: type[T],
    act: Callable[[T], Awaitable[ControlReply | ScaleReply]],
) -> Callable[[Request], Awaitable[Response]]:
    """A POST route: check the token, decode ``kind``, run ``act``, map refusals."""

    async def route(request: Request) -> Response:
        if not allowed(request):
            return _json(ControlReply(ok=False, message="bad or missing token"), 401)
        try:
            body = msgspec.json.decode(await request.body(), type=kind)
            return _json(await act(body))
        except PlanError as exc:  # no room for another replica
            return _json(ControlReply(ok=False, message=str(exc)), 409)
        except (msgspec.DecodeError, ValueError) as exc:
            return _json(ControlReply(ok=False, message=str(exc)), 400)
        except KeyError as exc:  # no such instance or pool
            return _json(ControlReply(ok=False, message=str(exc.args[0])), 404)

    return route


async def _scale(get_supervisor: Callable[[], Supervisor], body: ScaleRequest) -> ScaleReply:
    """``scale``: refused for a planner-sized pool unless forced or asked by the planner."""
    if body.replicas < 0:
        raise ValueError("replicas must be >= 0")
    scaling = get_supervisor().scaling
    bounds = None if body.by_planner else scaling.planned(body.pool)
    if bounds is not None and not body.force:
        # Accepted, it would be undone at the planner's next decision: silently lost.
        raise PlanError(
            f"pool {body.pool!r} is sized by the planner (recipe `planner:`, "
            f"{bounds[0]} to {bounds[1]} replicas), which would undo this at its next "
            f"decision: change its bounds in the recipe, or `dynamoctl scale "
            f"{body.pool}={body.replicas} --force` to scale it now anyway"
        )
    reply = await scaling.scale(body.pool, body.replicas)
    if bounds is not None:
        reply.note = f"the planner sizes {body.pool} and may change it at its next decision"
    return reply


def build_app(get_supervisor: Callable[[], Supervisor], token: str) -> Starlette:
    """The control endpoint's routes; ``get_supervisor`` gives the supervisor they act on
    (the endpoint is bound first, so that the supervisor is made knowing its URL)."""

    def allowed(request: Request) -> bool:
        given = request.headers.get("authorization", "").removeprefix("Bearer ")
        return hmac.compare_digest(given, token)

    async def status(request: Request) -> Response:
        if not allowed(request):
            return _json(ControlReply(ok=False, message="bad or missing token"), 401)
        return _json(get_supervisor().status())

    registry = CollectorRegistry()
    registry.register(SupervisorCollector(get_supervisor))

    async def metrics(_: Request) -> Response:  # unauthenticated on purpose: read-only
        return Response(generate_latest(registry), media_type=CONTENT_TYPE)

    async def drain(body: DrainRequest) -> ControlReply:
        return ControlReply(ok=True, instances=await get_supervisor().drain(body.target))

    async def scale(body: ScaleRequest) -> ScaleReply:
        return await _scale(get_supervisor, body)

    async def lora_load(body: LoraLoadRequest) -> ControlReply:
        spec = await get_supervisor().adapters.load(body)
        return ControlReply(ok=True, message=f"{spec.name}: loading on {', '.join(spec.pools)}")

    async def lora_unload(body: LoraUnloadRequest) -> ControlReply:
        await get_supervisor().adapters.unload(body.name)
        return ControlReply(ok=True, message=f"{body.name}: unloading")

    async def lora_report(request: Request) -> Response:
        if not allowed(request):
            return _json(ControlReply(ok=False, message="bad or missing token"), 401)
        return _json(await get_supervisor().adapters.report())

    async def keys_reload(request: Request) -> Response:
        if not allowed(request):
            return _json(ControlReply(ok=False, message="bad or missing token"), 401)
        try:
            body = msgspec.json.decode(await request.body() or b"{}", type=KeysReloadRequest)
        except msgspec.DecodeError as exc:
            return _json(ControlReply(ok=False, message=str(exc)), 400)
        supervisor = get_supervisor()
        if supervisor.recipe.frontend.api_keys_file is None:
            message = "this deployment's frontends read no key file (recipe frontend.api_keys_file)"
            return _json(ControlReply(ok=False, message=message), 409)
        plan = supervisor.plan
        return _json(await reload_keys(plan.discovery_url, plan.namespace, body.timeout))

    async def down(body: DownRequest) -> ControlReply:
        get_supervisor().request_down(now=body.now)
        return ControlReply(ok=True, message="stopping")

    return Starlette(
        routes=[
            Route("/status", status),
            Route("/metrics", metrics),
            Route("/drain", _command(allowed, DrainRequest, drain), methods=["POST"]),
            Route("/scale", _command(allowed, ScaleRequest, scale), methods=["POST"]),
            Route("/down", _command(allowed, DownRequest, down), methods=["POST"]),
            Route("/lora", lora_report),
            Route("/keys/reload", keys_reload, methods=["POST"]),
            Route("/lora/load", _command(allowed, LoraLoadRequest, lora_load), methods=["POST"]),
            Route(
                "/lora/unload", _command(allowed, LoraUnloadRequest, lora_unload), methods=["POST"]
            ),
        ]
    )
