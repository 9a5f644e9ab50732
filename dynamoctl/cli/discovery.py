"""``dynamoctl discovery``: look at what is registered, as every component sees it."""

from __future__ import annotations

import asyncio
import contextlib
import sys

import typer
from rich.console import Console
from rich.table import Table

from dynamoctl.discovery import Discovery, DiscoveryError, store_from_url

discovery_app = typer.Typer(no_args_is_help=True, help="Inspect discovery keys.")

URL_HELP = "Discovery URL: embedded, embedded:///DIR or etcd://HOST:PORT[,HOST:PORT]."


def register(app: typer.Typer) -> None:
    app.add_typer(discovery_app, name="discovery")


def _open(url: str) -> Discovery:
    try:
        return Discovery(store_from_url(url), connect_timeout=5.0)
    except ValueError as exc:
        typer.echo(f"dynamoctl discovery: {exc}", err=True)
        raise typer.Exit(2) from exc


@discovery_app.command("ls")
def list_keys(
    prefix: str = typer.Argument("", help="Key prefix, e.g. a namespace 'local/'."),
    url: str = typer.Option("embedded", "--url", "-u", help=URL_HELP),
) -> None:
    """List keys under PREFIX with their values."""

    async def run() -> dict[str, bytes]:
        disc = _open(url)
        try:
            return await disc.list(prefix)
        finally:
            await disc.store.close()

    try:
        items = asyncio.run(run())
    except DiscoveryError as exc:
        typer.echo(f"dynamoctl discovery ls: {exc}", err=True)
        raise typer.Exit(1) from exc
    table = Table("key", "value", box=None, pad_edge=False)
    for key, value in sorted(items.items()):
        table.add_row(key, value.decode(errors="replace"))
    Console(file=sys.stdout, width=200).print(table)


@discovery_app.command()
def watch(
    prefix: str = typer.Argument("", help="Key prefix to follow."),
    url: str = typer.Option("embedded", "--url", "-u", help=URL_HELP),
) -> None:
    """Print every change under PREFIX (current keys first) until interrupted."""

    async def run() -> None:
        disc = _open(url)
        try:
            async for event in disc.watch(prefix):
                value = "" if event.value is None else event.value.decode(errors="replace")
                typer.echo(f"{event.kind.value.upper():6s} {event.key} {value}".rstrip())
        finally:
            await disc.store.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
