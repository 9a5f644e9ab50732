from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamoctl.wire.engine_args import parse_engine_args, render_engine_args


def test_parse_examples() -> None:
    assert parse_engine_args(
        ["--num-gpu-blocks", "4096", "--enforce-eager", "--no-enable-prefix-caching",
         "--kv-transfer-config", '{"kv_connector": "NixlConnector"}', "--model=meta/llama"]
    ) == {
        "num_gpu_blocks": 4096,
        "enforce_eager": True,
        "enable_prefix_caching": False,
        "kv_transfer_config": {"kv_connector": "NixlConnector"},
        "model": "meta/llama",
    }  # fmt: skip


def test_positional_garbage_is_refused() -> None:
    with pytest.raises(ValueError, match="should look like --name"):
        parse_engine_args(["4096"])


names = st.from_regex(r"[a-z][a-z0-9]{0,6}(_[a-z0-9]{1,5}){0,2}", fullmatch=True).filter(
    lambda n: not n.startswith("no_")
)
values = st.one_of(
    st.booleans(),
    st.integers(-(10**9), 10**9),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(min_size=1, max_size=12).filter(lambda t: not t.startswith("--")),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)


@given(st.dictionaries(names, values, max_size=6))
def test_render_then_parse_round_trips(options: dict[str, Any]) -> None:
    assert parse_engine_args(render_engine_args(options)) == options
