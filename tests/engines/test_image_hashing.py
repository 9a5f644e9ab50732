"""Images in KV block identity (:mod:`dynamoctl.kv.images`): a mocker given image
prompts stores blocks keyed by the images, its events feed the router's index, and the
router's own keying of the same request finds exactly the blocks of equal text and equal
images, never those of equal text with another image."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import xxhash

from dynamoctl.engines.api import GenerateRequest, RequestRejected
from dynamoctl.kv.hashing import sequence_hashes
from dynamoctl.kv.images import keyed_token_ids
from dynamoctl.router.index import KvIndex
from dynamoctl.wire.engine import ImageInput, decode_request, encode

B = 4
RUN = 10  # tokens per image
PLACEHOLDER = 3
TEXT_BEFORE = [100 + i for i in range(9)]  # 2 full blocks + 1 token before the image
TEXT_AFTER = [200 + i for i in range(9)]


def image(data: bytes, offset: int = len(TEXT_BEFORE)) -> ImageInput:
    return ImageInput(data, xxhash.xxh3_64_intdigest(data), offset, RUN)


PROMPT = TEXT_BEFORE + [PLACEHOLDER] * RUN + TEXT_AFTER  # 28 tokens: 7 blocks
CAT, DOG = image(b"cat-pixels"), image(b"dog-pixels")


def route_hashes(images: list[ImageInput]) -> list[int]:
    """What the frontend's router hashes for ``PROMPT`` with ``images``."""
    return sequence_hashes(keyed_token_ids(PROMPT, images), B)


def test_keys_change_blocks_from_the_first_placeholder_on() -> None:
    plain, cat, dog = sequence_hashes(PROMPT, B), route_hashes([CAT]), route_hashes([DOG])
    assert cat == route_hashes([image(b"cat-pixels")])  # equal image, equal blocks
    assert cat[:2] == dog[:2] == plain[:2]  # text before the image shares
    # Block 2 holds the last text token and the image's first 3: it and all after differ.
    assert all(c != d and c != p for c, d, p in zip(cat[2:], dog[2:], plain[2:], strict=True))
    # Every block holding image tokens carries all 64 bits of the image hash.
    keyed = keyed_token_ids(PROMPT, [CAT])
    assert {keyed[9], keyed[10]} == {CAT.hash & 0xFFFFFFFF, CAT.hash >> 32}


def test_an_image_outside_the_prompt_is_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        keyed_token_ids(PROMPT[:12], [CAT])


async def test_mocker_events_and_router_keys_agree(make_mocker: Any) -> None:
    m = await make_mocker(block_size=B, num_gpu_blocks=64, image_tokens=RUN,
                          image_token_id=PLACEHOLDER)  # fmt: skip
    first = await m.run("a", PROMPT, 1, images=[CAT])
    assert first.cached == 0 and first.chunks[0].prompt_tokens == len(PROMPT)
    assert (await m.run("b", PROMPT, 1, images=[CAT])).cached == 24  # all but the last block
    assert (await m.run("c", PROMPT, 1, images=[DOG])).cached == 8  # the text before it
    index = KvIndex(B)
    index.add_worker("w0")
    for batch in m.batches:
        index.apply_batch("w0", batch)
    # The router, hashing the request as the frontend keys it, sees what the mocker holds.
    assert index.find_matches(route_hashes([CAT])) == {"w0": 7}
    assert index.find_matches(route_hashes([DOG])) == {"w0": 7}  # "c" stored its own
    assert index.find_matches(route_hashes([image(b"bird")])) == {"w0": 2}
    assert index.find_matches(sequence_hashes(PROMPT, B)) == {"w0": 2}  # no image: text only


async def test_mocker_refuses_images_it_cannot_take(make_mocker: Any) -> None:
    plain = await make_mocker(block_size=B, num_gpu_blocks=64)
    with pytest.raises(RequestRejected, match="takes no images"):
        await plain.run("a", PROMPT, 1, images=[CAT])
    vlm = await make_mocker(block_size=B, num_gpu_blocks=64, image_tokens=RUN,
                            image_token_id=PLACEHOLDER)  # fmt: skip
    with pytest.raises(RequestRejected, match="placeholder"):
        await vlm.run("b", PROMPT, 1, images=[image(b"x", offset=0)])


def test_images_travel_after_the_older_fields_on_the_wire() -> None:
    # Appended with a default: a text request carries one byte more (an empty array), and
    # a message from a peer that predates the field decodes with no images.
    at = GenerateRequest.__struct_fields__.index("images")
    assert at > GenerateRequest.__struct_fields__.index("pooling")
    request = GenerateRequest("r", [1, 2, 3], 4)
    fields = msgspec.msgpack.decode(encode(request))
    assert fields[at] == []
    assert decode_request(msgspec.msgpack.encode(fields[:at])).images == []
    with_image = msgspec.msgpack.decode(encode(GenerateRequest("r", [3] * RUN, 4, images=[CAT])))
    assert with_image[at] == [[b"cat-pixels", CAT.hash, len(TEXT_BEFORE), RUN]]


def test_the_frontend_routes_image_jobs_on_keyed_ids() -> None:
    from dynamoctl.frontend.generate import Job, with_images

    jobs = [Job(f"r-{i}", "m", GenerateRequest(f"r-{i}", list(PROMPT), 4)) for i in range(2)]
    with_images(jobs, [CAT])
    for job in jobs:
        assert job.engine.images == [CAT] and job.prompt_ids == PROMPT  # the engine's own ids
        assert job.route_ids is not None
        assert sequence_hashes(job.route_ids, B) == route_hashes([CAT])
