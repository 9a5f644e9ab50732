"""Images in chat (docs/api.md, "Images") through the official ``openai`` client against
mocker workers that simulate a vision-language model (``--image-tokens``): image parts
as data URLs and as fetched URLs under an allowed prefix, their tokens in the usage,
KV reuse of equal text with equal images and none with another image (the router keys
each image's blocks, :mod:`dynamoctl.kv.images`), and every refusal a 400 naming the
part."""

from __future__ import annotations

import asyncio
import base64
import http.server
import io
import os
import random
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio
from PIL import Image

from tests.frontend.conftest import BLOCK, BLOCKS, Deployment

pytestmark = [pytest.mark.openai_compat, pytest.mark.asyncio(loop_scope="module")]

VLM = "mt-vision"
TEXT = "mt-text"
FIRST = "mt-vision-first"  # takes its images before the prompt, as BLIP-2
RUN = 48  # tokens per image: 3 blocks
MAX_IMAGES = 3
MAX_BYTES = 64 << 10


def png(seed: int, size: int = 24) -> bytes:
    rng = random.Random(seed)
    image = Image.new("RGB", (size, size))
    image.putdata([(rng.randrange(256), rng.randrange(256), rng.randrange(256))
                   for _ in range(size * size)])  # fmt: skip
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def data_url(data: bytes, kind: str = "image/png") -> str:
    return f"data:{kind};base64,{base64.b64encode(data).decode()}"


def chat(url: str, text: str = "What is in this picture?", **part: Any) -> list[Any]:
    return [
        {"role": "system", "content": "You describe pictures. " * 4},
        {"role": "user", "content": [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": url, **part}},
        ]},
    ]  # fmt: skip


@pytest.fixture(scope="module")
def image_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local HTTP server of images: ``/ok/`` is allowed to the frontend, ``/no/`` not."""
    root = Path(tmp_path_factory.mktemp("images"))
    for folder in ("ok", "no"):
        (root / folder).mkdir()
        (root / folder / "a.png").write_bytes(png(7))
    (root / "ok" / "big.png").write_bytes(os.urandom(MAX_BYTES + 1))

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def dep(
    tmp_path_factory: pytest.TempPathFactory, image_server: str
) -> AsyncIterator[Deployment]:
    dep = Deployment(Path(tmp_path_factory.mktemp("vision")))
    common = ["--block-size", str(BLOCK), "--num-gpu-blocks", str(BLOCKS), "--speedup-ratio", "50"]
    try:
        dep.spawn("worker-vlm", "worker", "--model", VLM, "--num-workers", "2", *common,
                  "--image-tokens", str(RUN), "--image-token-id", "5")  # fmt: skip
        dep.spawn("worker-text", "worker", "--model", TEXT, *common)
        dep.spawn("worker-first", "worker", "--model", FIRST, "--num-workers", "2", *common,
                  "--image-tokens",
                  str(RUN), "--image-token-id", "5", "--image-at-start")  # fmt: skip
        await dep.wait_for("worker", 5)
        await dep.start_frontend("--max-images", str(MAX_IMAGES), "--max-image-bytes",
                                 str(MAX_BYTES), "--image-fetch-prefixes",
                                 f"{image_server}/ok/")  # fmt: skip
        async with httpx.AsyncClient(base_url=dep.frontend_url) as http_client:
            for _ in range(100):
                if len((await http_client.get("/v1/models")).json()["data"]) == 3:
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


async def ask(client: openai.AsyncOpenAI, messages: list[Any], model: str = VLM, **kw: Any) -> Any:
    reply = await client.chat.completions.create(model=model, messages=messages, max_tokens=2, **kw)
    assert reply.usage is not None
    return reply.usage


async def test_image_tokens_are_prompt_tokens(client: openai.AsyncOpenAI) -> None:
    plain = await ask(client, [{"role": "user", "content": "What is in this picture?"}])
    one = await ask(client, chat(data_url(png(1))))
    two = await ask(client, [*chat(data_url(png(1))), {"role": "assistant", "content": "A cat."},
                             *chat(data_url(png(2)))[1:]])  # fmt: skip
    assert one.prompt_tokens >= plain.prompt_tokens + RUN
    assert two.prompt_tokens >= one.prompt_tokens + RUN


async def test_equal_images_share_blocks_other_images_do_not(client: openai.AsyncOpenAI) -> None:
    # Two workers: a repeat is cached only if the router sends it where its blocks are,
    # which it does only if it keys the blocks by the image as the worker does.
    for seed in (11, 12, 13):
        first = await ask(client, chat(data_url(png(seed))))
        again = await ask(client, chat(data_url(png(seed))))
        cached = again.prompt_tokens_details.cached_tokens
        assert cached == (again.prompt_tokens - 1) // BLOCK * BLOCK, (seed, first, again)
    other = await ask(client, chat(data_url(png(99))))
    # Same text, another image: only the blocks before the image's run are cached.
    prefix = other.prompt_tokens - RUN
    assert other.prompt_tokens_details.cached_tokens < prefix
    assert other.prompt_tokens_details.cached_tokens >= BLOCK  # the system text's blocks


async def test_streamed_and_fetched_images(client: openai.AsyncOpenAI, image_server: str) -> None:
    fetched = await ask(client, chat(f"{image_server}/ok/a.png"))
    inline = await ask(client, chat(data_url(png(7))))
    assert fetched.prompt_tokens == inline.prompt_tokens
    assert inline.prompt_tokens_details.cached_tokens > RUN  # the same image's blocks
    stream = await client.chat.completions.create(
        model=VLM, messages=chat(data_url(png(3))), max_tokens=3, stream=True
    )
    assert len([c async for c in stream]) >= 3


async def refused(client: openai.AsyncOpenAI, messages: list[Any], model: str = VLM) -> Any:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=model, messages=messages, max_tokens=2)
    body = caught.value.body
    assert isinstance(body, dict)
    return body


@pytest.mark.parametrize(
    ("url", "param", "words"),
    [
        ("https://example.com/a.png", "messages.1.content.1", "prefixes"),
        ("{server}/no/a.png", "messages.1.content.1", "prefixes"),
        ("{server}/ok/missing.png", "messages.1.content.1", "404"),
        ("{server}/ok/big.png", "messages.1.content.1", "larger than"),
        ("ftp://example.com/a.png", "messages.1.content.1", "data: or http"),
        ("data:image/png;base64,!!!", "messages.1.content.1", "base64"),
        ("data:text/plain;base64,aGk=", "messages.1.content.1", "data:image/"),
        (data_url(b"not a picture at all"), "messages.1.content.1", "not an image"),
        (data_url(bytes(MAX_BYTES + 1)), "messages.1.content.1", "larger than"),
    ],
    # Short ids, the same in every xdist worker (a parameter made at random was not).
    ids=[
        "https-unlisted",
        "prefix-unlisted",
        "fetch-404",
        "fetch-too-big",
        "ftp",
        "bad-base64",
        "not-image-mime",
        "not-an-image",
        "data-too-big",
    ],
)
async def test_bad_images_are_400s_naming_the_part(
    client: openai.AsyncOpenAI, image_server: str, url: str, param: str, words: str
) -> None:
    body = await refused(client, chat(url.replace("{server}", image_server)))
    assert body["param"] == param and words in body["message"], body


async def test_other_refusals(client: openai.AsyncOpenAI) -> None:
    image = data_url(png(5))
    many = [{"type": "image_url", "image_url": {"url": image}}] * (MAX_IMAGES + 1)
    body = await refused(client, [{"role": "user", "content": many}])
    assert body["param"] == "messages" and "at most 3" in body["message"]
    body = await refused(client, chat(image), model=TEXT)
    assert body["param"] == "messages.1.content.1" and "takes no images" in body["message"]
    body = await refused(client, chat(image, detail="high"))
    assert body["param"].startswith("messages.1.content") and "detail" in body["message"]
    body = await refused(client, chat(image, text="look: <image>"))
    assert body["param"] == "messages" and "placeholder" in body["message"]


async def test_tokenize_refuses_image_parts(dep: Deployment) -> None:
    async with httpx.AsyncClient(base_url=dep.frontend_url) as http_client:
        reply = await http_client.post("/tokenize", json={"model": VLM,
                                       "messages": chat(data_url(png(1)))})  # fmt: skip
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "messages.1.content"


async def test_images_before_the_prompt(client: openai.AsyncOpenAI) -> None:
    # A model that takes its images first: the runs lead the prompt, so another image
    # shares nothing, an equal one everything; the text is the template's alone. With no
    # text before the image, only a router that keys the image's blocks as the workers
    # do sends a repeat to the worker holding them (two workers: a router hashing bare
    # placeholders sees no overlap anywhere and picks either, so 6 repeats would all
    # land right by chance 1 time in 64).
    plain = await ask(client, [{"role": "user", "content": "What is in this picture?"}], FIRST)
    for seed in range(21, 27):
        first = await ask(client, chat(data_url(png(seed)), text="look: <image>"), FIRST)
        again = await ask(client, chat(data_url(png(seed)), text="look: <image>"), FIRST)
        assert first.prompt_tokens > plain.prompt_tokens + RUN  # the system text, too
        cached = again.prompt_tokens_details.cached_tokens
        assert cached == (first.prompt_tokens - 1) // BLOCK * BLOCK, seed
    other = await ask(client, chat(data_url(png(99)), text="look: <image>"), FIRST)
    assert other.prompt_tokens_details.cached_tokens == 0
