"""fp8 KV (e4m3, one scale per block) where blocks are shared or filled in pieces, and a server run with it.

A full block that a later sequence reuses must not change (the prefix cache hands the same block
to every sequence with that prefix); a block filled by several prefill chunks is re-quantized at
each one, and must still hold what one quantization of the whole block would.
"""

import json
import urllib.request
from collections.abc import Iterator

import openai
import pytest
import torch
from transformers import AutoTokenizer

from engine.cli import build_parser, config_from_args
from engine.core.kv_budget import plan_kv_budget
from engine.model.kv_cache import Fp8PagedKVCache
from engine.model.model_runner import TorchModelRunner
from normalize.model_files import resolve_model, tokenizer_dir
from planner.load import load_arch
from tests.engine.runner_driver import generate
from tests.procs import ManagedProcess, start_engine

torch.set_num_threads(2)

MODEL = "smollm2-135m"
BLOCK_SIZE = 4
NUM_BLOCKS = 256
LAYERS_CHECKED = (0, 15, 29)
"""First, middle and last of SmolLM2-135M's 30 layers."""
NEW_TOKENS = 4
PROMPTS = [
    "Once upon a time, in a small village by the sea, there lived",
    "Here is a list of fruits: apple, banana,",
    "To train a neural network, you first need to",
]


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir(resolve_model(MODEL)))
    return [tokenizer(text)["input_ids"] for text in PROMPTS]


@pytest.fixture(scope="module")
def fp8_runner() -> TorchModelRunner:
    return TorchModelRunner(MODEL, block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS, kv_cache_dtype="fp8")


def block_contents(runner: TorchModelRunner, blocks: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Raw fp8 bytes and scales of ``blocks`` in every layer (copies)."""
    cache = runner.kv_cache
    assert isinstance(cache, Fp8PagedKVCache)
    index = torch.tensor(blocks)
    return [
        (cache.pool[layer][:, index].view(torch.uint8).clone(), cache.scales[layer][:, index].clone())
        for layer in range(runner.model.num_layers)
    ]


def agreeing(outputs: list[list[int]], reference: list[list[int]], tokens: int = 4) -> int:
    return sum(out[:tokens] == ref[:tokens] for out, ref in zip(outputs, reference, strict=True))


def test_fp8_prefix_reuse_reads_shared_blocks_without_changing_them(
    fp8_runner: TorchModelRunner, prompts: list[list[int]]
) -> None:
    free = list(range(NUM_BLOCKS))
    cold = generate(fp8_runner, prompts, NEW_TOKENS, free_blocks=free)
    reuse = [
        (table[: (len(prompt) - 1) // BLOCK_SIZE], (len(prompt) - 1) // BLOCK_SIZE * BLOCK_SIZE)
        for prompt, table in zip(prompts, cold.block_tables, strict=True)
    ]
    shared = [block for blocks, _ in reuse for block in blocks]
    assert len(shared) >= 2 * len(prompts), "every prompt holds two full blocks or more"
    before = block_contents(fp8_runner, shared)
    warm = generate(fp8_runner, prompts, NEW_TOKENS, reuse=reuse, free_blocks=free)
    after = block_contents(fp8_runner, shared)
    for (bytes_before, scales_before), (bytes_after, scales_after) in zip(before, after, strict=True):
        assert torch.equal(bytes_before, bytes_after) and torch.equal(scales_before, scales_after)
    assert agreeing(warm.outputs, cold.outputs) >= len(prompts) - 1, "the warm run reads the cold run's KV"


def test_fp8_chunked_prefill_requantizes_blocks_without_drift(
    fp8_runner: TorchModelRunner, prompts: list[list[int]]
) -> None:
    """Chunks of 3 tokens fill blocks of 4, so most blocks are re-quantized two or three times; they
    end up holding what the one-piece prefill of the same prompts wrote. The second prompt arrives
    at step 4, while the first one finishes its prefill and decodes, so steps mix prefill chunks with decodes."""
    prompts = prompts[:2]
    whole = generate(fp8_runner, prompts, 2)
    with torch.inference_mode():
        whole_kv = [
            [
                fp8_runner.kv_cache.read(layer, torch.tensor(table[: len(prompt) // BLOCK_SIZE]))
                for layer in LAYERS_CHECKED
            ]
            for prompt, table in zip(prompts, whole.block_tables, strict=True)
        ]
    chunked = generate(fp8_runner, prompts, 2, chunk_size=3, arrive_every=4)
    assert chunked.mixed_steps > 0
    assert agreeing(chunked.outputs, whole.outputs) >= len(prompts) - 1
    with torch.inference_mode():
        for prompt, table, reference_layers in zip(prompts, chunked.block_tables, whole_kv, strict=True):
            blocks = torch.tensor(table[: len(prompt) // BLOCK_SIZE])
            for layer, reference in zip(LAYERS_CHECKED, reference_layers, strict=True):
                for expected, quantized in zip(reference, fp8_runner.kv_cache.read(layer, blocks), strict=True):
                    assert (quantized - expected).norm() <= 0.1 * expected.norm()


FP8_SIZING = ("--kv-cache-gib", "0.25", "--max-model-len", "2048")


@pytest.fixture(scope="module")
def fp8_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    process = start_engine(
        tmp_path_factory.mktemp("fp8"),
        *FP8_SIZING, "--kv-cache-dtype", "fp8", "--check-invariants",
    )  # fmt: skip
    yield process
    process.stop()


@pytest.mark.slow
def test_a_server_started_with_fp8_kv_sizes_its_pool_in_fp8_and_reuses_prefixes(fp8_engine: ManagedProcess) -> None:
    arch = load_arch(MODEL)
    planned = {
        dtype: plan_kv_budget(
            config_from_args(build_parser().parse_args([*FP8_SIZING, "--kv-cache-dtype", dtype])), arch
        ).num_blocks
        for dtype in ("fp8", "auto")
    }
    with urllib.request.urlopen(f"{fp8_engine.url}/stats", timeout=10) as response:
        stats = json.loads(response.read())
    client = openai.OpenAI(base_url=f"{fp8_engine.url}/v1", api_key="unused", max_retries=0)
    assert stats["num_blocks"] == planned["fp8"] == 4 * planned["auto"], "one byte per value instead of four"
    prompt = "Here is a list of fruits: apple, banana, cherry, grape, mango, orange, pear, plum, kiwi, lemon,"
    replies = [client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0) for _ in range(2)]
    usages = [reply.usage for reply in replies if reply.usage and reply.usage.prompt_tokens_details]
    assert [usage.prompt_tokens_details.cached_tokens for usage in usages if usage.prompt_tokens_details] == [
        0,
        (usages[0].prompt_tokens - 1) // 16 * 16,
    ]
    assert all(reply.choices[0].text.strip() for reply in replies)
