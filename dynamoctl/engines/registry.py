"""Engines by name, imported only when asked for.

An entry names a factory as ``"module:attribute"`` and, for real engines, the pip extra
that provides it: ``dynamoctl worker --engine vllm`` on a node without vLLM fails with
the command that fixes it instead of an ``ImportError`` from deep inside.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from dynamoctl.engines.api import Engine, EngineError
from dynamoctl.util.registry import Registry

EngineFactory = Callable[..., Engine]
"""Builds an engine from keyword options (the recipe's engine arguments)."""


class UnknownEngine(ValueError):
    """No engine is registered under that name; the message lists the valid ones."""


class EngineUnavailable(EngineError):
    """The engine is registered but its package is not installed."""


@dataclass(frozen=True)
class EngineEntry:
    """A registered engine."""

    name: str
    target: str
    """``"module:attribute"`` (dotted attribute allowed) of the :data:`EngineFactory`."""
    extra: str | None = None
    """The dynamoctl extra that installs the engine (``pip install 'dynamoctl[vllm]'``)."""


ENGINES: Registry[EngineEntry] = Registry("engine", UnknownEngine)


def register_engine(name: str, target: str, *, extra: str | None = None) -> None:
    """Register ``target`` (``"module:factory"``) as engine ``name``; nothing is imported."""
    if name in ENGINES and ENGINES[name].target == target:
        return
    ENGINES.add(name, EngineEntry(name, target, extra))


def engine_names() -> list[str]:
    """Registered engine names, sorted."""
    return sorted(ENGINES)


def load_engine_factory(name: str) -> EngineFactory:
    """Import and return the factory of engine ``name``."""
    entry = ENGINES[name]
    module_name, _, attr = entry.target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f": pip install 'dynamoctl[{entry.extra}]'" if entry.extra else ""
        raise EngineUnavailable(f"engine {name!r} is not installed ({exc}){hint}") from exc
    except Exception as exc:  # installed but broken (missing CUDA libraries, ...): one line too
        if entry.extra is None:
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise EngineUnavailable(
            f"engine {name!r} is installed but fails to import ({type(exc).__name__}: {first})"
        ) from exc
    for part in attr.split("."):
        obj = getattr(obj, part)
    return cast(EngineFactory, obj)


def create_engine(name: str, options: Mapping[str, Any] | None = None, **kwargs: Any) -> Engine:
    """Build engine ``name`` from ``options`` (recipe arguments) plus ``kwargs`` (runtime
    objects such as a clock), e.g. ``create_engine("mocker", {"num_gpu_blocks": 1024})``."""
    return load_engine_factory(name)(**dict(options or {}), **kwargs)


register_engine("mocker", "dynamoctl.engines.mocker.engine:MockerEngine.from_options")
register_engine("vllm", "dynamoctl.engines.vllm.engine:VllmEngine.from_options", extra="vllm")
register_engine(
    "sglang", "dynamoctl.engines.sglang.engine:SglangEngine.from_options", extra="sglang"
)
register_engine(
    "trtllm", "dynamoctl.engines.trtllm.engine:TrtllmEngine.from_options", extra="trtllm"
)
