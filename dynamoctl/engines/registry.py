"""Engines by name: each engine's spec (``engines/<engine>/spec.py``), one line each at
the end; its adapter is imported only when a worker asks for it.

A spec names the adapter's factory as ``"module:attribute"`` and, for real engines, the
pip extra that provides it: ``dynamoctl worker --engine vllm`` on a node without vLLM fails with
the command that fixes it instead of an ``ImportError`` from deep inside.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

from dynamoctl.engines.api import Engine, EngineError
from dynamoctl.engines.mocker import spec as mocker
from dynamoctl.engines.sglang import spec as sglang
from dynamoctl.engines.spec import EngineSpec, load_entry
from dynamoctl.engines.trtllm import spec as trtllm
from dynamoctl.engines.vllm import spec as vllm
from dynamoctl.util.registry import Registry

EngineFactory = Callable[..., Engine]
"""Builds an engine from keyword options (the recipe's engine arguments)."""


class UnknownEngine(ValueError):
    """No engine is registered under that name; the message lists the valid ones."""


class EngineUnavailable(EngineError):
    """The engine is registered but its package is not installed."""


ENGINES: Registry[EngineSpec] = Registry("engine", UnknownEngine)
"""Every engine dynamoctl runs, by name: what the recipe accepts and the plan commands."""


def register_engine(spec: EngineSpec) -> EngineSpec:
    """Register engine ``spec.name``; nothing of its adapter is imported."""
    return ENGINES.add(spec.name, spec)


def engine_spec(name: str) -> EngineSpec:
    """The spec of engine ``name`` (:class:`UnknownEngine` lists the valid ones)."""
    return ENGINES[name]


def engine_names() -> list[str]:
    """Registered engine names, sorted."""
    return sorted(ENGINES)


def load_engine_factory(name: str) -> EngineFactory:
    """Import and return the factory of engine ``name``."""
    entry = ENGINES[name]
    try:
        factory = load_entry(entry.adapter)
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
    return cast(EngineFactory, factory)


def create_engine(name: str, options: Mapping[str, Any] | None = None, **kwargs: Any) -> Engine:
    """Build engine ``name`` from ``options`` (recipe arguments) plus ``kwargs`` (runtime
    objects such as a clock), e.g. ``create_engine("mocker", {"num_gpu_blocks": 1024})``."""
    return load_engine_factory(name)(**dict(options or {}), **kwargs)


register_engine(mocker.SPEC)
register_engine(vllm.SPEC)
register_engine(sglang.SPEC)
register_engine(trtllm.SPEC)
