"""``dynamoctl worker``: run worker instances (an engine behind the request plane); its
flags are :class:`~dynamoctl.settings.WorkerOptions`' fields, other ``--options`` are
the engine's."""

from __future__ import annotations

import typer

from dynamoctl.cli import common
from dynamoctl.engines.registry import engine_names
from dynamoctl.settings import WorkerOptions, flag, with_options
from dynamoctl.wire.engine_args import parse_engine_args


def register(app: typer.Typer) -> None:
    app.command(
        "worker",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(with_options(worker, options=WorkerOptions))


def worker(ctx: typer.Context, *, options: WorkerOptions) -> None:
    """Run worker instances; extra --options are the engine's own arguments.

    Example: dynamoctl worker --engine mocker -n local --num-gpu-blocks 4096 --speedup-ratio 10
    """
    from dynamoctl.worker.main import run_worker

    if options.engine not in engine_names():
        raise typer.BadParameter(
            f"unknown engine {options.engine!r}; valid: {', '.join(engine_names())}",
            param_hint=flag(WorkerOptions, "engine"),
        )
    try:
        engine_options = parse_engine_args(ctx.args)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="engine arguments") from exc
    options = options.model_copy(update={"engine_options": engine_options})
    common.run_component("worker", options.namespace, run_worker(options))
