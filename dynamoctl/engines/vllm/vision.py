"""A vision-language model's images on vLLM (docs/engines.md, "Images"): the card's
:class:`VisionTraits` from the model's configuration, and a request's images as vLLM's
``multi_modal_data`` beside its token prompt.

The frontend's prompt holds each image as its full run of placeholder ids, so that the
router hashes (and ``usage`` counts) what the engine prefills. The pinned vLLM (0.32)
expands images itself even in a token prompt, so the run is given back to it in the form
its processor expects, and it comes out the same length:

* **insertion** (BLIP-2, PaliGemma): vLLM inserts the image's tokens at the start of the
  prompt; the card says ``at_start``, the frontend puts the runs first, and the worker
  removes them before vLLM inserts them again;
* **replacement** (LLaVA): vLLM replaces each single ``<image>`` token by the run; the
  worker collapses each run to one token.

Only models whose image is a fixed number of tokens get a card: BLIP-2 (its Q-Former's
``num_query_tokens``) and LLaVA (``image_size / patch_size`` squared). The pinned vLLM's
LLaVA and Qwen2-VL import torchvision, which the CPU install removes, so on CPU BLIP-2 is
the one that runs; any other multimodal model gets no card and its images are refused.
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass
from typing import Any

from dynamoctl.wire.engine import GenerateRequest, VisionTraits

log = logging.getLogger(__name__)

INSERTING = frozenset({"blip-2"})
"""Model types whose vLLM processor inserts the image tokens at the prompt's start."""


@dataclass(frozen=True)
class VisionModel:
    traits: VisionTraits
    inserts: bool
    """vLLM inserts each image's run itself (removed from the prompt it is given); else it
    expands one placeholder token into the run."""


def vision_model(config: Any) -> VisionModel | None:
    """The model's image facts (None: it takes no images here)."""
    model = config.model_config
    if not getattr(model, "is_multimodal_model", False):
        return None
    hf = model.hf_config
    kind = getattr(hf, "model_type", "")
    token_id = getattr(hf, "image_token_index", None)
    if kind in INSERTING and token_id is not None:
        tokens = int(hf.num_query_tokens)
    elif kind == "llava" and token_id is not None:
        patches = (int(hf.vision_config.image_size) // int(hf.vision_config.patch_size)) ** 2
        full = getattr(hf, "vision_feature_select_strategy", "default") == "full"
        tokens = patches + 1 if full else patches  # "full" keeps the CLS token
    else:
        log.warning("model %s (%s) is multimodal, but its images are not a fixed number of "
                    "tokens dynamoctl knows: images are refused", model.model, kind)  # fmt: skip
        return None
    from transformers import AutoTokenizer  # only a vision model's worker loads it again

    placeholder = str(AutoTokenizer.from_pretrained(model.tokenizer).convert_ids_to_tokens(
        int(token_id)))  # fmt: skip
    traits = VisionTraits(placeholder=placeholder, token_id=int(token_id),
                          tokens_per_image=tokens, at_start=kind in INSERTING)  # fmt: skip
    return VisionModel(traits, inserts=kind in INSERTING)


def prompt_fields(request: GenerateRequest, vision: VisionModel | None) -> dict[str, Any]:
    """``TokensPrompt`` fields for an image prompt: its ids as vLLM's processor takes them,
    the decoded images, and their hashes as ``multi_modal_uuids`` (vLLM's cache and KV
    block keys use them instead of hashing the pixels again). Raises ``ValueError``."""
    from PIL import Image

    if vision is None:
        raise ValueError("this model takes no images")
    ids: list[int] = []
    at = 0
    for image in request.images:
        run = list(request.token_ids[image.offset : image.offset + image.tokens])
        if run != [vision.traits.token_id] * vision.traits.tokens_per_image:
            raise ValueError(f"image at token {image.offset} is not a placeholder run")
        ids += request.token_ids[at : image.offset]
        if not vision.inserts:
            ids.append(vision.traits.token_id)
        at = image.offset + image.tokens
    ids += request.token_ids[at:]
    pictures = []
    for image in request.images:
        with Image.open(io.BytesIO(image.data)) as opened:
            pictures.append(opened.convert("RGB"))
    return {
        "prompt_token_ids": ids,
        "multi_modal_data": {"image": pictures},
        "multi_modal_uuids": {"image": [f"{image.hash:016x}" for image in request.images]},
    }
