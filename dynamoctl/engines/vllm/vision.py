"""A vision-language model's images on vLLM (docs/engines.md, "Images"): the card's
:class:`VisionTraits` from the model's configuration, and a request's images as vLLM's
``multi_modal_data`` beside its token prompt.

The frontend sends the prompt with each image's placeholder run already expanded (its
length is the card's ``tokens_per_image``); vLLM's processor finds the run in place and
leaves it, so the prompt vLLM prefills is the one the router hashed. The card is only
set for a model whose image is a fixed number of tokens, LLaVA's shape (``image_token_index``
and a vision tower of ``image_size`` / ``patch_size``); a model whose count depends on the
image's size (Qwen2-VL) gets no card, so images are refused for it.
"""

from __future__ import annotations

import io
import logging
from typing import Any

from dynamoctl.wire.engine import GenerateRequest, VisionTraits

log = logging.getLogger(__name__)


def vision_traits(config: Any) -> VisionTraits | None:
    """What the model card says of a vision-language model (None: it takes no images)."""
    model = config.model_config
    if not getattr(model, "is_multimodal_model", False):
        return None
    hf = model.hf_config
    token_id = getattr(hf, "image_token_index", None) or getattr(hf, "image_token_id", None)
    tower = getattr(hf, "vision_config", None)
    if token_id is None or tower is None or getattr(hf, "model_type", "") != "llava":
        log.warning("model %s is multimodal but not LLaVA-shaped: images are refused",
                    model.model)  # fmt: skip
        return None
    patches = (int(tower.image_size) // int(tower.patch_size)) ** 2
    strategy = getattr(hf, "vision_feature_select_strategy", "default")
    tokens = patches if strategy == "default" else patches + 1  # "full" keeps CLS
    from transformers import AutoTokenizer  # only a vision model's worker loads it again

    tokenizer = AutoTokenizer.from_pretrained(model.tokenizer)
    placeholder = str(tokenizer.convert_ids_to_tokens(int(token_id)))
    return VisionTraits(placeholder=placeholder, token_id=int(token_id), tokens_per_image=tokens)


def multi_modal_fields(request: GenerateRequest) -> dict[str, Any]:
    """``TokensPrompt`` fields for ``request``'s images: the decoded images and their
    hashes as vLLM's ``multi_modal_uuids`` (its cache and KV block keys use them instead
    of hashing the pixels again)."""
    from PIL import Image

    images = []
    for image in request.images:
        with Image.open(io.BytesIO(image.data)) as opened:
            images.append(opened.convert("RGB"))
    return {
        "multi_modal_data": {"image": images},
        "multi_modal_uuids": {"image": [f"{image.hash:016x}" for image in request.images]},
    }
