"""A LoRA adapter for the tiny Llama (``tiny_llama.py``), made with peft from random
weights: nothing is downloaded, nothing trained."""

from __future__ import annotations

from pathlib import Path


def build_tiny_lora(model_dir: Path, out: Path, rank: int = 8, seed: int = 0) -> Path:
    """A rank-``rank`` adapter on the attention projections of the Llama at ``model_dir``,
    both LoRA matrices random (``init_lora_weights=False``: the adapter changes outputs),
    saved as peft saves one (``adapter_config.json``, ``adapter_model.safetensors``)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    base = LlamaForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32)
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, config)
    with torch.no_grad():  # random B as well, scaled so the change shows in greedy tokens
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.normal_(0.0, 0.5)
    model.save_pretrained(str(out))
    return out
