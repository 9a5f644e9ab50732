"""The mocker's simulated start-up: weight bytes from a model's configuration, the phases
advancing on the engine's clock at its speedup, what the worker reports of them."""

from __future__ import annotations

import asyncio

import pytest

from dynamoctl.engines.mocker import MockerConfig, MockerEngine, RealClock, VirtualClock
from dynamoctl.engines.mocker.startup import (
    DEFAULT_ENGINE_INIT_S,
    SOURCE_GBPS,
    Startup,
    StartupOptions,
)
from dynamoctl.worker.http import worker_health


def test_llama_8b_weights_are_its_16_gb_of_bf16_parameters() -> None:
    pytest.importorskip("aiconfigurator")
    startup = Startup(StartupOptions(weights_model="meta-llama/Meta-Llama-3.1-8B"))
    assert 8.0e9 < startup.bytes / 2 < 8.1e9  # Llama-3.1-8B: 8.03 B parameters
    # From a shared filesystem, then the default initialisation: the >= 45 s of a real one.
    assert startup.expected_s == pytest.approx(
        startup.bytes / 1e9 / SOURCE_GBPS["shared-fs"] + DEFAULT_ENGINE_INIT_S
    )
    assert startup.expected_s >= 45.0
    eight = Startup(StartupOptions(weights_model="meta-llama/Meta-Llama-3.1-70B"), tp_size=8)
    assert 17e9 < eight.bytes < 18e9  # a rank of 70B at TP 8 reads an eighth


def test_bandwidth_and_init_are_settable_and_nothing_set_is_ready_at_once() -> None:
    assert Startup(StartupOptions()).expected_s == 0.0
    options = StartupOptions(weights_bytes=6 * 10**9, weights_source="page-cache")
    assert Startup(options).expected_s == pytest.approx(0.6 + DEFAULT_ENGINE_INIT_S)
    options = StartupOptions(weights_bytes=6 * 10**9, weights_gbps=2.0, engine_init_s=5.0)
    assert Startup(options).expected_s == pytest.approx(8.0)
    with pytest.raises(ValueError, match="unknown mocker argument --weights-sorce"):
        MockerConfig.from_options({"weights_sorce": "local-disk"})


async def test_start_walks_the_phases_on_the_clock_at_its_speedup() -> None:
    # 2 GB at 1 GB/s then 2 s of init: 4 simulated seconds, 40 ms of wall at 100x.
    config = MockerConfig(weights_bytes=2 * 10**9, weights_gbps=1.0, engine_init_s=2.0)
    engine = MockerEngine(config, clock=RealClock(100.0))
    starting = asyncio.create_task(engine.start())
    seen = []
    while not starting.done():
        report = engine.startup_report()
        seen.append((report.phase, report.loaded_bytes, report.elapsed_s))
        await asyncio.sleep(0.002)
    await starting
    phases = [phase for phase, _, _ in seen]
    assert phases[0] == "weights" and "init" in phases and "ready" not in phases
    loading = [loaded for phase, loaded, _ in seen if phase == "weights"]
    assert loading == sorted(loading) and 0 < max(loading) < 2 * 10**9
    assert all(loaded == 2 * 10**9 for phase, loaded, _ in seen if phase == "init")
    assert all(elapsed >= 2.0 for phase, _, elapsed in seen if phase == "init")
    done = engine.startup_report()
    assert (done.phase, done.loaded_bytes) == ("ready", 2 * 10**9)
    assert engine.load_metrics().startup_s == pytest.approx(4.0, abs=0.5)
    await engine.stop()


async def test_a_virtual_clock_passes_the_start_up_in_no_wall_time() -> None:
    clock = VirtualClock()
    engine = MockerEngine(MockerConfig(weights_bytes=16 * 10**9), clock=clock)
    assert engine.load_metrics().startup_s is None  # not started: nothing to report
    await engine.start()
    assert clock.now() == pytest.approx(16.0 + DEFAULT_ENGINE_INIT_S)
    assert engine.load_metrics().startup_s == pytest.approx(46.0)
    await engine.stop()
    await engine.start()  # a restart of the same engine is warm
    assert clock.now() == pytest.approx(46.0)
    await engine.stop()


def test_worker_health_carries_the_engine_start_up() -> None:
    class Bare:  # what worker_health reads of an instance
        draining, inflight, tokens_total, instance_id = False, 0, 0, "w-0"
        adapters = None  # no LoRA

        def __init__(self) -> None:
            self.engine = MockerEngine(MockerConfig(weights_bytes=10**9), clock=VirtualClock())

    report = worker_health([Bare()], ready=False)  # type: ignore[list-item]
    assert report.status == "starting"
    assert report.startup is not None and report.startup.phase == "weights"
    assert report.startup.expected_s == pytest.approx(1.0 + DEFAULT_ENGINE_INIT_S)
