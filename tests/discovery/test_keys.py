import pytest

from dynamoctl.discovery import keys


def test_layout_matches_design() -> None:
    assert keys.instance_key("prod", "worker", "generate", "a1") == (
        "prod/instances/worker/generate/a1"
    )
    assert keys.model_key("prod", "meta-llama/Llama-3", "a1") == "prod/models/meta-llama/Llama-3/a1"
    assert keys.events_key("prod", "worker", "a1") == "prod/events/worker/a1"
    assert keys.events_prefix("prod", "router") == "prod/events/router/"
    assert keys.split_instance_key("prod/instances/worker/generate/a1") == (
        "prod", "worker", "generate", "a1",
    )  # fmt: skip


@pytest.mark.parametrize("bad", ["", "a/b"])
def test_segments_with_separators_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="must be non-empty"):
        keys.instance_key("prod", bad, "generate", "a1")
