"""The mocker's vision model: what its model card tells the frontend of images, and an
image prompt's placeholder runs checked and keyed by their images (what the block pool
hashes and the KV events carry, as the router keys it: :mod:`dynamoctl.kv.images`)."""

from __future__ import annotations

import msgspec

from dynamoctl.engines.api import GenerateRequest, RequestRejected
from dynamoctl.engines.mocker.config import MockerConfig
from dynamoctl.kv.images import keyed_token_ids
from dynamoctl.wire.engine import VisionTraits
from dynamoctl.wire.ids import packed

IMAGE_PLACEHOLDER = "<image>"
"""What the chat template is given for an image (the mocker's model has no template of
its own: any text works, as long as the messages' text does not contain it)."""


def vision_traits(cfg: MockerConfig) -> VisionTraits | None:
    """The model card's vision traits (None: the mocker takes no images)."""
    if not cfg.image_tokens:
        return None
    return VisionTraits(placeholder=IMAGE_PLACEHOLDER, token_id=cfg.image_token_id,
                        tokens_per_image=cfg.image_tokens, at_start=cfg.image_at_start)  # fmt: skip


def keyed(request: GenerateRequest, vision: VisionTraits | None) -> GenerateRequest:
    """An image prompt with its placeholders keyed by its images: what the block pool
    hashes and the KV events carry, as the router keys it (:mod:`dynamoctl.kv.images`)."""
    if vision is None:
        raise RequestRejected("this mocker takes no images (set image_tokens)")
    for image in request.images:
        run = list(request.token_ids[image.offset : image.offset + image.tokens])
        if image.tokens != vision.tokens_per_image or run != [vision.token_id] * image.tokens:
            raise RequestRejected(
                f"image at token {image.offset} is not a run of {vision.tokens_per_image} "
                f"placeholder ids {vision.token_id}"
            )
    keyed = keyed_token_ids(request.token_ids, request.images)
    return msgspec.structs.replace(request, token_ids=packed(keyed), images=[])
