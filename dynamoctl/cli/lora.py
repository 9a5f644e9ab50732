"""``dynamoctl lora load|unload|ls``: LoRA adapters of a running deployment, through its
supervisor (docs/operations.md, "LoRA adapters")."""

from __future__ import annotations

import time

import msgspec
import typer

from dynamoctl.cli.locate import find_deployment
from dynamoctl.cli.operate import _client, _fail
from dynamoctl.control.client import ControlClient, ControlError
from dynamoctl.wire.adapters import LoraReport

lora_app = typer.Typer(name="lora", no_args_is_help=True, help="LoRA adapters: load, unload, list.")


def register(app: typer.Typer) -> None:
    app.add_typer(lora_app)


def _holders(client: ControlClient, name: str) -> list[str] | None:
    """The workers holding ``name`` now; None when it is not asked for any more."""
    for entry in client.lora().adapters:
        if entry.spec.name == name:
            return entry.workers
    return None


@lora_app.command("load")
def load(
    adapter: str = typer.Argument(..., help="Served name of the adapter (the request's model)."),
    path: str = typer.Argument(..., help="Adapter directory on the workers' hosts."),
    pool: list[str] = typer.Option(
        [], "--pool", help="Pool to load it in (repeat); default: every pool with `lora`."
    ),
    base_model: str | None = typer.Option(
        None, help="Refuse it unless its adapter_config.json names this base model."
    ),
    name: str | None = typer.Option(None, "--name", help="Deployment name."),
    wait: bool = typer.Option(True, help="Wait until a worker serves it."),
    timeout: float = typer.Option(120.0, help="Seconds to wait."),
) -> None:
    """Load an adapter on the workers of its pools; it is then served as a model."""
    run_dir = find_deployment(name)
    client = _client(run_dir)
    try:
        reply = client.lora_load(adapter, path, pool, base_model)
        typer.echo(reply.message)
        deadline = time.monotonic() + timeout
        while wait:
            holders = _holders(client, adapter)
            if holders:
                typer.echo(f"{adapter}: served by {', '.join(holders)}")
                return
            if time.monotonic() >= deadline:
                typer.echo(
                    f"dynamoctl: {adapter}: no worker loaded it within {timeout:.0f}s "
                    "(see the workers' logs: `dynamoctl logs agg-0`)",
                    err=True,
                )
                raise typer.Exit(1)
            time.sleep(0.2)
    except ControlError as exc:
        raise _fail(exc, run_dir) from exc
    finally:
        client.close()


@lora_app.command("unload")
def unload(
    adapter: str = typer.Argument(..., help="Served name of the adapter."),
    name: str | None = typer.Option(None, "--name", help="Deployment name."),
) -> None:
    """Unload an adapter from every worker; requests naming it get a 404."""
    run_dir = find_deployment(name)
    client = _client(run_dir)
    try:
        typer.echo(client.lora_unload(adapter).message)
    except ControlError as exc:
        raise _fail(exc, run_dir) from exc
    finally:
        client.close()


@lora_app.command("ls")
def ls(
    name: str | None = typer.Option(None, "--name", help="Deployment name."),
    json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Every adapter asked for: its path, pools and the workers that hold it."""
    run_dir = find_deployment(name)
    client = _client(run_dir)
    try:
        report = client.lora()
    except ControlError as exc:
        raise _fail(exc, run_dir) from exc
    finally:
        client.close()
    typer.echo(msgspec.json.encode(report).decode() if json else _table(report))


def _table(report: LoraReport) -> str:
    rows = [("ADAPTER", "PATH", "POOLS", "WORKERS")]
    for entry in report.adapters:
        spec = entry.spec
        rows.append((spec.name, spec.path, ",".join(spec.pools),
                     ",".join(entry.workers) or "(none yet)"))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths, strict=True)) + "  " + row[3]
        for row in rows
    )
