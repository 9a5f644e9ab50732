"""``dynamoctl keys reload``: every frontend of a running deployment reads its API key
file again now, through the supervisor (docs/security.md, "The key file")."""

from __future__ import annotations

import msgspec
import typer

from dynamoctl.cli.locate import find_deployment
from dynamoctl.cli.operate import _client, _fail
from dynamoctl.control.client import ControlClient, ControlError
from dynamoctl.wire.tenants import KeysReloadReport

keys_app = typer.Typer(name="keys", no_args_is_help=True, help="API keys of a deployment.")


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app)


@keys_app.command("reload")
def reload(
    name: str | None = typer.Option(None, "--name", help="Deployment name."),
    timeout: float = typer.Option(10.0, help="Seconds to wait for every frontend's answer."),
    json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Make every frontend read its key file now: what each changed (counts of keys added,
    changed and revoked), or the file's error (file, line, field; its keys before stay).
    Exit 1 unless every frontend reloaded."""
    run_dir = find_deployment(name)
    plain = _client(run_dir)
    plain.close()
    state = run_dir.read_state()
    assert state is not None  # _client checked it runs
    client = ControlClient(state.control, state.token, timeout=timeout + 10)
    try:
        report = client.keys_reload(timeout)
    except ControlError as exc:
        raise _fail(exc, run_dir) from exc
    finally:
        client.close()
    typer.echo(msgspec.json.encode(report).decode() if json else _lines(report))
    if not report.answers or report.silent or any(a.error for a in report.answers):
        raise typer.Exit(1)


def _lines(report: KeysReloadReport) -> str:
    lines = []
    for answer in report.answers:
        who = answer.label or answer.instance_id
        if answer.changes is None:
            lines.append(f"{who}: not reloaded, its previous keys stay: {answer.error}")
        else:
            c = answer.changes
            lines.append(
                f"{who}: reloaded: {c.keys} keys ({c.added} added, {c.changed} changed, "
                f"{c.revoked} revoked)"
            )
    lines += [f"{who}: no answer (is it running? `dynamoctl logs {who}`)" for who in report.silent]
    return "\n".join(lines) or "no frontend is registered"
