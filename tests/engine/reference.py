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


def cpu_for_path(path: str, dtype: torch.dtype) -> CpuFeatures:
    """This CPU's features with ``path``'s switches; skips, naming the missing feature, where the CPU lacks the path."""
    features = probe_cpu(KERNEL_PATHS[path])
    kernels = choose_kernels(torch.device("cpu"), dtype, features)
    if kernels.packed_linear != (path == "oneDNN"):
        pytest.skip(f"no {path} path here: {kernels.summary}")
    return features


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
