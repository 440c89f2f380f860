"""Make a small LoRA adapter for the bundled SmolLM2 in PEFT's own format, for tests.

The adapter is created with ``peft`` (so its files are exactly what users download: an
``adapter_config.json`` and ``adapter_model.safetensors``), with ``lora_B`` filled with random
values instead of PEFT's zeros, so the adapter really changes the model's output.
"""

from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from engine.model.loader import load_model
from normalize.model_files import resolve_model

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def base_model_folder(model: str = "smollm2-135m") -> Path:
    """The HF folder of float32 weights the engine loads ``model`` from (converted once from GGUF)."""
    load_model(model)
    source = resolve_model(model)
    return source.hf_dir if source.hf_dir is not None else source.cache_dir / "hf"


def make_lora_adapter(
    target: Path,
    *,
    seed: int,
    rank: int = 8,
    alpha: int = 16,
    scale: float = 0.1,
    target_modules: tuple[str, ...] = DEFAULT_TARGETS,
    model: str = "smollm2-135m",
) -> Path:
    """Write a PEFT LoRA adapter for ``model`` into ``target`` and return ``target``.

    ``seed`` picks the weights; ``scale`` is the standard deviation of ``lora_B`` (large enough
    that greedy output differs from the base model within a few tokens).
    """
    base = AutoModelForCausalLM.from_pretrained(base_model_folder(model), dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(target_modules), lora_dropout=0.0)
    torch.manual_seed(seed)
    peft_model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)
    peft_model.save_pretrained(target)
    return target
