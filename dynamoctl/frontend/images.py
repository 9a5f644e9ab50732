"""Images in chat (docs/api.md, "Images"): a request's ``image_url`` parts read, bounded
and checked, and its prompt built with each image as its run of placeholder tokens.

Read: a ``data:`` URL always; an ``http(s)`` URL only under a prefix the recipe allows
(``frontend.image_fetch_prefixes``), fetched with a timeout and a byte bound, redirects
not followed (a redirect could leave the allowed prefixes). Bounded: at most
``max_images`` per request and ``max_image_bytes`` per image. Checked: Pillow parses
each (on the tokenising threads: a large image is milliseconds), so a broken one is a
400 here rather than an engine's error later. Each 400 names the part,
``messages.N.content.M``.

Prompt: the chat template sees the model's placeholder text (:class:`VisionTraits`)
where each image part is; the rendered text is cut at each placeholder, the pieces are
tokenised and each image's run of ``tokens_per_image`` placeholder ids goes between
them, so the prompt's length is what the engine prefills (vLLM finds the run already
expanded and keeps it). A request without image parts never reaches this module.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

import httpx
import xxhash

from dynamoctl.frontend.errors import bad_request
from dynamoctl.frontend.protocol import ChatMessage
from dynamoctl.settings.images import ImageSettings
from dynamoctl.wire.engine import ImageInput, VisionTraits


@dataclass(frozen=True)
class ImagePart:
    """One ``image_url`` part of a request, where it is."""

    param: str
    """``messages.N.content.M``: what its 400s name."""
    url: str


def image_parts(messages: list[ChatMessage]) -> list[ImagePart]:
    """The request's image parts, in prompt order."""
    return [
        ImagePart(f"messages.{m}.content.{p}", url)
        for m, message in enumerate(messages)
        if isinstance(message.content, list)
        for p, url in message.image_urls()
    ]


class ImageReader:
    """Reads and checks image parts under a frontend's :class:`ImageSettings`."""

    def __init__(self, settings: ImageSettings, pool: Executor) -> None:
        self.settings = settings
        self.pool = pool
        self.prefixes = settings.fetch_prefixes()

    async def read(self, parts: list[ImagePart]) -> list[bytes]:
        """Each part's image file, checked; a 400 naming the part on any fault."""
        limit = self.settings.max_images
        if len(parts) > limit:
            raise bad_request(
                f"{len(parts)} images in one request; at most {limit} are taken (recipe "
                "field frontend.max_images, or dynamoctl frontend --max-images)",
                "messages",
            )
        files = [await self._bytes(part) for part in parts]
        loop = asyncio.get_running_loop()
        for part, data in zip(parts, files, strict=True):
            fault = await loop.run_in_executor(self.pool, _unreadable, data)
            if fault is not None:
                raise bad_request(f"{part.param}: not an image that can be read ({fault})",
                                  part.param)  # fmt: skip
        return files

    async def _bytes(self, part: ImagePart) -> bytes:
        url = part.url
        if url.startswith("data:"):
            return self._data_url(part)
        if url.startswith(("http://", "https://")):
            if not url.startswith(self.prefixes) or not self.prefixes:
                raise bad_request(
                    f"{part.param}: image URLs are fetched only from the prefixes the "
                    "deployment allows (recipe field frontend.image_fetch_prefixes; "
                    f"{'none set' if not self.prefixes else ', '.join(self.prefixes)}); "
                    "send the image as a data: URL",
                    part.param,
                )
            return await self._fetch(part)
        raise bad_request(f"{part.param}: an image URL is a data: or http(s): URL", part.param)

    def _data_url(self, part: ImagePart) -> bytes:
        head, comma, payload = part.url.partition(",")
        if not comma or not head.endswith(";base64") or not head[5:].startswith("image/"):
            raise bad_request(
                f"{part.param}: a data URL of an image is data:image/<type>;base64,<data>",
                part.param,
            )
        if len(payload) * 3 // 4 > self.settings.max_image_bytes + 2:
            raise self._too_large(part)
        try:
            data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request(f"{part.param}: the data URL is not valid base64",
                              part.param) from None  # fmt: skip
        if len(data) > self.settings.max_image_bytes:
            raise self._too_large(part)
        return data

    async def _fetch(self, part: ImagePart) -> bytes:
        limit, timeout = self.settings.max_image_bytes, self.settings.image_fetch_timeout
        chunks: list[bytes] = []
        size = 0
        try:
            async with (
                httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client,
                client.stream("GET", part.url) as reply,
            ):
                if reply.status_code != 200:
                    raise bad_request(f"{part.param}: fetching the image answered "
                                      f"{reply.status_code}", part.param)  # fmt: skip
                async for chunk in reply.aiter_bytes():
                    size += len(chunk)
                    if size > limit:
                        raise self._too_large(part)
                    chunks.append(chunk)
        except httpx.HTTPError as exc:
            raise bad_request(f"{part.param}: fetching the image failed: {exc!r}",
                              part.param) from None  # fmt: skip
        return b"".join(chunks)

    def _too_large(self, part: ImagePart) -> Exception:
        return bad_request(
            f"{part.param}: the image is larger than {self.settings.max_image_bytes} bytes "
            "(recipe field frontend.max_image_bytes)",
            part.param,
        )


def _unreadable(data: bytes) -> str | None:
    """Why Pillow cannot read ``data`` as an image; None when it can."""
    from PIL import Image  # only image requests pay for importing Pillow

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.verify()
    except Exception as exc:  # Pillow raises many kinds for broken files
        return f"{type(exc).__name__}: {exc}"
    return None


def placed_images(
    pieces_ids: Sequence[Sequence[int]], files: list[bytes], vision: VisionTraits
) -> tuple[list[int], list[ImageInput]]:
    """The prompt's ids: the text pieces' ids with each image's placeholder run between
    them (``pieces_ids`` has one more entry than ``files``), and the images as the
    engine gets them."""
    ids: list[int] = list(pieces_ids[0])
    images: list[ImageInput] = []
    run = vision.tokens_per_image
    for data, piece in zip(files, pieces_ids[1:], strict=True):
        images.append(ImageInput(data, xxhash.xxh3_64_intdigest(data), len(ids), run))
        ids += [vision.token_id] * run
        ids += piece
    return ids, images
