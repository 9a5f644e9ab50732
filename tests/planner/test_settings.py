"""The planner's knobs: the reference's defaults, bounds, and one flag per field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dynamoctl.planner.settings import PlannerSettings
from dynamoctl.settings.base import cli_parameters, to_argv

pytestmark = pytest.mark.planner


def test_defaults_are_the_reference_systems() -> None:
    settings = PlannerSettings()
    assert (settings.ttft_target, settings.itl_target) == (0.5, 0.05)
    assert (settings.gpu_budget, settings.throughput_interval, settings.load_interval) == (
        8,
        180,
        5,
    )
    assert settings.bounds("decode") == (1, 8)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"prefill_min_replicas": 3, "prefill_max_replicas": 2}, r"\(3\) is more than prefill_max"),
        ({"kv_usage_down": 0.9, "kv_usage_up": 0.8}, "kv_usage_down must be under"),
        ({"prefill_queue_down": 2.0}, "prefill_queue_down must be under"),
        ({"scale_down_fraction": 1.0}, "less than 1"),
        ({"predictor": "prophet"}, "'constant', 'moving-average' or 'kalman'"),
        ({"gpu_budget": "8"}, "valid integer"),
    ],
)
def test_incoherent_settings_are_refused(values: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        PlannerSettings(**values)  # type: ignore[arg-type]


def test_every_knob_is_a_flag_with_its_bounds() -> None:
    flags = {param.name: param.default for param in cli_parameters(PlannerSettings)}
    assert set(flags) == set(PlannerSettings.model_fields)
    assert flags["gpu_budget"].min == 1
    assert to_argv(PlannerSettings(ttft_target_ms=300.0), explicit=True) == [
        "--ttft-target-ms",
        "300.0",
    ]
