"""The reference the engine is checked against: transformers' own greedy generation."""

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM


def transformers_greedy(folder: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuations by transformers' ``generate`` on the float32 weights in ``folder``
    (the engine's converted HF folder), EOS not treated as a stop, like ``ignore_eos``."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
    model.generation_config.eos_token_id = None
    outputs = []
    for prompt in prompts:
        generated = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False)
        outputs.append(generated[0, len(prompt) :].tolist())
    return outputs
