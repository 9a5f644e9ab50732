"""API keys on the OpenAI endpoint: from a file and an environment variable, 401 in
OpenAI's shape without one, probes' paths open, and no key ever in a log or command line."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import psutil
import pytest
import pytest_asyncio

from tests.frontend.conftest import MODEL, Deployment

pytestmark = pytest.mark.asyncio(loop_scope="module")

FILE_KEYS = ["sk-file-one-7c1f9a", "sk-file-two-55d0e2"]
ENV_KEYS = ["sk-env-a-0b6e31", "sk-env-b-f93d47"]
WRONG = "sk-wrong-e8a2c4"
ENV = "DYNAMOCTL_TEST_API_KEYS"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def secured(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Deployment]:
    tmp = Path(tmp_path_factory.mktemp("keys"))
    keys = tmp / "keys.txt"
    keys.write_text(f"# clients\n{FILE_KEYS[0]}\n\n  {FILE_KEYS[1]}  \n")
    dep = Deployment(tmp)
    mp = pytest.MonkeyPatch()
    mp.setenv(ENV, f"{ENV_KEYS[0]}, {ENV_KEYS[1]}")
    try:
        dep.worker("--num-workers", "1", "--speedup-ratio", "20")
        await dep.wait_for("worker", 1)
        dep.spawn("frontend", "frontend", "--port", "0",
                  "--api-keys-file", str(keys), "--api-keys-env", ENV)  # fmt: skip
        await dep.wait_for("frontend", 1)
        dep.frontend_url = (await dep.records("frontend"))[0].address
        auth = {"Authorization": f"Bearer {FILE_KEYS[0]}"}
        async with httpx.AsyncClient() as http:
            deadline = time.monotonic() + 30
            while not (await http.get(f"{dep.frontend_url}/v1/models", headers=auth)).json()[
                "data"
            ]:
                assert time.monotonic() < deadline, "frontend never listed the model"
                await asyncio.sleep(0.1)
        yield dep
    finally:
        mp.undo()
        dep.stop()


def check_401(resp: httpx.Response) -> None:
    assert resp.status_code == 401, resp.text
    assert resp.json() == {
        "error": {
            "message": resp.json()["error"]["message"],
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    assert resp.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", f"Bearer {WRONG}", f"Basic {FILE_KEYS[0]}", FILE_KEYS[0],
     f"Bearer {FILE_KEYS[0]}x", f"Bearer {FILE_KEYS[0][:-1]}", f"Bearer {ENV_KEYS[0]},"],
)  # fmt: skip
async def test_missing_or_wrong_key_is_401(secured: Deployment, authorization: str | None) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1}
    async with httpx.AsyncClient() as http:
        for method, path in [("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                             ("GET", "/v1/models"), ("GET", "/v1/nothing-here"),
                             ("POST", "/tokenize"), ("POST", "/detokenize"),
                             ("GET", "/tokenizer_info")]:  # fmt: skip
            resp = await http.request(
                method, f"{secured.frontend_url}{path}", json=body, headers=headers
            )
            check_401(resp)
            assert WRONG not in resp.text and FILE_KEYS[0] not in resp.text


@pytest.mark.parametrize("key", [*FILE_KEYS, *ENV_KEYS])
async def test_every_key_from_file_and_env_works(secured: Deployment, key: str) -> None:
    oai = openai.AsyncOpenAI(base_url=f"{secured.frontend_url}/v1", api_key=key, max_retries=0)
    try:
        assert [m.id for m in (await oai.models.list()).data] == [MODEL]
        out = await oai.completions.create(model=MODEL, prompt="hi", max_tokens=2)
        assert out.choices[0].finish_reason in ("length", "stop")
        stream = await oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=True
        )
        assert [c async for c in stream]
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}) as http:
            tokens = await http.post(f"{secured.frontend_url}/tokenize", json={"prompt": "hi"})
            assert tokens.status_code == 200 and tokens.json()["count"] > 0
    finally:
        await oai.close()
    # Anthropic's clients send the key as x-api-key.
    async with anthropic.AsyncAnthropic(
        base_url=secured.frontend_url, api_key=key, max_retries=0
    ) as claude:
        ask: Any = [{"role": "user", "content": "hi"}]
        message = await claude.messages.create(model=MODEL, max_tokens=2, messages=ask)
        assert message.usage.output_tokens >= 1


async def test_anthropic_client_with_a_wrong_key_gets_authentication_error(
    secured: Deployment,
) -> None:
    async with anthropic.AsyncAnthropic(
        base_url=secured.frontend_url, api_key=WRONG, max_retries=0
    ) as claude:
        with pytest.raises(anthropic.AuthenticationError) as caught:
            ask: Any = [{"role": "user", "content": "hi"}]
            await claude.messages.create(model=MODEL, max_tokens=2, messages=ask)
    assert caught.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    assert WRONG not in str(caught.value.body)


async def test_openai_client_with_a_wrong_key_gets_authentication_error(
    secured: Deployment,
) -> None:
    oai = openai.AsyncOpenAI(base_url=f"{secured.frontend_url}/v1", api_key=WRONG, max_retries=0)
    try:
        with pytest.raises(openai.AuthenticationError) as raised:
            await oai.models.list()
        assert raised.value.code == "invalid_api_key"
    finally:
        await oai.close()


@pytest.mark.parametrize("path", ["/metrics", "/health", "/live"])
async def test_probe_paths_stay_open(secured: Deployment, path: str) -> None:
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{secured.frontend_url}{path}")).status_code == 200


async def test_keys_never_in_logs_or_command_line(secured: Deployment) -> None:
    async with httpx.AsyncClient() as http:  # some traffic to log about, good and bad
        for key in [WRONG, *FILE_KEYS, *ENV_KEYS]:
            await http.post(
                f"{secured.frontend_url}/v1/completions",
                content=b'{"model": 3}',
                headers={"Authorization": f"Bearer {key}"},
            )
    frontend = secured.procs[-1]
    command_line = " ".join(psutil.Process(frontend.pid).cmdline())
    log = (secured.tmp / "frontend.log").read_text()
    for secret in [WRONG, *FILE_KEYS, *ENV_KEYS]:
        for part in (secret, secret[-6:]):  # nor a recognisable piece of one
            assert part not in log and part not in command_line


async def test_bench_sends_the_key_it_finds(
    secured: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dynamoctl bench URL`` sends ``$OPENAI_API_KEY`` as OpenAI's clients do; without it
    every request is refused, so the key is what made the difference."""
    from rich.console import Console

    from dynamoctl.bench.runner import BenchConfig, run_bench
    from dynamoctl.bench.schedule import Limits

    config = BenchConfig(
        target=secured.frontend_url, model=MODEL, isl="8", osl="4", limits=Limits(4, 30.0)
    )
    quiet = Console(quiet=True)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    refused = (await run_bench(config, console=quiet)).runs[0].summary
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEYS[1])
    served = (await run_bench(config, console=quiet)).runs[0].summary
    assert (refused.completed, sum(refused.errors.values())) == (0, 4), refused.errors
    assert (served.completed, served.errors) == (4, {}), served.errors
