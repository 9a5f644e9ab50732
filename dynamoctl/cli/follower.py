"""``dynamoctl follower``: a follower member of a multi-node replica (the supervisor
starts it; see :mod:`dynamoctl.worker.follower`)."""

from __future__ import annotations

import typer

from dynamoctl.settings.base import with_options
from dynamoctl.settings.model_cache import ModelCacheSettings
from dynamoctl.util import log as logsetup


def register(app: typer.Typer) -> None:
    app.command(
        "follower",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(with_options(follower, cache=ModelCacheSettings))


def follower(
    ctx: typer.Context,
    engine: str = typer.Option(..., help="Engine of the gang: mocker, vllm or sglang."),
    label: str = typer.Option(..., help="This member's name, e.g. decode-0.1."),
    rendezvous: str = typer.Option(..., help="The leader's rendezvous ADDRESS:PORT."),
    rendezvous_timeout: float = typer.Option(
        120.0, min=0.1, help="Seconds to reach the rendezvous before exiting with status 2."
    ),
    *,
    cache: ModelCacheSettings,
) -> None:
    """Run a follower of a multi-node replica; arguments after -- are the engine's (with
    its node rank). It never registers: the gang's leader serves. With --model-cache-dir
    it first stages the weights onto this node, as a worker does."""
    from dynamoctl.worker.follower import FollowerError, run_follower

    logsetup.setup(f"follower/{label}")
    try:
        status = run_follower(engine, label, rendezvous, rendezvous_timeout, ctx.args, cache)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    except FollowerError as exc:
        typer.echo(f"dynamoctl follower: {exc}", err=True)
        raise typer.Exit(exc.status) from exc
    raise typer.Exit(status)
