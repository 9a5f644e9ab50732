"""Image content in block identity: a prompt's ids with each image's placeholder run
replaced by ids drawn from the image's hash, so that :mod:`dynamoctl.kv.hashing` gives
the blocks an image overlaps an identity of their text *and* the image.

This is how the router (the request's ids to pick on) and the mocker (the ids its block
pool and KV events hash) agree on an image prompt's blocks with no change to the hash
function or to what a picker is given: equal text with different images never shares a
block past the first placeholder, equal text with equal images does, and the text
before the first image shares as any prefix does. A block's hash then mixes in the
image hashes it overlaps, as vLLM's per-block ``extra_keys`` do.

Each placeholder position gets one 32-bit half of the image's 64-bit hash, the halves
alternating, so a block that holds two or more of an image's tokens carries all 64 bits
(the position in the chain tells the halves' order apart). A prompt without images is
never copied: callers only call this when :attr:`GenerateRequest.images` is non-empty.
"""

from __future__ import annotations

from collections.abc import Sequence

from dynamoctl.wire.engine import ImageInput

_LOW = 0xFFFFFFFF


def keyed_token_ids(token_ids: Sequence[int], images: Sequence[ImageInput]) -> list[int]:
    """``token_ids`` with each image's placeholder run replaced by its hash's halves.

    Raises ``ValueError`` if an image's run lies outside ``token_ids``."""
    keyed = list(token_ids)
    for image in images:
        start, end = image.offset, image.offset + image.tokens
        if start < 0 or end > len(keyed):
            raise ValueError(
                f"image at tokens {start}..{end} lies outside a prompt of {len(keyed)} tokens"
            )
        halves = (image.hash & _LOW, (image.hash >> 32) & _LOW)
        keyed[start:end] = [halves[i & 1] for i in range(image.tokens)]
    return keyed
