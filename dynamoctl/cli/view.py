"""Rich rendering of a deployment's status: the ``status`` table and ``up``'s live view."""

from __future__ import annotations

import asyncio
import logging
import sys
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from rich import box
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from dynamoctl.wire.control import DiscoveryStatus, StatusReport
from dynamoctl.wire.planner import PlannerStatus
from dynamoctl.wire.states import State

if TYPE_CHECKING:
    from dynamoctl.supervisor.supervisor import Supervisor

STATE_STYLE = {
    State.READY: "green",
    State.STANDBY: "blue",
    State.STARTING: "yellow",
    State.PENDING: "dim",
    State.DRAINING: "cyan",
    State.STOPPED: "dim",
    State.BACKOFF: "magenta",
    State.FAILED: "bold red",
}


def _uptime(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def status_table(report: StatusReport, width: int = 80) -> Table:
    """One row per instance. In ``width`` columns (80 at least) the names ``drain`` takes,
    the states and the figures are whole; the host column gives way (it ellipsises)."""
    disc = report.discovery
    unreachable = "" if disc.reachable else " · [bold red]discovery unreachable[/]"
    table = Table(
        title=f"{report.name} · {report.phase} · {report.endpoint} ({report.model}){unreachable}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    nodes: dict[str, list[str]] = {}  # a gang's hosts, leader first
    for row in report.instances:
        if row.gang:  # an MPI world's nodes are all in its one row
            nodes.setdefault(row.gang, []).extend(row.mpi_nodes or [row.host])
    rows = [
        (
            # A gang is one replica: the leader's row names its nodes, members sit under it.
            f" └ {row.name}" if row.rank else row.name,
            f"[{STATE_STYLE.get(row.state, '')}]{row.state}[/]",
            ",".join(nodes[row.gang]) if row.gang and not row.rank else row.host,
            str(row.pid) if row.pid else "-",
            "-" if row.rank else str(row.restarts),
            _uptime(row.uptime_s),
            "-" if row.inflight is None else str(row.inflight),
            "-" if row.kv_usage is None else f"{row.kv_usage:.0%}",
        )
        for row in report.instances
    ]
    widths = [max([len(header), *(len(r[i]) for r in rows)]) for i, header in enumerate(_HEADERS)]
    widths[1] = max([5, *(len(row.state) for row in report.instances)])  # markup is not shown
    gaps = 3 * len(_HEADERS)  # padding either side and the box's separator, per column
    host = max(6, min(widths[2], width - gaps - sum(widths) + widths[2]))
    for index, header in enumerate(_HEADERS):
        if header == "host":
            table.add_column(header, overflow="ellipsis", no_wrap=True, width=host)
        else:
            justify: Literal["left", "right"] = "right" if index > 2 else "left"
            table.add_column(header, justify=justify, no_wrap=True, min_width=widths[index])
    for cells in rows:
        table.add_row(*cells)
    failures = [
        f"{row.name}: {row.message}"
        for row in report.instances
        if row.message and row.state in (State.FAILED, State.BACKOFF)
    ]
    failures += [  # extra Slurm jobs beyond the allocation (recipe target.growth)
        f"extra Slurm job {g.job}: {g.state}"
        + (f" on {','.join(g.nodes)}" if g.nodes else "")
        + (f" for {', '.join(g.replicas)}" if g.replicas else "")
        + (f": {g.message}" if g.message else "")
        for g in report.growth
    ]
    if not disc.reachable:
        failures.insert(0, _unreachable_line(disc))
    if report.planner is not None:
        failures.insert(0, planner_line(report.planner))
    if starts := _starts(report):  # the history's medians: what the start timeout may use
        failures.append(starts)
    if held := [f"{r.name}: {', '.join(r.adapters)}" for r in report.instances if r.adapters]:
        failures.append(f"LoRA adapters: {'; '.join(held)}")
    if failures:  # below the table, where a long message does not squeeze the columns
        table.caption = "\n".join(failures)
        table.caption_justify = "left"
    return table


_HEADERS = ("instance", "state", "host", "pid", "restarts", "uptime", "reqs", "KV")


def _starts(report: StatusReport) -> str:
    """Each pool's measured start-up, and its last promoted spare's promotion."""
    promoted: dict[str, float] = {}
    for row in report.instances:
        if row.start is not None and row.start.promotion_s is not None:
            promoted[row.pool] = row.start.promotion_s
    pools = [
        f"{pool} {seconds:.1f} s"
        + (f" (spare promoted in {promoted[pool]:.2f} s)" if pool in promoted else "")
        for pool, seconds in report.measured_start_s.items()
    ]
    return f"measured start-up: {', '.join(pools)}" if pools else ""


def planner_line(planner: PlannerStatus) -> str:
    """The planner's mode, pools, last decision and why, on one (long) line."""
    pools = " ".join(f"{p.role} {p.ready}/{p.desired}" for p in planner.pools)
    parts = [f"planner ({planner.mode}, {planner.phase}): {pools or '-'} ready/desired"]
    parts.append(f"GPUs {planner.gpus}/{planner.budget}")
    if planner.budget_bound:
        parts.append("[bold yellow]budget-bound[/]")
    if planner.last_decision_age_s is not None:
        parts.append(f"last {planner.last_loop} decision {planner.last_decision_age_s:.0f} s ago")
    if planner.last_change:
        parts.append(f"last change {planner.last_change}")
    if planner.scale_error:
        parts.append(f"[bold red]{escape(planner.scale_error)}[/]")
    if planner.reason:
        parts.append(f"why: {escape(planner.reason)}")
    return " · ".join(parts)


def _unreachable_line(disc: DiscoveryStatus) -> str:
    since = f" for {disc.unreachable_s:.0f} s" if disc.unreachable_s is not None else ""
    return (
        f"discovery at {disc.location or '?'} unreachable{since} ({disc.error or 'no answer'}): "
        "states are the last known; instances keep serving and are still restarted"
    )


class LiveView:
    """``up``'s live table when on a terminal, redrawn on every change and every
    :data:`TICK_S` (uptime, in-flight, KV usage move without a state change), with log
    lines printed above it; otherwise nothing: the supervisor logs every state change."""

    TICK_S = 1.0

    def __init__(self, enabled: bool, console: Console | None = None) -> None:
        self.enabled = enabled
        self._console = console
        self._live: Live | None = None
        self._supervisor: Supervisor | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._switched: list[logging.StreamHandler[Any]] = []

    def attach(self, supervisor: Supervisor) -> None:
        """Follow ``supervisor``; call from its event loop."""
        self._supervisor = supervisor
        supervisor.on_change = self.refresh
        if self._live is not None:
            self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.TICK_S)
            self.refresh()

    def refresh(self) -> None:
        if self._supervisor is not None and self._live is not None:
            report = self._supervisor.status()
            self._live.update(status_table(report, self._live.console.width))

    def __enter__(self) -> LiveView:
        if self.enabled:
            self._live = Live(console=self._console or Console(), refresh_per_second=4)
            self._live.__enter__()
            # Log lines go through Live's redirected stderr: printed above the table
            # instead of over it.
            for handler in logging.getLogger().handlers:
                if isinstance(handler, logging.StreamHandler) and handler.stream is sys.__stderr__:
                    handler.setStream(sys.stderr)
                    self._switched.append(handler)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        if self._live is not None:
            self._live.__exit__(exc_type, exc, tb)
            for handler in self._switched:
                handler.setStream(sys.__stderr__)
