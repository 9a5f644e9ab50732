"""What an operator reads: ``status`` at 80 columns and ``up``'s live table."""

from __future__ import annotations

import asyncio
import io
import logging
import re
import sys
from typing import Any

from rich.console import Console

from dynamoctl.cli.view import LiveView, status_table
from dynamoctl.wire.control import InstanceStatus, StatusReport

HOST = "gpu-node-0017.cluster.example.org"


def _report(uptime: float = 125.0) -> StatusReport:
    rows = [
        InstanceStatus(
            name=name, pool=name.rsplit("-", 1)[0], component="worker", host=HOST,
            pid=1234567, state=state, restarts=10, uptime_s=uptime, inflight=3,
            kv_usage=0.42, message="exited with status 1",
        )
        for name, state in (("prefill-10", "READY"), ("decode-1", "STOPPED"),
                            ("router-0", "DRAINING"), ("frontend-0", "BACKOFF"))
    ]  # fmt: skip
    return StatusReport(
        name="flagship", phase="serving", endpoint="http://gpu-node-0017:8000/v1",
        model="m", target="slurm", instances=rows,
    )  # fmt: skip


def _render(width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(status_table(_report(), width))
    return out.getvalue()


def test_status_at_80_columns_keeps_names_states_and_figures_whole() -> None:
    text = _render(80)
    assert max(len(line) for line in text.splitlines()) <= 80
    for whole in ("prefill-10", "frontend-0", "DRAINING", "BACKOFF", "1234567", "2m05s", "42%"):
        assert whole in text, (whole, text)
    assert HOST not in text and "gpu-node" in text  # the host gives way, with an ellipsis
    assert "frontend-0: exited with status 1" in text  # the failure, below the table
    assert HOST in _render(140)


class _FakeSupervisor:
    def __init__(self) -> None:
        self.uptime = 60.0
        self.on_change: Any = None

    def status(self) -> StatusReport:
        self.uptime += 1.0  # time passes between redraws, no state changes
        return _report(self.uptime)


async def test_live_table_redraws_without_state_changes_and_logs_print_above_it() -> None:
    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=True, color_system=None)
    handler = logging.StreamHandler(sys.__stderr__)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        view = LiveView(True, console=console)
        view.TICK_S = 0.05
        with view:
            view.attach(_FakeSupervisor())  # type: ignore[arg-type]
            logging.getLogger("dynamoctl.test").warning("a log line during the live table")
            await asyncio.sleep(0.6)
        assert handler.stream is sys.__stderr__  # restored afterwards
    finally:
        root.removeHandler(handler)
    text = out.getvalue()
    assert len(set(re.findall(r"1m\d\ds", text))) >= 3, text[-2000:]  # redrawn, moving
    assert "a log line during the live table" in text  # printed by Live, not over it


def test_a_gang_row_names_every_node_an_mpi_world_included() -> None:
    common: dict[str, Any] = {"pid": 7, "state": "READY", "restarts": 0, "uptime_s": 1.0}
    rows = [
        InstanceStatus(
            name="agg-0", pool="agg", component="worker", host="n1", **common,
            gang="agg-0", mpi_nodes=["n1", "n2"],
        ),
        InstanceStatus(
            name="decode-0", pool="decode", component="worker", host="n3", **common,
            gang="decode-0",
        ),
        InstanceStatus(
            name="decode-0.1", pool="decode", component="follower", host="n4", **common,
            gang="decode-0", rank=1,
        ),
    ]  # fmt: skip
    report = StatusReport(
        name="g", phase="serving", endpoint="e", model="m", target="slurm", instances=rows
    )
    out = io.StringIO()
    Console(file=out, width=120, color_system=None).print(status_table(report, 120))
    lines = out.getvalue().splitlines()
    assert any("agg-0" in line and "n1,n2" in line for line in lines)
    assert any("decode-0 " in line and "n3,n4" in line for line in lines)
    assert any("└ decode-0.1" in line and "n4" in line for line in lines)


def test_spares_and_start_phases_at_80_columns() -> None:
    from dynamoctl.wire.start_phases import StartPhases

    report = _report()
    report.instances[0].start = StartPhases(process_s=0.03, ready_s=46.1, total_s=46.13)
    report.instances[1].state = "STANDBY"  # type: ignore[assignment]
    report.instances[1].start = StartPhases(total_s=50.0, promotion_s=0.12)
    report.measured_start_s = {"prefill": 46.13}
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(status_table(report, 80))
    lines = out.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert re.search(r"decode-1 +STANDBY ", next(x for x in lines if "decode-1" in x))
    assert "measured start-up: prefill 46.1 s" in out.getvalue()
    report.instances[0].start.promotion_s = 0.123
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(status_table(report, 80))
    assert "prefill 46.1 s (spare promoted in 0.12 s)" in out.getvalue()
