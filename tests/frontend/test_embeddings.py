"""``/v1/embeddings`` through the official ``openai`` client, against mocker workers
running embedding models (``--task embed``; docs/api.md, "Embeddings"): the SDK's
default base64 decoded equal to ``float``, every input form, ``dimensions`` where the
model allows it, usage, routing by load, and the refusals (400 naming the parameter,
counted in ``/metrics``)."""

from __future__ import annotations

import asyncio
import base64
import math
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import pytest_asyncio

from tests.frontend.conftest import BLOCK, BLOCKS, Deployment
from tests.frontend.test_refusals import requests_total

pytestmark = [pytest.mark.openai_compat, pytest.mark.asyncio(loop_scope="module")]

EMBED = "mt-embed"  # 48 dimensions, Matryoshka: may be shortened
FIXED = "mt-embed-fixed"  # 32 dimensions, not shortened
TEXT = "mt-text"  # a generative model beside them
DOCS = ["The cat sat on the mat.", "A cat is sitting on a mat.", "Stock markets fell today."]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def dep(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Deployment]:
    tmp = Path(tmp_path_factory.mktemp("embeddings"))
    dep = Deployment(tmp)
    common = ["--block-size", str(BLOCK), "--num-gpu-blocks", str(BLOCKS), "--speedup-ratio", "50"]
    try:
        dep.spawn("worker-embed", "worker", "--model", EMBED, "--num-workers", "2", *common,
                  "--task", "embed", "--embedding-size", "48", "--matryoshka")  # fmt: skip
        dep.spawn("worker-fixed", "worker", "--model", FIXED, *common, "--task", "embed",
                  "--embedding-size", "32")  # fmt: skip
        dep.spawn("worker-text", "worker", "--model", TEXT, *common)
        await dep.wait_for("worker", 4)
        await dep.start_frontend("--router-mode", "least-loaded")
        async with httpx.AsyncClient(base_url=dep.frontend_url) as http:
            for _ in range(100):  # every model's card seen
                if len((await http.get("/v1/models")).json()["data"]) == 3:
                    break
                await asyncio.sleep(0.1)
        yield dep
    finally:
        dep.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(dep: Deployment) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=f"{dep.frontend_url}/v1", api_key="unused", max_retries=0
    ) as client:
        yield client


async def post(dep: Deployment, **body: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=dep.frontend_url, timeout=30) as http:
        return await http.post("/v1/embeddings", json=body)


def norm(vector: list[float]) -> float:
    return math.sqrt(sum(x * x for x in vector))


async def test_sdk_default_base64_decodes_equal_to_float(client: openai.AsyncOpenAI) -> None:
    # The SDK asks for base64 unless told otherwise, and decodes it.
    packed = await client.embeddings.create(model=EMBED, input=DOCS[0])
    floats = await client.embeddings.create(model=EMBED, input=DOCS[0], encoding_format="float")
    assert packed.model == EMBED and packed.object == "list" and len(packed.data) == 1
    a, b = packed.data[0].embedding, floats.data[0].embedding
    assert len(a) == len(b) == 48
    assert np.allclose(a, np.asarray(b, dtype=np.float32), rtol=0, atol=0)  # float32 exact
    assert norm(b) == pytest.approx(1.0, abs=1e-6)
    assert packed.usage.prompt_tokens == floats.usage.prompt_tokens > 0
    assert packed.usage.total_tokens == packed.usage.prompt_tokens


async def test_raw_base64_is_little_endian_float32(dep: Deployment) -> None:
    floats = (await post(dep, model=EMBED, input=DOCS[1])).json()["data"][0]["embedding"]
    packed = (await post(dep, model=EMBED, input=DOCS[1], encoding_format="base64")).json()
    raw = base64.b64decode(packed["data"][0]["embedding"])
    assert len(raw) == 4 * 48
    assert np.frombuffer(raw, dtype="<f4").tolist() == np.asarray(floats, "<f4").tolist()


async def test_every_input_form_embeds_the_same_tokens_alike(
    client: openai.AsyncOpenAI, dep: Deployment
) -> None:
    many = await client.embeddings.create(model=EMBED, input=DOCS, encoding_format="float")
    assert [d.index for d in many.data] == [0, 1, 2]
    singles = [
        (await client.embeddings.create(model=EMBED, input=d, encoding_format="float"))
        for d in DOCS
    ]
    for one, got in zip(singles, many.data, strict=True):
        assert got.embedding == one.data[0].embedding  # deterministic, whatever the batch
    assert many.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    async with httpx.AsyncClient(base_url=dep.frontend_url, timeout=30) as http:
        ids = [
            (await http.post("/tokenize", json={"model": EMBED, "prompt": d})).json()["tokens"]
            for d in DOCS[:2]
        ]
    one_list = await client.embeddings.create(model=EMBED, input=ids[0], encoding_format="float")
    lists = await client.embeddings.create(model=EMBED, input=ids, encoding_format="float")
    assert one_list.data[0].embedding == singles[0].data[0].embedding
    assert [d.embedding for d in lists.data] == [s.data[0].embedding for s in singles[:2]]
    # Equal tokens, equal vectors; inputs that share words point more alike.
    cats, stocks = (np.asarray(s.data[0].embedding) for s in (singles[1], singles[2]))
    first = np.asarray(singles[0].data[0].embedding)
    assert float(first @ cats) > float(first @ stocks)


async def test_dimensions_shorten_a_matryoshka_model_only(
    client: openai.AsyncOpenAI, dep: Deployment
) -> None:
    full = await client.embeddings.create(model=EMBED, input=DOCS[0], encoding_format="float")
    short = await client.embeddings.create(
        model=EMBED, input=DOCS[0], dimensions=16, encoding_format="float"
    )
    vector = short.data[0].embedding
    assert len(vector) == 16 and norm(vector) == pytest.approx(1.0, abs=1e-6)
    head = np.asarray(full.data[0].embedding[:16])
    assert np.allclose(vector, head / np.linalg.norm(head), atol=1e-6)  # the first 16, renormed
    same = await client.embeddings.create(model=FIXED, input=DOCS[0], dimensions=32)
    assert len(same.data[0].embedding) == 32  # its own size is always fine
    for model, dimensions in ((FIXED, 16), (EMBED, 49)):
        refused = await post(dep, model=model, input="x", dimensions=dimensions)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == "dimensions"


async def test_refusals_name_their_parameter_and_are_counted(dep: Deployment) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"model": TEXT, "input": "hi"}, "model"),
        ({"model": EMBED, "input": ""}, "input"),
        ({"model": EMBED, "input": []}, "input"),
        ({"model": EMBED, "input": ["a", ""]}, "input.1"),
        ({"model": EMBED, "input": "hi", "encoding_format": "int8"}, "encoding_format"),
        ({"model": EMBED, "input": "hi", "truncate_prompt_tokens": 8}, "truncate_prompt_tokens"),
        ({"model": EMBED, "input": "hi", "bogus": 1}, "bogus"),
        ({"model": EMBED, "input": [10**6]}, "input"),
        ({"model": EMBED, "input": ["x"] * 10_000}, "input"),
        ({"model": EMBED, "input": "hi " * 20_000}, "input"),
    ]
    for body, param in cases:
        refused = await post(dep, **body)
        assert refused.status_code == 400, (body, refused.text)
        error = refused.json()["error"]
        assert error["param"] == param, (body, error)
        assert "Value error" not in error["message"]
    neutral = await post(dep, model=EMBED, input="hi", use_activation=True, embed_dtype="float32")
    assert neutral.status_code == 200, neutral.text
    async with httpx.AsyncClient(base_url=dep.frontend_url, timeout=30) as http:
        chat = await http.post(
            "/v1/chat/completions",
            json={"model": EMBED, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert chat.status_code == 400 and chat.json()["error"]["param"] == "model"
        counts = requests_total((await http.get("/metrics")).text)
    assert counts[("", "embeddings", "400")] >= len(cases)
    assert counts[(EMBED, "embeddings", "200")] >= 1


async def test_routed_by_load_over_both_workers(dep: Deployment) -> None:
    before = await worker_requests(dep)
    replies = await asyncio.gather(*(post(dep, model=EMBED, input=DOCS * 4) for _ in range(8)))
    assert all(r.status_code == 200 for r in replies)
    after = await worker_requests(dep)
    served = {k: after[k] - before.get(k, 0) for k in after}
    assert len(served) == 2 and sum(served.values()) == 8 * 12, served
    assert all(n > 0 for n in served.values()), served  # least-loaded spreads them


async def worker_requests(dep: Deployment) -> dict[str, float]:
    """Requests each embedding worker took, by instance (its process's ``/metrics``)."""
    urls = {r.metrics_url for r in await dep.records("worker") if r.metrics_url}
    out: dict[str, float] = {}
    async with httpx.AsyncClient(timeout=30) as http:
        for url in urls:
            for line in (await http.get(url)).text.splitlines():
                found = SERIES.match(line)
                if found and found["model"] == EMBED:
                    out[found["instance"]] = float(found["value"])
    return out


SERIES = re.compile(
    r'dynamoctl_worker_requests_total\{instance="(?P<instance>[^"]+)",.*model="(?P<model>[^"]+)"'
    r".*\} (?P<value>\S+)"
)
