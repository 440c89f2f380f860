"""TorchModelRunner on the bundled SmolLM2 against transformers' own ``generate`` (float32 greedy),
on each kernel path (``tests.engine.reference.KERNEL_PATHS``)."""

import pytest
import torch
from transformers import AutoTokenizer

from engine.core.config import AUTO_DTYPE
from engine.model.cpu_features import CpuFeatures
from engine.model.model_runner import TorchModelRunner
from engine.model.runner_api import SamplingParams, SeqChunk
from normalize.model_files import resolve_model, tokenizer_dir
from tests.engine.reference import KERNEL_PATHS, cpu_for_path, transformers_greedy
from tests.engine.runner_driver import generate

torch.set_num_threads(2)

MODEL = "smollm2-135m"
BLOCK_SIZE = 4
MAX_TOKENS = 32
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
    "My favourite recipe for a rainy Sunday afternoon is",
    "In 1969, the first humans",
    "Here is a list of fruits: apple, banana,",
    "The quick brown fox jumps over the",
    "To train a neural network, you first need to",
]


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir(resolve_model(MODEL)))
    return [tokenizer(text)["input_ids"] for text in PROMPTS]


@pytest.fixture(scope="module", params=list(KERNEL_PATHS))
def cpu(request: pytest.FixtureRequest) -> CpuFeatures:
    return cpu_for_path(request.param, torch.float32)


@pytest.fixture(scope="module")
def runner(cpu: CpuFeatures) -> TorchModelRunner:
    return TorchModelRunner(MODEL, block_size=BLOCK_SIZE, num_blocks=1024, cpu=cpu)


@pytest.fixture(scope="module")
def expected(prompts: list[list[int]]) -> list[list[int]]:
    """transformers' greedy continuations (EOS not treated as a stop, like ``ignore_eos``)."""
    return transformers_greedy(resolve_model(MODEL).cache_dir / "hf", prompts, MAX_TOKENS)


def test_cold_batched_prefill_and_decode_match_transformers(runner, prompts, expected) -> None:
    assert runner.model.kernels.matmul_prefill == runner.model.kernels.packed_linear
    result = generate(runner, prompts, MAX_TOKENS)
    assert result.outputs == expected


def test_warm_prefix_blocks_reused_match_transformers(runner, prompts, expected) -> None:
    free = list(range(runner.num_blocks))
    cold = generate(runner, prompts, MAX_TOKENS, free_blocks=free)
    reuse = []
    for prompt, table in zip(prompts, cold.block_tables, strict=False):
        full_blocks = (len(prompt) - 1) // BLOCK_SIZE
        assert full_blocks > 0
        reuse.append((table[:full_blocks], full_blocks * BLOCK_SIZE))
    warm = generate(runner, prompts, MAX_TOKENS, reuse=reuse, free_blocks=free)
    assert warm.outputs == expected


def test_chunked_prefill_mixed_with_decodes_matches_transformers(runner, prompts, expected) -> None:
    result = generate(runner, prompts, MAX_TOKENS, chunk_size=3, arrive_every=2)
    assert result.mixed_steps > 0
    assert result.outputs == expected


def test_fp8_kv_cache_stays_close_to_float32(cpu, runner, prompts, expected) -> None:
    fp8_runner = TorchModelRunner(
        MODEL, block_size=BLOCK_SIZE, num_blocks=runner.num_blocks, kv_cache_dtype="fp8", cpu=cpu
    )
    fp8 = generate(fp8_runner, prompts, 8)
    exact = generate(runner, prompts, 8)
    assert sum(out[:4] == ref[:4] for out, ref in zip(fp8.outputs, expected, strict=False)) >= len(prompts) - 2
    table = torch.tensor(exact.block_tables[0])
    assert fp8.block_tables[0] == exact.block_tables[0]
    with torch.inference_mode():
        for layer in range(fp8_runner.model.num_layers):
            for reference, quantized in zip(
                runner.kv_cache.read(layer, table), fp8_runner.kv_cache.read(layer, table), strict=False
            ):
                assert (quantized - reference).norm() <= 0.1 * reference.norm()


@pytest.mark.parametrize("path", list(KERNEL_PATHS))
def test_bfloat16_mostly_agrees_but_is_not_greedy_identical(path: str, prompts, expected) -> None:
    """bfloat16 runs on each path (the portable one on every CPU), its first tokens mostly agree,
    and its 32-token output differs from transformers': the measurement behind ``--dtype auto``."""
    cpu = cpu_for_path(path, torch.bfloat16)
    bf16_runner = TorchModelRunner(MODEL, block_size=BLOCK_SIZE, num_blocks=512, dtype="bfloat16", cpu=cpu)
    assert bf16_runner.model.kernels.packed_linear == (path == "oneDNN")
    result = generate(bf16_runner, prompts, MAX_TOKENS)
    agreeing = sum(out[0] == ref[0] for out, ref in zip(result.outputs, expected, strict=True))
    assert agreeing >= len(prompts) - 2
    assert result.outputs != expected, "bfloat16 became greedy-identical here: --dtype auto could choose it"
    assert AUTO_DTYPE == "float32"


def test_seeded_sampling_repeats_when_a_sequence_is_recomputed(runner, prompts) -> None:
    sampling = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1234)
    first = generate(runner, prompts[:3], 8, sampling=sampling)
    for prompt, output in zip(prompts[:3], first.outputs, strict=False):
        recomputed = prompt + output[:5]
        table = list(range(-(-len(recomputed) // BLOCK_SIZE)))
        chunk = SeqChunk(0, recomputed, 0, table, True, sampling, num_generated=5)
        assert runner.execute([chunk]) == [output[5]]
    reseeded = generate(runner, prompts[:3], 8, sampling=SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=99))
    assert reseeded.outputs != first.outputs
