"""Logging with a ``[component/instance]`` prefix on every line.

Each process calls :func:`setup` once with the component it runs; library code only
uses ``logging.getLogger(__name__)`` with lazy ``%`` arguments.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

_FORMAT = "%(asctime)s %(levelname).1s [%(component)s] %(name)s: %(message)s"
QUIET = ("httpx", "httpcore")
"""Libraries that log every request at INFO: the supervisor's probes, several a second.
They speak at WARNING and above unless the level asked for is DEBUG."""


class _ComponentFilter(logging.Filter):
    def __init__(self, component: str) -> None:
        super().__init__()
        self.component = component

    def filter(self, record: logging.LogRecord) -> bool:
        record.component = self.component
        return True


def setup(component: str, level: str | int | None = None) -> None:
    """Route the root logger to stderr with a ``[component]`` prefix.

    ``level`` defaults to ``$DYNAMOCTL_LOG_LEVEL`` or INFO.
    """
    level = level or os.environ.get("DYNAMOCTL_LOG_LEVEL", "INFO")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
    handler.addFilter(_ComponentFilter(component))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    quiet = logging.DEBUG if root.level <= logging.DEBUG else logging.WARNING
    for name in QUIET:
        logging.getLogger(name).setLevel(quiet)


def also_to(path: Path) -> None:
    """Copy every log line to ``path`` too, unless stderr already goes there (a detached
    supervisor, a Slurm job whose output is that file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if os.path.samestat(os.fstat(sys.stderr.fileno()), os.stat(path)):
            return
    except (OSError, ValueError):  # no such file yet, or stderr is not a real file
        pass
    root = logging.getLogger()
    handler = logging.FileHandler(path)
    handler.setFormatter(root.handlers[0].formatter)
    for log_filter in root.handlers[0].filters:
        handler.addFilter(log_filter)
    root.addHandler(handler)
