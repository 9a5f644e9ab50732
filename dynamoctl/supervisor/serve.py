"""``dynamoctl up`` in the foreground: lock the run directory, take back what a previous
supervisor that died left running (``adopt.py``), supervise, serve the control endpoint,
tear down in ``finally``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

from dynamoctl.component.http import BoundServer
from dynamoctl.launch.api import LaunchError
from dynamoctl.launch.registry import launcher_for
from dynamoctl.plan.build import build_plan
from dynamoctl.recipe.models import Recipe
from dynamoctl.recipe.targets import SlurmTarget
from dynamoctl.supervisor import credentials
from dynamoctl.supervisor.adopt import take_over
from dynamoctl.supervisor.control import build_app, control_address
from dynamoctl.supervisor.report import ControlAccess
from dynamoctl.supervisor.rundir import RunDir
from dynamoctl.supervisor.supervisor import StartupFailed, Supervisor

log = logging.getLogger(__name__)


class UpError(Exception):
    """``up`` could not start the deployment; nothing it started is left running."""


async def reap_leftovers(recipe: Recipe, run_dir: RunDir) -> list[str]:
    """Stop instances a dead supervisor recorded (their keepers normally did already)."""
    state = run_dir.read_state()
    if state is None or not state.records:
        return []
    launcher = launcher_for(recipe)
    reaped = []
    try:
        for name, record in state.records.items():
            if await launcher.reap(record, grace=5.0):
                reaped.append(name)
    finally:
        await launcher.close()
    state.records = {}
    run_dir.write_state(state)
    return reaped


async def serve(
    recipe: Recipe,
    recipe_path: Path,
    run_dir: RunDir,
    allocation: list[str] | None = None,
    on_start: Callable[[Supervisor], None] | None = None,
) -> None:
    """Run the deployment until SIGINT/SIGTERM or ``dynamoctl down``; raise :class:`UpError`
    when it cannot start."""
    if not run_dir.lock():
        state = run_dir.read_state()
        pid = f" (supervisor pid {state.supervisor_pid})" if state else ""
        raise UpError(
            f"deployment {recipe.name!r} is already up{pid}; see `dynamoctl status "
            f"{recipe.name}`, or stop it with `dynamoctl down {recipe.name}` first"
        )
    launcher = None
    try:
        plan, gpu_map = build_plan(recipe, run_dir.path, allocation)
        credentials.ensure(recipe, run_dir.path, plan.hosts[0])  # before any start
        credentials.use_for_discovery(recipe, run_dir.path)
        launcher = launcher_for(recipe)
        adopted = await take_over(plan, run_dir, launcher)
        if adopted:
            log.info("took back %s from the previous supervisor", ", ".join(sorted(adopted)))
        token = credentials.control_token(run_dir.path)
        bind, shown = control_address(recipe, plan.hosts[0].address)
        made: list[Supervisor] = []  # the routes act on it once it exists (below)
        try:
            control = BoundServer(build_app(lambda: made[0], token), bind, 0)
        except OSError as exc:
            raise UpError(f"supervision.control_host: cannot listen on {bind!r}: {exc}") from exc
        job = os.environ.get("SLURM_JOB_ID", "") if isinstance(recipe.target, SlurmTarget) else ""
        access = ControlAccess(f"http://{shown}:{control.port}", token, job)
        try:
            sup = Supervisor(
                recipe,
                str(recipe_path),
                plan,
                gpu_map,
                launcher,
                run_dir,
                access=access,
                adopted=adopted,
            )
        except ValueError as exc:  # the frontend's API keys, which its probe needs too
            raise UpError(f"frontend.api_keys_file/api_keys_env: {exc}") from exc
        made.append(sup)
        control_task = asyncio.create_task(control.run_bound(), name="control")
        loop = asyncio.get_running_loop()
        signals = 0

        def on_signal() -> None:
            nonlocal signals
            signals += 1
            sup.request_down(now=signals > 1)  # a second Ctrl-C skips draining

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        sup.save()
        if on_start is not None:
            on_start(sup)
        try:
            await sup.run()
        except (LaunchError, StartupFailed) as exc:  # run() recorded the phase and error
            raise UpError(f"{exc}\nrolled back: nothing of {recipe.name!r} is running") from exc
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            control.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await control_task
    finally:
        if launcher is not None:
            await launcher.close()
        run_dir.release()
