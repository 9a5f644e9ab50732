"""The command line of each component the plan starts, rendered from the component's own
options (:mod:`dynamoctl.settings`), filled in from the recipe: nothing here restates a
flag, a default or a recipe field."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from dynamoctl.planner.settings import PlannerOptions, PlannerPools, PlannerSettings
from dynamoctl.recipe.models import Recipe, Role
from dynamoctl.settings import (
    AdmissionSettings,
    ApiKeySettings,
    DisaggSettings,
    FrontendOptions,
    HttpLimitSettings,
    ImageSettings,
    ModelCacheSettings,
    Options,
    OutputParserSettings,
    ResponsesSettings,
    RouterOptions,
    RouterSettings,
    StreamSettings,
    TracingSettings,
    WorkerOptions,
    to_argv,
)

S = TypeVar("S", bound=Options)

DRAIN_CLOSE_S = 5.0
"""Seconds of ``supervision.drain_timeout`` a draining component keeps for aborting what
is left, closing its sockets and revoking its lease: it ends its streams itself before
the supervisor's SIGKILL."""


def _component(recipe: Recipe, url: str, label: str, address: str) -> dict[str, Any]:
    return {
        "namespace": recipe.namespace,
        "discovery": url,
        "host": address,
        "lease_ttl": recipe.discovery.lease_ttl,
        # The supervisor alone judges a slow start: a process restarted while discovery is
        # out must not give up first and be restarted a second time (issue 23).
        "discovery_wait": recipe.supervision.start_timeout,
        "label": label,
        **({"tracing": _part(TracingSettings, recipe.tracing)} if recipe.tracing else {}),
    }


def drain_grace(recipe: Recipe) -> float:
    """Workers' and the frontend's ``--drain-grace``: ``supervision.drain_timeout`` less
    :data:`DRAIN_CLOSE_S`."""
    return max(0.0, recipe.supervision.drain_timeout - DRAIN_CLOSE_S)


def _part(model: type[S], section: Options) -> S:
    """``model``'s fields of a recipe section that subclasses it (the section has more)."""
    return model(**section.model_dump(include=set(model.model_fields)))


def worker_argv(recipe: Recipe, role: Role, label: str, address: str, url: str) -> list[str]:
    """``dynamoctl worker``'s own flags (the engine's follow them)."""
    pool = recipe.workers.pools()[role]
    cached = recipe.model.cache
    cache: dict[str, Any] = {}
    if cached is not None:
        cache["model_cache"] = _part(ModelCacheSettings, cached)
    options = WorkerOptions(
        **_component(recipe, url, label, address),
        drain_grace=drain_grace(recipe),
        engine=pool.engine,
        role=role,
        parsers=_part(OutputParserSettings, recipe.model),
        **cache,
    )
    return ["worker", *to_argv(options, explicit=True)]


def follower_cache_argv(recipe: Recipe) -> list[str]:
    """``dynamoctl follower``'s ``--model-cache-*`` flags: a follower stages the weights
    onto its own node before its engine reads them, as the leader's worker does."""
    cached = recipe.model.cache
    if cached is None:
        return []
    return to_argv(_part(ModelCacheSettings, cached), explicit=True)


def router_argv(recipe: Recipe, label: str, address: str, url: str) -> list[str]:
    options = RouterOptions(
        **_component(recipe, url, label, address),
        router=_part(RouterSettings, recipe.frontend.router),
    )
    return ["router", *to_argv(options, explicit=True)]


def frontend_argv(
    recipe: Recipe,
    label: str,
    listen: str,
    url: str,
    *,
    share: bool = False,
    reuse: bool = False,
    frontends: int = 1,
) -> list[str]:
    """``share``: other frontends run (their embedded routers share bookings); ``reuse``:
    other frontends of this host serve the same port; ``frontends``: how many the
    deployment runs (they share the API keys' limits)."""
    router, workers = recipe.frontend.router, recipe.workers
    extra: dict[str, Any] = {}
    if share and not router.replicas:  # standalone router replicas share their own
        extra["share_bookings"] = True
    if frontends > 1 and (recipe.frontend.api_keys_file or recipe.frontend.api_keys_env):
        extra["shared_limits"] = frontends
    if reuse:
        extra["reuse_port"] = True
    if workers.prefill is not None or workers.decode is not None:
        extra["disagg"] = _part(DisaggSettings, router)  # the knobs matter only then
    options = FrontendOptions(
        **_component(recipe, url, label, listen),
        drain_grace=drain_grace(recipe),
        port=recipe.frontend.port,
        routing="standalone" if router.replicas else "embedded",
        router=_part(RouterSettings, router),
        admission=_part(AdmissionSettings, recipe.frontend),
        streams=_part(StreamSettings, recipe.frontend),
        responses=_part(ResponsesSettings, recipe.frontend),
        images=_part(ImageSettings, recipe.frontend),
        api_keys=_part(ApiKeySettings, recipe.frontend),  # names of the sources, not keys
        http=_part(HttpLimitSettings, recipe.frontend),
        **extra,
    )
    return ["frontend", *to_argv(options, explicit=True)]


def planner_argv(recipe: Recipe, label: str, address: str, url: str) -> list[str]:
    """``dynamoctl planner``'s flags: the recipe's ``planner`` section, and the pools it
    scales (their GPUs per replica, engine and model) from ``workers`` and ``model``."""
    assert recipe.planner is not None
    settings = _part(PlannerSettings, recipe.planner)
    if settings.profile is not None:  # the planner may run elsewhere than `up`'s directory
        profile = str(Path(settings.profile).expanduser().resolve())
        settings = PlannerSettings(**{**settings.model_dump(), "profile": profile})
    pools = recipe.workers.pools()
    options = PlannerOptions(
        **_component(recipe, url, label, address),
        planner=settings,
        pools=PlannerPools(
            **{f"{role}_gpus": pool.gpus_per_replica for role, pool in pools.items()},
            engine=next(iter(pools.values())).engine,
            model=recipe.model.name,
        ),
    )
    return ["planner", *to_argv(options, explicit=True)]
