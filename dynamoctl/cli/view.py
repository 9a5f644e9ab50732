"""Rich rendering of a deployment's status: the ``status`` table and ``up``'s live view."""

from __future__ import annotations

import logging
from types import TracebackType
from typing import TYPE_CHECKING

from rich.console import Console
from rich.live import Live
from rich.table import Table

from dynamoctl.wire.control import StatusReport

if TYPE_CHECKING:
    from dynamoctl.supervisor.supervisor import Supervisor

STATE_STYLE = {
    "READY": "green",
    "STARTING": "yellow",
    "PENDING": "dim",
    "DRAINING": "cyan",
    "STOPPED": "dim",
    "BACKOFF": "magenta",
    "FAILED": "bold red",
}


def _uptime(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def status_table(report: StatusReport) -> Table:
    table = Table(
        title=f"{report.name} · {report.phase} · {report.endpoint} ({report.model})",
        title_justify="left",
    )
    for column in ("component", "instance", "host", "pid", "state", "restarts", "uptime"):
        table.add_column(column)
    table.add_column("in-flight", justify="right")
    table.add_column("KV usage", justify="right")
    for row in report.instances:
        state = f"[{STATE_STYLE.get(row.state, '')}]{row.state}[/]"
        if row.message and row.state in ("FAILED", "BACKOFF"):
            state += f" [dim]({row.message})[/]"
        table.add_row(
            row.component,
            row.name,
            row.host,
            str(row.pid) if row.pid else "-",
            state,
            str(row.restarts),
            _uptime(row.uptime_s),
            "-" if row.inflight is None else str(row.inflight),
            "-" if row.kv_usage is None else f"{row.kv_usage:.0%}",
        )
    return table


class LiveView:
    """``up``'s live table when on a terminal; otherwise one log line per state change."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._live: Live | None = None
        self._supervisor: Supervisor | None = None
        self._last: dict[str, str] = {}

    def attach(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor
        supervisor.on_change = self.refresh

    def refresh(self) -> None:
        if self._supervisor is None:
            return
        report = self._supervisor.status()
        if self._live is not None:
            self._live.update(status_table(report))
            return
        for row in report.instances:
            if self._last.get(row.name) != row.state:
                self._last[row.name] = row.state
                extra = f" ({row.message})" if row.message else ""
                logging.getLogger("dynamoctl.supervisor").info(
                    "%s on %s: %s%s", row.name, row.host, row.state, extra
                )

    def __enter__(self) -> LiveView:
        if self.enabled:
            self._live = Live(console=Console(), refresh_per_second=4)
            self._live.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._live is not None:
            self._live.__exit__(exc_type, exc, tb)
