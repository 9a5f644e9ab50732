"""Hostile and malformed requests never produce a 5xx, a cut stream, or take the frontend
down: bodies of any shape, well-formed requests with hostile values (huge integers, lone
surrogates, strings for numbers, deep nesting), and raw HTTP with odd methods, paths and
headers."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.frontend.conftest import MODEL, Deployment
from tests.frontend.rawhttp import exchange

PARAMS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
          "top_p", "seed", "stop", "stream", "stream_options", "n", "ignore_eos", "user",
          "role", "content", "include_usage", "logprobs", "tools", "echo"]  # fmt: skip

# Any code point, lone surrogates included (json.dumps writes them as \ud800 escapes).
any_text = st.text(st.characters() | st.characters(categories=["Cs"]), max_size=40)
numbers = (
    st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([2**63, 2**64, -(2**63) - 1, 10**400, 0, 1, -1])
    | st.floats()
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | numbers
    | any_text
    | st.sampled_from([MODEL, "user", "assistant", "system", "text", "5", "true", "1e999"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(PARAMS) | any_text, inner, max_size=5)
    ),
    max_leaves=12,
)
deep = st.integers(min_value=150, max_value=3000).flatmap(
    lambda n: st.sampled_from(["[" * n + "]" * n, '{"a":' * n + "1" + "}" * n])
)


def _dumps(value: object) -> bytes:
    # allow_nan: NaN and Infinity are not JSON, which is one more thing to send.
    return json.dumps(value, allow_nan=True).encode()


bodies = st.one_of(
    st.dictionaries(st.sampled_from(PARAMS), json_values, max_size=7)
    .map(lambda d: {"model": MODEL, **d} if "model" not in d else d)
    .map(_dumps),
    json_values.map(_dumps),
    deep.map(lambda d: f'{{"model": "{MODEL}", "prompt": "x", "user": {d}}}'.encode()),
    st.binary(max_size=200),
)


def check(resp: httpx.Response) -> None:
    assert resp.status_code < 500, resp.text[:500]
    if resp.status_code >= 400:
        error: dict[str, Any] = resp.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}


# One deployment for the module (each test asserts it still serves afterwards).
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def deployment(shared_deployment: Deployment) -> Deployment:
    return shared_deployment


SETTINGS = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@SETTINGS
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


def _short(value: object) -> object:
    """A valid token limit stays small: the fuzzing is about values, not long waits."""
    small = isinstance(value, int) and not isinstance(value, bool) and 8 < value <= 1 << 20
    return 8 if small else value


@SETTINGS
@given(
    chat=st.booleans(),
    stream=st.sampled_from([True, False, "true", 1, None]),
    overrides=st.dictionaries(st.sampled_from(PARAMS), json_values | deep, max_size=3),
    text=any_text,
)
async def test_fuzzed_values_never_5xx_nor_cut_stream(
    deployment: Deployment, chat: bool, stream: object, overrides: dict[str, Any], text: str
) -> None:
    """Well-formed requests with one to three hostile values: a 4xx naming what is wrong,
    or a 200 whose stream ends with ``[DONE]`` and no server error."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 4, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    body.update({k: _short(v) for k, v in overrides.items()})
    raw = _dumps(body)
    for value in overrides.values():  # a deep value goes in as raw JSON
        if isinstance(value, str) and value[:1] in "[{" and len(value) >= 300:
            raw = raw.replace(json.dumps(value).encode(), value.encode())
    path = "/v1/chat/completions" if chat else "/v1/completions"
    async with httpx.AsyncClient(timeout=60) as http:
        resp = await http.post(f"{deployment.frontend_url}{path}", content=raw)
    check(resp)
    if resp.status_code == 200 and body.get("stream") is True:
        assert resp.content.endswith(b"data: [DONE]\n\n"), resp.content[-300:]
        assert b"server_error" not in resp.content


methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "FOO"])
paths = st.sampled_from(
    ["/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/live",
     "/v1", "/", "/%00", "/v1/completions?x=1", "//v1/models", "/v1/../v1/models", "*"]
)  # fmt: skip
header_names = st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,20}", fullmatch=True) | st.sampled_from(
    ["Content-Type", "Authorization", "Expect", "Transfer-Encoding", "Connection", "Host"]
)
header_values = st.text(st.characters(min_codepoint=32, max_codepoint=255), max_size=60)


@SETTINGS
@given(
    method=methods,
    path=paths,
    headers=st.lists(st.tuples(header_names, header_values), max_size=8),
    body=bodies,
)
async def test_fuzzed_raw_http_never_5xx(
    deployment: Deployment, method: str, path: str, headers: list[tuple[str, str]], body: bytes
) -> None:
    framing = {"content-length", "transfer-encoding", "expect"}  # the body is framed by us
    lines = [f"{method} {path} HTTP/1.1", "Host: t"]
    lines += [f"{k}: {v}" for k, v in headers if k.lower() not in framing | {"host"}]
    lines.append(f"Content-Length: {len(body)}")
    data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    reply = await exchange(deployment.frontend_url, data, linger=0.01)
    assert reply.status < 500, reply
    async with httpx.AsyncClient(timeout=10) as http:
        assert (await http.get(f"{deployment.frontend_url}/health")).status_code == 200
