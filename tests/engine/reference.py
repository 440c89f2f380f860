"""The reference the engine is checked against: transformers' own greedy generation, and the
kernel paths (``engine.model.kernel_choice``) every engine test of it runs on."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.model.cpu_features import DISABLE_ONEDNN_ENV, CpuFeatures, probe_cpu
from engine.model.kernel_choice import choose_kernels

KERNEL_PATHS: dict[str, dict[str, str]] = {"oneDNN": {}, "portable": {DISABLE_ONEDNN_ENV: "1"}}
"""Each path's environment switches: oneDNN where this CPU has it, and the portable path
(``F.linear``, SDPA) that every CPU runs, forced on here even where oneDNN works."""

PAD = 0
"""Left padding's token id: masked out, so any id does."""


def cpu_for_path(path: str, dtype: torch.dtype) -> CpuFeatures:
    """This CPU's features with ``path``'s switches; skips, naming the missing feature, where the CPU lacks the path."""
    features = probe_cpu(KERNEL_PATHS[path])
    kernels = choose_kernels(torch.device("cpu"), dtype, features)
    if kernels.packed_linear != (path == "oneDNN"):
        pytest.skip(f"no {path} path here: {kernels.summary}")
    return features


def transformers_greedy(folder: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuations by transformers' ``generate`` on the float32 weights in ``folder``
    (the engine's converted HF folder), EOS not treated as a stop, like ``ignore_eos``. One batch,
    left-padded and masked: a fifth of the time of a ``generate`` per prompt (5 s against 23 s for
    ten prompts on a 2-core VM), with the same tokens (checked on both, 2026-12-03)."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
    model.generation_config.eos_token_id = None
    width = max(len(prompt) for prompt in prompts)
    padding = [width - len(prompt) for prompt in prompts]
    input_ids = torch.tensor([[PAD] * pad + prompt for pad, prompt in zip(padding, prompts, strict=True)])
    attention_mask = torch.tensor([[0] * pad + [1] * len(prompt) for pad, prompt in zip(padding, prompts, strict=True)])
    generated = model.generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=PAD
    )
    return [row[width:].tolist() for row in generated]
