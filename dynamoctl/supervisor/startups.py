"""Start-up known: each start timed by phase, and a small history of how long a model takes
to start on a kind of node, kept in the state directory across deployments.

The supervisor stamps an instance's start (:class:`StartClock`); the history
(:class:`StartHistory`) keeps the last :data:`KEEP` whole starts per model and node kind,
whose median ``status`` shows per pool, ``/metrics`` exports, and the supervisor's start
timeout uses when ``supervision.start_timeout_factor`` is set (the planner reads it from
``status`` as its start-up estimate).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from dynamoctl.recipe.models import Recipe, Role
from dynamoctl.wire.health import WorkerHealth
from dynamoctl.wire.start_phases import StartPhases

log = logging.getLogger(__name__)

KEEP = 20
"""Starts remembered per model and node kind: recent enough to follow a change (a faster
filesystem, a node cache), enough for a median that one slow start does not move."""
HISTORY_FILE = "start_history.json"
MIN_TIMEOUT_S = 30.0
"""The least start timeout a measured figure gives: a model measured starting in 2 s still
gets a slow node's worth of time."""


def node_kind(recipe: Recipe, role: Role) -> str:
    """What a start's duration depends on besides the model: the target kind, the engine and
    the GPUs a replica holds (``slurm:vllm:8gpu``)."""
    pool = recipe.workers.pools()[role]
    return f"{recipe.target.kind}:{pool.engine}:{pool.gpus_per_replica}gpu"


@dataclass
class StartClock:
    """The monotonic stamps of one instance's current start."""

    launch_at: float | None = None
    launched_at: float | None = None
    staging_s: float | None = None
    """Set by whoever staged the weights for this start (the node model cache)."""
    last: StartPhases | None = None
    """The phases of the last start that was timed (the current one while it runs)."""
    promotion_asked: float | None = None

    def launching(self) -> None:
        self.launch_at, self.launched_at = time.monotonic(), None
        self.last = StartPhases(staging_s=self.staging_s)

    def launched(self) -> None:
        self.launched_at = time.monotonic()
        if self.last is not None and self.launch_at is not None:
            self.last.process_s = round(self.launched_at - self.launch_at, 3)

    def ready(self, staged_in_process: float | None = None) -> float | None:
        """The first readiness of this start: its phases complete; the whole start's
        seconds (None for a process taken back, whose launch was not seen).
        ``staged_in_process``: seconds the worker itself spent staging its weights (the node
        model cache runs inside the worker, after launch): shown as the staging phase and
        taken out of ``ready_s``, never added to the total twice."""
        now = time.monotonic()
        if self.last is None or self.launched_at is None or self.launch_at is None:
            return None
        ready_s = now - self.launched_at
        if staged_in_process is not None:
            self.last.staging_s = round(staged_in_process, 3)
            ready_s = max(0.0, ready_s - staged_in_process)
        self.last.ready_s = round(ready_s, 3)
        total = now - self.launch_at + (self.staging_s or 0.0)
        self.last.total_s = round(total, 3)
        return total

    def promoted(self) -> float:
        asked = self.promotion_asked if self.promotion_asked is not None else time.monotonic()
        took = time.monotonic() - asked
        self.last = self.last or StartPhases()
        self.last.promotion_s = round(took, 3)
        self.promotion_asked = None
        return took


@dataclass
class StartHistory:
    """Whole-start seconds per ``model|node kind``, the last :data:`KEEP` of each, in a JSON
    file (written whole, atomically: a supervisor killed mid-write leaves the old file)."""

    path: Path
    starts: dict[str, list[float]] = field(default_factory=dict)

    @classmethod
    def load(cls, directory: Path) -> StartHistory:
        path = directory / HISTORY_FILE
        try:
            raw = json.loads(path.read_text())
            starts = {str(k): [float(x) for x in v][-KEEP:] for k, v in raw.items()}
        except FileNotFoundError:
            starts = {}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning("start history %s unreadable (%s): starting a new one", path, exc)
            starts = {}
        return cls(path, starts)

    @staticmethod
    def key(model: str, kind: str) -> str:
        return f"{model}|{kind}"

    def add(self, model: str, kind: str, seconds: float) -> None:
        runs = self.starts.setdefault(self.key(model, kind), [])
        runs.append(round(seconds, 3))
        del runs[:-KEEP]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.starts, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError as exc:  # a read-only state dir: the figures live in memory only
            log.warning("could not save the start history to %s: %s", self.path, exc)

    def median(self, model: str, kind: str) -> float | None:
        runs = self.starts.get(self.key(model, kind))
        return statistics.median(runs) if runs else None

    def by_key(self) -> dict[tuple[str, str], float]:
        """Every (model, node kind) with its median."""
        out = {}
        for key, runs in self.starts.items():
            model, _, kind = key.rpartition("|")
            if runs:
                out[(model, kind)] = statistics.median(runs)
        return out


def start_timeout(configured: float, factor: float | None, measured: float | None) -> float:
    """The start timeout of an instance: ``configured``, or ``factor`` times the measured
    median (at least :data:`MIN_TIMEOUT_S`) when the recipe asks for it and a figure is
    known."""
    if factor is None or measured is None:
        return configured
    return max(MIN_TIMEOUT_S, factor * measured)


class Starts:
    """The deployment's side of start-up timing: a worker's first readiness recorded in the
    history, its start timeout, and each pool's measured figure for ``status``."""

    def __init__(self, recipe: Recipe, model: str, history: StartHistory) -> None:
        self.recipe = recipe
        self.model = model
        self.history = history

    def _kind(self, component: str, pool: str) -> str | None:
        roles = self.recipe.workers.pools()
        role = next((r for r in roles if r == pool), None)
        return node_kind(self.recipe, role) if component == "worker" and role else None

    def ready(
        self, component: str, pool: str, clock: StartClock, staged_s: float | None = None
    ) -> None:
        """A start's first readiness: its phases complete, a worker's kept in the history
        (``staged_s``: what the worker's ``/health`` says its own staging took)."""
        total = clock.ready(staged_s)
        kind = self._kind(component, pool)
        if total is not None and kind is not None:
            self.history.add(self.model, kind, total)

    def timeout(self, component: str, pool: str) -> float:
        settings = self.recipe.supervision
        kind = self._kind(component, pool)
        measured = self.history.median(self.model, kind) if kind else None
        return start_timeout(settings.start_timeout, settings.start_timeout_factor, measured)

    def measured(self) -> dict[str, float]:
        """Each worker pool's measured start-up (``status``'s ``measured_start_s``)."""
        out: dict[str, float] = {}
        for role in self.recipe.workers.pools():
            median = self.history.median(self.model, node_kind(self.recipe, role))
            if median is not None:
                out[role] = round(median, 3)
        return out


def staged_seconds(sample: object) -> float | None:
    """What a worker's last ``/health`` says its own weight staging took (the node model
    cache stages inside the worker, docs/operations.md "Model cache"); None otherwise."""
    if isinstance(sample, WorkerHealth) and sample.staging is not None:
        return sample.staging.staging_s
    return None
