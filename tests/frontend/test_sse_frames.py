"""The SSE fast path frames text chunks byte for byte as the generic encoder does."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynamoctl.frontend.shape import _MARK, Shape, sse_data


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("model", ["mock-llama", 'we"ird\\ mødel \u2028 \x00\x01\x02 '])
@given(text=st.text(min_size=1))
def test_text_frame_matches_generic_encoding(
    endpoint: str, include_usage: bool, model: str, text: str
) -> None:
    shape = Shape(endpoint, "cmpl-0123", model)
    frame = shape.text_frame(include_usage)
    assert frame is not None
    fast = frame[0] + json.encoder.encode_basestring_ascii(text).encode() + frame[1]
    assert fast == sse_data(shape.with_usage(shape.chunk(text), include_usage))


def test_text_frame_refuses_an_ambiguous_split() -> None:
    assert Shape("completions", "cmpl-0", _MARK).text_frame(False) is None


class _NoModels:
    def get(self, name: str) -> None:
        return None

    def models(self) -> list[object]:
        return []


@pytest.mark.parametrize("via_router", [False, True])
async def test_hot_routes_answer_alike_directly_and_through_the_router(via_router: bool) -> None:
    """FrontendApp short-cuts the hot routes; Starlette's router still serves them (and
    /openapi.json lists them)."""
    import httpx

    from dynamoctl.frontend.app import build_app
    from dynamoctl.frontend.metrics import FrontendMetrics

    app = build_app(_NoModels(), None, FrontendMetrics())  # type: ignore[arg-type]
    target = app.api if via_router else app
    transport = httpx.ASGITransport(app=target)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        for path in ("/v1/completions", "/v1/chat/completions"):
            resp = await http.post(path, content=b'{"model": "m", "prompt": "x"}')
            assert resp.status_code == 400 if "chat" in path else 404, resp.text
            assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
            resp = await http.post(path, content=b"{oops")
            assert resp.status_code == 400 and "not valid JSON" in resp.text
        assert (await http.get("/v1/completions")).status_code == 405
        spec = (await http.get("/openapi.json")).json()
    assert {"/v1/completions", "/v1/chat/completions"} <= set(spec["paths"])
    body = spec["paths"]["/v1/completions"]["post"]["requestBody"]
    assert "prompt" in body["content"]["application/json"]["schema"]["properties"]
