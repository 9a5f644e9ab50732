"""Engines by name: unknown names list the valid ones; missing packages name the extra."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dynamoctl.engines import registry
from dynamoctl.engines.mocker import MockerEngine, VirtualClock
from dynamoctl.engines.spec import EngineSpec


def _spec(name: str, adapter: str) -> EngineSpec:
    """A spec like the mocker's under another name, its adapter and extra elsewhere."""
    return dataclasses.replace(registry.ENGINES["mocker"], name=name, adapter=adapter, extra=name)


def test_unknown_engine_lists_valid_ones() -> None:
    with pytest.raises(registry.UnknownEngine, match=r"unknown engine 'vlm'; valid: .*mocker"):
        registry.create_engine("vlm")


def test_mocker_from_options_and_runtime_objects() -> None:
    clock = VirtualClock()
    engine = registry.create_engine("mocker", {"num_gpu_blocks": 32, "block_size": 8}, clock=clock)
    assert isinstance(engine, MockerEngine)
    assert engine.clock is clock
    assert (engine.model_card.kv_capacity_blocks, engine.model_card.block_size) == (32, 8)
    with pytest.raises(ValueError, match="num_gpu_blocks"):
        registry.create_engine("mocker", {"num_gpu_blocks": 0})
    with pytest.raises(ValueError, match="unknown mocker argument --blocks"):
        registry.create_engine("mocker", {"blocks": 1})


def test_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "ENGINES", registry.ENGINES.copy())
    registry.register_engine(_spec("fancy", "no_such_module_xyz.engine:Engine"))
    assert "fancy" in registry.engine_names()
    with pytest.raises(registry.EngineUnavailable, match=r"pip install 'dynamoctl\[fancy\]'"):
        registry.create_engine("fancy")
    with pytest.raises(ValueError, match="already registered"):
        registry.register_engine(_spec("mocker", "elsewhere:Engine"))


def test_broken_install_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An engine package that is installed but fails to import (missing CUDA libraries)."""
    (tmp_path / "broken_engine_xyz.py").write_text(
        "raise OSError('libcuda.so.1: cannot open shared object file\\ndetails')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "ENGINES", registry.ENGINES.copy())
    registry.register_engine(_spec("broken", "broken_engine_xyz:Engine"))
    with pytest.raises(registry.EngineUnavailable) as err:
        registry.create_engine("broken")
    assert str(err.value) == (
        "engine 'broken' is installed but fails to import "
        "(OSError: libcuda.so.1: cannot open shared object file)"
    )


def test_real_engines_are_registered() -> None:
    assert {"mocker", "vllm", "sglang", "trtllm"} <= set(registry.engine_names())
