"""The mocker: a simulated vLLM-like engine (KV block pool, scheduler, timing model).

Always available; used for laptops, CI, benchmarks and router/planner tests at scale.
"""

from dynamoctl.engines.mocker.clock import Clock, RealClock, VirtualClock
from dynamoctl.engines.mocker.config import MockerConfig
from dynamoctl.engines.mocker.engine import MockerEngine, MockerStats, MockerStream
from dynamoctl.engines.mocker.timing import TimingModel

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
