"""A tiny Llama with random weights for real-engine tests: built in about a second from
nothing but dynamoctl's own tokenizer corpus (nothing is downloaded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def build_tiny_llama(out: Path, vocab: int = 2048, hidden: int = 128, layers: int = 2) -> Path:
    """A Llama with random weights: BPE tokenizer trained on dynamoctl's own corpus, Llama 3's
    chat template, 2 layers of width 128, float32 safetensors. About a second."""
    import numpy as np
    from safetensors.numpy import save_file

    from dynamoctl.tokenizer.build_builtin import build_files

    out.mkdir(parents=True)
    files = build_files(vocab_size=vocab)
    ids = json.loads(files.pop("config.json"))
    for name, text in files.items():
        (out / name).write_text(text)
    heads, head_dim, inter = 2, hidden // 2, 2 * hidden
    rng = np.random.default_rng(0)

    def weight(*shape: int) -> Any:
        return rng.standard_normal(shape, dtype=np.float32) * 0.02

    ones = np.ones(hidden, np.float32)
    tensors = {
        "model.embed_tokens.weight": weight(vocab, hidden),
        "model.norm.weight": ones,
        "lm_head.weight": weight(vocab, hidden),
    }
    for i in range(layers):
        layer = f"model.layers.{i}."
        for proj in ("q", "k", "v"):
            tensors[f"{layer}self_attn.{proj}_proj.weight"] = weight(heads * head_dim, hidden)
        tensors[f"{layer}self_attn.o_proj.weight"] = weight(hidden, heads * head_dim)
        tensors[f"{layer}mlp.gate_proj.weight"] = weight(inter, hidden)
        tensors[f"{layer}mlp.up_proj.weight"] = weight(inter, hidden)
        tensors[f"{layer}mlp.down_proj.weight"] = weight(hidden, inter)
        tensors[f"{layer}input_layernorm.weight"] = ones
        tensors[f"{layer}post_attention_layernorm.weight"] = ones
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": head_dim,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": ids["bos_token_id"],
        "eos_token_id": ids["eos_token_id"],
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
