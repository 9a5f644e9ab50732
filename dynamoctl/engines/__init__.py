"""Engine adapters: the :class:`~dynamoctl.engines.api.Engine` protocol, and engines by name.

``mocker`` (simulated, always available) lives here; real engines (``vllm``, ``sglang``,
``trtllm``) are optional extras, imported only when a worker asks for them.
"""

from dynamoctl.engines.api import (
    Engine,
    EngineError,
    EngineStopped,
    FinishReason,
    GenerateChunk,
    GenerateRequest,
    KVEventSink,
    KvEventSource,
    LoadMetrics,
    ModelCard,
    PublishesKvEvents,
    RequestRejected,
)
from dynamoctl.engines.registry import (
    EngineUnavailable,
    UnknownEngine,
    create_engine,
    engine_names,
    register_engine,
)

__all__ = [
    "Engine",
    "EngineError",
    "EngineStopped",
    "EngineUnavailable",
    "FinishReason",
    "GenerateChunk",
    "GenerateRequest",
    "KVEventSink",
    "KvEventSource",
    "LoadMetrics",
    "ModelCard",
    "PublishesKvEvents",
    "RequestRejected",
    "UnknownEngine",
    "create_engine",
    "engine_names",
    "register_engine",
]
