"""The runner with ``device="cuda"``: greedy equality with transformers on the same GPU, prefix
reuse, fp8 KV. Runs wherever ``torch.cuda.is_available()``; skipped (with the reason) elsewhere."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.model.flashinfer_attention import flashinfer_available
from engine.model.model_runner import TorchModelRunner
from normalize.model_files import resolve_model, tokenizer_dir
from tests.engine.runner_driver import generate

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")

MODEL = "smollm2-135m"
BLOCK_SIZE = 16
MAX_TOKENS = 24
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "def fibonacci(n):",
    "Here is a list of fruits: apple, banana,",
]


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir(resolve_model(MODEL)))
    return [tokenizer(text)["input_ids"] for text in PROMPTS]


@pytest.fixture(scope="module")
def runner() -> TorchModelRunner:
    return TorchModelRunner(MODEL, BLOCK_SIZE, num_blocks=256, device="cuda")


@pytest.fixture(scope="module")
def expected(prompts: list[list[int]]) -> list[list[int]]:
    """transformers' float32 greedy continuations, computed on the same GPU."""
    folder = resolve_model(MODEL).cache_dir / "hf"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").cuda()
    model.generation_config.eos_token_id = None
    outputs = []
    for prompt in prompts:
        generated = model.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=MAX_TOKENS, do_sample=False)
        outputs.append(generated[0, len(prompt) :].tolist())
    return outputs


def test_runner_keeps_its_tensors_on_the_gpu(runner: TorchModelRunner) -> None:
    assert runner.kv_cache.pool.device.type == "cuda"
    assert runner.model.embed.device.type == "cuda"
    assert runner.attention_backend == "portable"


def test_bfloat16_runs_flashinfer_where_installed_and_mostly_agrees(prompts, expected) -> None:
    bf16 = TorchModelRunner(MODEL, BLOCK_SIZE, num_blocks=256, device="cuda", dtype="bfloat16")
    assert bf16.attention_backend == ("flashinfer" if flashinfer_available() else "portable")
    for result in (generate(bf16, prompts, 2), generate(bf16, prompts, 2, chunk_size=3, arrive_every=2)):
        agreeing = sum(out[0] == ref[0] for out, ref in zip(result.outputs, expected, strict=True))
        assert agreeing >= len(prompts) - 1


def test_greedy_matches_transformers_on_the_gpu(runner, prompts, expected) -> None:
    assert generate(runner, prompts, MAX_TOKENS).outputs == expected


def test_chunked_prefill_with_decodes_matches_transformers(runner, prompts, expected) -> None:
    result = generate(runner, prompts, MAX_TOKENS, chunk_size=3, arrive_every=2)
    assert result.mixed_steps > 0
    assert result.outputs == expected


def test_prefix_blocks_reused_match_transformers(runner, prompts, expected) -> None:
    free = list(range(runner.num_blocks))
    long_prompts = [prompt * 4 for prompt in prompts]
    cold = generate(runner, long_prompts, 8, free_blocks=free)
    reuse = []
    for prompt, table in zip(long_prompts, cold.block_tables, strict=True):
        full_blocks = (len(prompt) - 1) // BLOCK_SIZE
        assert full_blocks > 0
        reuse.append((table[:full_blocks], full_blocks * BLOCK_SIZE))
    warm = generate(runner, long_prompts, 8, reuse=reuse, free_blocks=free)
    assert warm.outputs == cold.outputs


def test_fp8_kv_cache_stays_close(prompts, expected) -> None:
    fp8 = TorchModelRunner(MODEL, BLOCK_SIZE, num_blocks=256, device="cuda", kv_cache_dtype="fp8")
    assert fp8.attention_backend == "portable"
    result = generate(fp8, prompts, 4)
    agreeing = sum(out[:4] == ref[:4] for out, ref in zip(result.outputs, expected, strict=True))
    assert agreeing >= len(prompts) - 1
