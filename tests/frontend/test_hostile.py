"""Hostile and malformed bodies never produce a 5xx or take the frontend down."""

from __future__ import annotations

import json
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.frontend.conftest import MODEL, Deployment

PARAMS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
          "top_p", "seed", "stop", "stream", "stream_options", "n", "ignore_eos", "user",
          "role", "content", "include_usage", "logprobs", "tools"]  # fmt: skip

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
    | st.sampled_from([MODEL, "user", "assistant", "system", "text"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(PARAMS) | st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=12,
)
bodies = st.one_of(
    st.dictionaries(st.sampled_from(PARAMS), json_values, max_size=7)
    .map(lambda d: {"model": MODEL, **d} if "model" not in d else d)
    .map(lambda d: json.dumps(d).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=200),
)


def check(resp: httpx.Response) -> None:
    assert resp.status_code < 500, resp.text
    if resp.status_code >= 400:
        error: dict[str, Any] = resp.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(body=bodies, chat=st.booleans())
async def test_fuzzed_bodies_never_5xx(deployment: Deployment, body: bytes, chat: bool) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    async with httpx.AsyncClient(timeout=30) as http:
        resp = await http.post(
            f"{deployment.frontend_url}{path}",
            content=body,
            headers={"content-type": "application/json"},
        )
        check(resp)
        # And the frontend still serves a good request afterwards.
        assert (await http.get(f"{deployment.frontend_url}/health")).status_code == 200
