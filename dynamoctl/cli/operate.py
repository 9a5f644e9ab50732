"""Operating a running deployment: ``status``, ``drain``, ``scale``, ``logs``."""

from __future__ import annotations

import sys
import time

import msgspec
import typer

from dynamoctl.cli.locate import find_deployment
from dynamoctl.supervisor.control import ControlClient, ControlError
from dynamoctl.supervisor.rundir import RunDir


def register(app: typer.Typer) -> None:
    app.command("status")(status)
    app.command("drain")(drain)
    app.command("scale")(scale)
    app.command("logs")(logs)


def _client(run_dir: RunDir) -> ControlClient:
    state = run_dir.read_state()
    if state is None or not run_dir.is_locked():
        typer.echo(f"{run_dir.name} is not running", err=True)
        raise typer.Exit(1)
    return ControlClient(state.control, state.token)


def _fail(exc: Exception) -> typer.Exit:
    typer.echo(f"dynamoctl: {exc}", err=True)
    return typer.Exit(1)


def status(
    name: str | None = typer.Argument(None, help="Deployment name (default: the running one)."),
    json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """State of every instance: host, pid, state, restarts, uptime, in-flight, KV usage."""
    from dynamoctl.cli.view import status_table

    run_dir = find_deployment(name, running_only=False)
    if not run_dir.is_locked():
        state = run_dir.read_state()
        phase = state.phase if state else "unknown"
        error = f": {state.error}" if state and state.error else ""
        if json:
            typer.echo(msgspec.json.encode({"name": run_dir.name, "phase": phase}).decode())
        else:
            typer.echo(f"{run_dir.name}: not running (last phase {phase}{error})")
        raise typer.Exit(3)
    client = _client(run_dir)
    try:
        report = client.status()
    except ControlError as exc:
        raise _fail(exc) from exc
    finally:
        client.close()
    if json:
        typer.echo(msgspec.json.encode(report).decode())
    else:
        from rich.console import Console

        Console().print(status_table(report))


def drain(
    target: str = typer.Argument(..., help="An instance (agg-1) or a pool (agg)."),
    name: str | None = typer.Option(None, "--name", help="Deployment name."),
    wait: bool = typer.Option(True, help="Wait until the drained instances have stopped."),
    timeout: float = typer.Option(120.0, help="Seconds to wait."),
) -> None:
    """Take instances out of routing, let in-flight requests finish, stop them for good."""
    client = _client(find_deployment(name))
    try:
        names = client.drain(target).instances
        typer.echo(f"draining {', '.join(names)}")
        deadline = time.monotonic() + timeout
        while wait:
            states = {i.name: i.state for i in client.status().instances if i.name in names}
            if all(s in ("STOPPED", "FAILED") for s in states.values()):
                typer.echo(f"stopped {', '.join(names)}")
                break
            if time.monotonic() > deadline:
                raise _fail(ControlError(f"still draining after {timeout:.0f} s: {states}"))
            time.sleep(0.2)
    except ControlError as exc:
        raise _fail(exc) from exc
    finally:
        client.close()


def scale(
    assignment: str = typer.Argument(..., help="POOL=N, e.g. agg=4."),
    name: str | None = typer.Option(None, "--name", help="Deployment name."),
) -> None:
    """Change a worker pool's replica count (scale-downs drain the highest-numbered)."""
    pool, eq, count = assignment.partition("=")
    if not eq or not count.isdigit():
        raise typer.BadParameter(f"expected POOL=N, got {assignment!r}")
    client = _client(find_deployment(name))
    try:
        reply = client.scale(pool, int(count))
    except ControlError as exc:
        raise _fail(exc) from exc
    finally:
        client.close()
    typer.echo(f"{pool}={count}: " + (", ".join(reply.instances) or "nothing to change"))


def logs(
    target: str = typer.Argument(..., help="Instance (agg-0), pool (agg) or component."),
    name: str | None = typer.Option(None, "--name", help="Deployment name."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines."),
    tail: int = typer.Option(50, help="Lines of each log to print first."),
) -> None:
    """Print (and follow) instance logs, each line prefixed by its instance."""
    run_dir = find_deployment(name, running_only=False)
    state = run_dir.read_state()
    specs = state.plan.instances if state and state.plan else []
    names = sorted({s.name for s in specs if target in (s.name, s.pool, s.component)})
    if target == "supervisor":
        files = {"supervisor": run_dir.path / "supervisor.log"}
    else:
        known = {p.stem for p in run_dir.logs.glob("*.log")}
        names = names or ([target] if target in known else [])
        files = {n: run_dir.log_of(n) for n in names}
    if not files:
        raise _fail(ValueError(f"no instance, pool or component {target!r} in {run_dir.name}"))
    offsets: dict[str, int] = {}
    for label, path in files.items():
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = b""
        offsets[label] = len(data)
        for line in data.decode(errors="replace").splitlines()[-tail:]:
            sys.stdout.write(f"[{label}] {line}\n")
    sys.stdout.flush()
    while follow:
        time.sleep(0.2)
        for label, path in files.items():
            try:
                with open(path, "rb") as handle:
                    handle.seek(offsets[label])
                    chunk = handle.read()
            except FileNotFoundError:
                continue
            # Only whole lines: the rest is printed when its newline arrives.
            whole = chunk[: chunk.rfind(b"\n") + 1]
            offsets[label] += len(whole)
            for line in whole.decode(errors="replace").splitlines():
                sys.stdout.write(f"[{label}] {line}\n")
        sys.stdout.flush()
