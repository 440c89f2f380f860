"""Llama-family variants (tiny random models saved as HF folders) against transformers' ``generate``.

Each variant exercises a code path SmolLM2 does not: untied LM head with llama3 rope scaling,
Qwen2's Q/K/V bias, Mistral's sliding window (smaller than the sequences here).
"""

import logging
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, PretrainedConfig, Qwen2Config

from engine.model.model_runner import TorchModelRunner
from tests.engine.reference import KERNEL_PATHS, cpu_for_path
from tests.engine.runner_driver import generate

torch.set_num_threads(2)

MAX_TOKENS = 16
SHAPE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    initializer_range=0.3,
)
VARIANTS: dict[str, PretrainedConfig] = {
    "llama3-rope-untied": LlamaConfig(
        **SHAPE,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "qwen2-qkv-bias": Qwen2Config(**SHAPE, tie_word_embeddings=True),
    "mistral-sliding-window": MistralConfig(**SHAPE, sliding_window=8, tie_word_embeddings=False),
}
PROMPTS = [[5, 17, 42, 99, 3, 64, 21, 8, 77, 12, 31], [100, 2, 56, 9, 14, 88], [7, 7, 120, 45, 33, 19, 60, 2, 90]]


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request, tmp_path_factory) -> tuple[Path, list[list[int]]]:
    """An HF folder with random weights (biases too) and transformers' greedy outputs for it."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(VARIANTS[request.param], attn_implementation="sdpa").eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(std=0.5)
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    model.generation_config.eos_token_id = None
    expected = [
        model.generate(torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False)[0, len(prompt) :].tolist()
        for prompt in PROMPTS
    ]
    return folder, expected


@pytest.mark.parametrize("path", list(KERNEL_PATHS))
def test_batched_chunked_generation_matches_transformers(variant, path: str, caplog: pytest.LogCaptureFixture) -> None:
    folder, expected = variant
    with caplog.at_level(logging.INFO, logger="engine.model.model_runner"):
        runner = TorchModelRunner(str(folder), block_size=4, num_blocks=64, cpu=cpu_for_path(path, torch.float32))
    choice = [record.getMessage() for record in caplog.records if record.getMessage().startswith("kernels:")]
    assert choice == [runner.model.kernels.summary], "the choice is logged once, in one line"
    assert ("oneDNN-packed" in choice[0]) == (path == "oneDNN")
    result = generate(runner, PROMPTS, MAX_TOKENS, chunk_size=5, arrive_every=1)
    assert result.outputs == expected
