"""The mocker: a simulated vLLM-like engine (KV block pool, scheduler, timing model).

Always available; used for laptops, CI, benchmarks and router/planner tests at scale.
Its names are imported when first asked for, so reading its spec (``spec.py``) loads no
simulator.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dynamoctl.engines.mocker.clock import Clock, RealClock, VirtualClock
    from dynamoctl.engines.mocker.config import MockerConfig
    from dynamoctl.engines.mocker.engine import MockerEngine, MockerStats
    from dynamoctl.engines.mocker.stream import MockerStream
    from dynamoctl.engines.mocker.timing import TimingModel

_MODULES = {
    "Clock": "clock",
    "RealClock": "clock",
    "VirtualClock": "clock",
    "MockerConfig": "config",
    "MockerEngine": "engine",
    "MockerStats": "engine",
    "MockerStream": "stream",
    "TimingModel": "timing",
}

__all__ = [
    "Clock",
    "MockerConfig",
    "MockerEngine",
    "MockerStats",
    "MockerStream",
    "RealClock",
    "TimingModel",
    "VirtualClock",
]


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
