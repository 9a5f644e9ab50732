"""A tiny BLIP-2 (a BLIP vision tower, a Q-Former and a small OPT) for vLLM's CPU build:
its configuration, tokenizer (the tiny Llama's plus ``<image>``), image processor and
processor files, built here in about a second; vLLM's ``--load-format dummy`` gives it
random weights, so nothing is downloaded. BLIP-2 rather than LLaVA: the pinned vLLM's
LLaVA (and Qwen2-VL) import torchvision, which the CPU install removes (docs/engines.md,
"Images")."""

from __future__ import annotations

import json
from pathlib import Path

from tests.engines.tiny_llama import build_tiny_llama

IMAGE_SIZE = 32
IMAGE_TOKENS = 8
"""Tokens per image: the Q-Former's queries."""


def build_tiny_blip2(out: Path) -> tuple[Path, int]:
    """The model directory and the ``<image>`` token's id."""
    build_tiny_llama(out)
    (out / "model.safetensors").unlink()  # the dummy loader makes every weight
    llama = json.loads((out / "config.json").read_text())
    image_id = llama["vocab_size"]
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    tokenizer["added_tokens"].append({"id": image_id, "content": "<image>", "single_word": False,
                                      "lstrip": False, "rstrip": False, "normalized": False,
                                      "special": True})  # fmt: skip
    (out / "tokenizer.json").write_text(json.dumps(tokenizer))
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    tok_config["added_tokens_decoder"][str(image_id)] = {
        "content": "<image>", "lstrip": False, "normalized": False, "rstrip": False,
        "single_word": False, "special": True,
    }  # fmt: skip
    tok_config["processor_class"] = "Blip2Processor"
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config))
    hidden = 64
    config = {
        "architectures": ["Blip2ForConditionalGeneration"],
        "model_type": "blip-2",
        "num_query_tokens": IMAGE_TOKENS,
        "image_token_index": image_id,
        "vision_config": {
            "model_type": "blip_2_vision_model", "hidden_size": hidden,
            "intermediate_size": 2 * hidden, "num_hidden_layers": 1, "num_attention_heads": 2,
            "image_size": IMAGE_SIZE, "patch_size": 8, "layer_norm_eps": 1e-6,
        },
        "qformer_config": {
            "model_type": "blip_2_qformer", "hidden_size": hidden,
            "intermediate_size": 2 * hidden, "num_hidden_layers": 1, "num_attention_heads": 2,
            "encoder_hidden_size": hidden, "cross_attention_frequency": 1,
            "vocab_size": 64, "max_position_embeddings": 64,
        },
        "text_config": {
            "model_type": "opt", "vocab_size": image_id + 1, "hidden_size": hidden,
            "ffn_dim": 2 * hidden, "num_hidden_layers": 2, "num_attention_heads": 2,
            "word_embed_proj_dim": hidden, "max_position_embeddings": 1024,
            "do_layer_norm_before": True, "bos_token_id": llama["bos_token_id"],
            "eos_token_id": llama["eos_token_id"][0], "pad_token_id": 0,
            "torch_dtype": "float32",
        },
        "torch_dtype": "float32",
    }  # fmt: skip
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "BlipImageProcessor", "do_resize": True,
        "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE}, "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True, "processor_class": "Blip2Processor",
    }))  # fmt: skip
    (out / "processor_config.json").write_text(json.dumps({
        "processor_class": "Blip2Processor", "num_query_tokens": IMAGE_TOKENS,
    }))  # fmt: skip
    return out, image_id
