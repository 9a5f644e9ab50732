"""Operating a running deployment: ``status``, ``drain``, ``scale``, ``logs``."""

from __future__ import annotations

import sys
import time

import msgspec
import typer

from dynamoctl.cli.locate import find_deployment, not_running
from dynamoctl.control.client import ControlClient, ControlError, Unreachable
from dynamoctl.supervisor.rundir import RunDir
from dynamoctl.wire.states import GrowthState, Phase, State


def register(app: typer.Typer) -> None:
    app.command("status")(status)
    app.command("drain")(drain)
    app.command("scale")(scale)
    app.command("logs")(logs)


def _client(run_dir: RunDir) -> ControlClient:
    state = run_dir.read_state()
    why = not_running(run_dir, state)
    if why is not None or state is None:
        typer.echo(f"dynamoctl: {run_dir.name}: {why[1] if why else 'not running'}", err=True)
        raise typer.Exit(1)
    return ControlClient(state.control, state.token)


def _fail(exc: Exception, run_dir: RunDir | None = None) -> typer.Exit:
    """One line on stderr, exit 1; an unreachable supervisor is explained if we can."""
    message = str(exc)
    if isinstance(exc, Unreachable) and run_dir is not None:
        why = not_running(run_dir, run_dir.read_state())  # it may have ended meanwhile
        job = run_dir.slurm_job(run_dir.read_state())
        if why is not None:
            message = why[1]
        elif job is not None:
            message += f" (Slurm job {job} is running: is the node reachable from here?)"
    typer.echo(f"dynamoctl: {message}", err=True)
    return typer.Exit(1)


def status(
    name: str | None = typer.Argument(None, help="Deployment name (default: the running one)."),
    json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """State of every instance: host, pid, state, restarts, uptime, in-flight, KV usage."""
    from dynamoctl.cli.view import status_table

    run_dir = find_deployment(name, running_only=False)
    state = run_dir.read_state()
    why = not_running(run_dir, state)
    if why is not None or state is None:
        phase, message = (Phase.UNKNOWN, "not running") if why is None else why
        if json:
            out = {"name": run_dir.name, "phase": phase, "message": message}
            typer.echo(msgspec.json.encode(out).decode())
        else:
            typer.echo(f"{run_dir.name}: {message}")
        raise typer.Exit(3)
    client = ControlClient(state.control, state.token)
    try:
        report = client.status()
    except ControlError as exc:
        raise _fail(exc, run_dir) from exc
    finally:
        client.close()
    if json:
        typer.echo(msgspec.json.encode(report).decode())
    else:
        from rich.console import Console

        console = Console()
        console.print(status_table(report, console.width))


def drain(
    target: str = typer.Argument(..., help="An instance (agg-1) or a pool (agg)."),
    name: str | None = typer.Option(None, "--name", help="Deployment name."),
    wait: bool = typer.Option(True, help="Wait until the drained instances have stopped."),
    timeout: float = typer.Option(120.0, help="Seconds to wait."),
) -> None:
    """Take instances out of routing, let in-flight requests finish, stop them for good."""
    run_dir = find_deployment(name)
    client = _client(run_dir)
    try:
        names = client.drain(target).instances
        typer.echo(f"draining {', '.join(names)}")
        deadline = time.monotonic() + timeout
        while wait:
            states = {i.name: i.state for i in client.status().instances if i.name in names}
            if all(s in (State.STOPPED, State.FAILED) for s in states.values()):
                typer.echo(f"stopped {', '.join(names)}")
                break
            if time.monotonic() > deadline:
                left = {n: str(s) for n, s in states.items()}
                raise _fail(ControlError(f"still draining after {timeout:.0f} s: {left}"))
            time.sleep(0.2)
    except ControlError as exc:
        raise _fail(exc, run_dir) from exc
    finally:
        client.close()


def scale(
    assignment: str = typer.Argument(..., help="POOL=N, e.g. agg=4."),
    name: str | None = typer.Option(None, "--name", help="Deployment name."),
    wait: bool = typer.Option(
        True, help="Wait until added replicas are READY and removed ones STOPPED."
    ),
    timeout: float = typer.Option(600.0, help="Seconds to wait."),
    force: bool = typer.Option(
        False, help="Scale a pool the recipe's planner sizes (it may change it again)."
    ),
) -> None:
    """Change a worker pool's replica count (scale-downs drain the highest-numbered)."""
    pool, eq, count = assignment.partition("=")
    if not eq or not count.isdigit():
        raise typer.BadParameter(f"expected POOL=N, got {assignment!r}")
    run_dir = find_deployment(name)
    client = _client(run_dir)
    try:
        reply = client.scale(pool, int(count), force=force)
        if reply.note:
            typer.echo(f"{pool}={count}: note: {reply.note}", err=True)
        if not reply.started and not reply.drained and not reply.withdrawn:
            typer.echo(f"{pool}={count}: nothing to change")
            return
        changes = (
            ("starting", reply.started),
            ("draining", reply.drained),
            ("withdrawing (their extra Slurm job was still queued)", reply.withdrawn),
        )
        for verb, names in changes:
            if names:
                typer.echo(f"{pool}={count}: {verb} {', '.join(names)}")
        for job in reply.submitted:
            typer.echo(f"{pool}={count}: the allocation is full: submitted extra Slurm job {job}")
        if wait:
            _wait_for_states(client, reply.started, (State.READY,), timeout)
            _wait_for_states(client, reply.drained, (State.STOPPED, State.FAILED), timeout)
    except ControlError as exc:
        raise _fail(exc, run_dir) from exc
    finally:
        client.close()


def _wait_for_states(
    client: ControlClient, names: list[str], wanted: tuple[State, ...], timeout: float
) -> None:
    """Poll ``status`` until every one of ``names`` is in a ``wanted`` state; say so."""
    deadline = time.monotonic() + timeout
    while names:
        report = client.status()
        rows = {i.name: i for i in report.instances if i.name in names}
        lost = [  # waited for an extra Slurm job that failed: they will never appear
            f"{name} (extra Slurm job {job.job} {job.state}: {job.message})"
            for job in report.growth
            if job.state is GrowthState.FAILED
            for name in job.replicas
            if name in names and name not in rows
        ]
        if lost:
            raise ControlError(f"not started: {', '.join(lost)}")
        if len(rows) == len(set(names)) and all(row.state in wanted for row in rows.values()):
            for row in rows.values():
                typer.echo(f"{row.name}: {row.state} on {row.host}")
            return
        failed = [f"{r.name} ({r.message})" for r in rows.values() if r.state is State.FAILED]
        if failed and State.FAILED not in wanted:
            raise ControlError(f"failed to start: {', '.join(failed)}")
        if time.monotonic() > deadline:
            states = {n: str(r.state) for n, r in rows.items()}
            raise ControlError(f"not there after {timeout:.0f} s: {states}")
        time.sleep(0.3)


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
