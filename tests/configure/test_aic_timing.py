"""The mocker's `perf_model: aic` timing: its tables reproduce AI Configurator's own step
latencies, a lone request runs at exactly those times on a virtual clock, and the options
are refused with a clear message when incomplete."""

from __future__ import annotations

import itertools

import pytest

from tests.configure.conftest import require_aic

require_aic()

from dynamoctl.configure import aic  # noqa: E402
from dynamoctl.configure.models import ConfigureError, Parallel  # noqa: E402
from dynamoctl.engines.api import GenerateRequest  # noqa: E402
from dynamoctl.engines.mocker import MockerConfig, MockerEngine, VirtualClock  # noqa: E402
from dynamoctl.engines.mocker.aic_timing import AicTiming  # noqa: E402

pytestmark = pytest.mark.configure
MODEL = "meta-llama/Meta-Llama-3.1-8B"
OPTIONS = {
    "perf_model": "aic", "aic_model": MODEL, "aic_system": "h100_sxm", "aic_engine": "vllm",
    "aic_tp_size": 1, "max_num_seqs": 64, "max_num_batched_tokens": 4096,
    "num_gpu_blocks": 2048, "block_size": 64,
}  # fmt: skip


@pytest.fixture(scope="module")
def timing() -> AicTiming:
    return AicTiming.build(MockerConfig.from_options(OPTIONS))


@pytest.fixture(scope="module")
def steps() -> aic.StepLatency:
    return aic.step_latency(MODEL, "h100_sxm", "vllm", None, Parallel())


@pytest.mark.parametrize("tokens", [1, 100, 777, 3000, 4100])
def test_prefill_between_grid_points_is_within_2_percent(
    timing: AicTiming, steps: aic.StepLatency, tokens: int
) -> None:
    assert timing.prefill_ms(tokens) == pytest.approx(steps.prefill_ms(tokens), rel=0.02)


@pytest.mark.parametrize(("batch", "context"), [(1, 1), (5, 700), (37, 3000), (64, 9000)])
def test_decode_between_grid_points_is_within_2_percent(
    timing: AicTiming, steps: aic.StepLatency, batch: int, context: int
) -> None:
    assert timing.decode_ms(batch, context) == pytest.approx(
        steps.decode_ms(batch, context), rel=0.02
    )


def test_a_mixed_step_is_close_to_ai_configurators_own(timing: AicTiming) -> None:
    engine = aic._module("aiconfigurator_core.sdk.engine").EngineHandle.compile(
        MODEL, "h100_sxm", "vllm", tp_size=1
    )
    capacity = timing.capacity_tokens
    for prompt, decodes, context in ((4000, 47, 4250), (1024, 55, 1100), (512, 8, 2000)):
        usage = (decodes * context + prompt) / capacity
        ours = timing.step_ms(prompt, decodes, usage)
        theirs = engine.mixed_step_latency(prompt, decodes, prompt, 2 * (context - prompt))
        assert ours == pytest.approx(theirs, rel=0.05), (prompt, decodes, context)
    # A decode-only step depends on the batch's context (read from the KV usage).
    short, long = timing.step_ms(0, 32, 32 * 200 / capacity), timing.step_ms(0, 32, 0.9)
    assert long > short > 0


async def test_a_lone_request_runs_at_the_tables_times(timing: AicTiming) -> None:
    clock = VirtualClock()
    engine = MockerEngine(MockerConfig.from_options(OPTIONS), clock=clock, timing=timing)
    await engine.start()
    try:
        prompt = list(range(1000, 3000))
        times = []
        async for _ in engine.generate(GenerateRequest("r", prompt, 4)):
            times.append(clock.now())
    finally:
        await engine.stop()
    assert times[0] * 1e3 == pytest.approx(timing.prefill_ms(len(prompt)))
    gaps = [(b - a) * 1e3 for a, b in itertools.pairwise(times)]
    blocks_held = -(-(len(prompt) + 1) // 64) * 64  # the KV usage the engine reports
    assert gaps[0] == pytest.approx(timing.decode_ms(1, blocks_held), rel=0.02)
    assert gaps[0] < times[0] * 1e3  # a decode step is far cheaper than a 2000-token prefill


def test_incomplete_or_unknown_aic_options_are_refused() -> None:
    with pytest.raises(ConfigureError, match="perf_model aic needs aic_model"):
        MockerEngine(MockerConfig.from_options({"perf_model": "aic"}))
    with pytest.raises(ConfigureError, match="system x100: no performance data"):
        MockerEngine(MockerConfig.from_options({**OPTIONS, "aic_system": "x100"}))
    with pytest.raises(ValueError, match="perf_model"):
        MockerConfig.from_options({"perf_model": "cubic"})
