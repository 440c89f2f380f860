"""The full engine (scheduler, block manager, prefix cache, real runner) on the bundled SmolLM2."""

import asyncio
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import torch

from engine.block_manager import BlockManager
from engine.llm_engine import LLMEngine
from engine.loader import load_model
from engine.metrics import EngineMetrics
from engine.model_runner import TorchModelRunner
from engine.runner_api import SamplingParams
from engine.scheduler import Scheduler
from normalize.chat_tokenizer import ChatTokenizer
from normalize.model_files import resolve_model
from tests.engine.reference import transformers_greedy
from tests.procs import ManagedProcess, start_engine

torch.set_num_threads(2)

MODEL = "smollm2-135m"
MAX_TOKENS = 24
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "def fibonacci(n):",
    "Here is a list of fruits: apple, banana,",
    "To train a neural network, you first need to",
]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tokenizer() -> ChatTokenizer:
    return ChatTokenizer.load(MODEL)


@pytest.fixture(scope="module")
def prompts(tokenizer: ChatTokenizer) -> list[list[int]]:
    return [tokenizer.encode_text(text) for text in PROMPTS]


@pytest.fixture(scope="module")
def expected(prompts: list[list[int]]) -> list[list[int]]:
    """transformers' own greedy continuations of the same float32 weights (converted once by
    ``load_model``), EOS ignored."""
    load_model(MODEL)
    return transformers_greedy(resolve_model(MODEL).cache_dir / "hf", prompts, MAX_TOKENS)


async def greedy(engine: LLMEngine, prompt: list[int]) -> tuple[list[int], int]:
    """Generated tokens and cached prompt tokens of one request."""
    tokens: list[int] = []
    cached = 0
    sampling = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    async for output in engine.generate(prompt, sampling, max_total_tokens=64, eos_token_id=None):
        tokens.extend(output.token_ids)
        cached = output.num_cached_tokens
    return tokens, cached


def test_engine_greedy_matches_transformers_cold_warm_chunked_and_preempted(
    tokenizer: ChatTokenizer, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    block_size, num_blocks = 4, 24
    runner = TorchModelRunner(MODEL, block_size=block_size, num_blocks=num_blocks)
    scheduler = Scheduler(BlockManager(num_blocks, block_size, MODEL), max_num_seqs=8, max_num_batched_tokens=8)
    engine = LLMEngine(
        runner, scheduler, tokenizer.tokenizer, EngineMetrics(MODEL, block_size, num_blocks), check_invariants=True
    )

    async def concurrent_then_repeated() -> tuple[list[tuple[list[int], int]], list[tuple[list[int], int]]]:
        engine.start(asyncio.get_running_loop())
        try:
            concurrent = await asyncio.gather(*(greedy(engine, prompt) for prompt in prompts))
            repeated = [await greedy(engine, prompt) for prompt in prompts[:2] for _ in range(2)]
            return list(concurrent), repeated
        finally:
            await asyncio.to_thread(engine.stop)

    concurrent, repeated = asyncio.run(concurrent_then_repeated())
    assert scheduler.num_preemptions > 0, "the pool is meant to be too small for all prompts at once"
    assert [tokens for tokens, _ in concurrent] == expected
    assert [tokens for tokens, _ in repeated] == [expected[0], expected[0], expected[1], expected[1]]
    assert repeated[1][1] > 0 and repeated[3][1] > 0, "a repeated prompt hits the prefix cache"
    assert scheduler.block_manager.num_free_blocks == num_blocks


@pytest.fixture(scope="module")
def real_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    process = start_engine(
        tmp_path_factory.mktemp("real"), "--num-blocks", "256", "--max-model-len", "2048", "--check-invariants"
    )
    yield process
    process.stop()


def test_real_model_answers_through_the_server(real_engine: ManagedProcess, tmp_path: Path) -> None:
    client = openai.OpenAI(base_url=f"{real_engine.url}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    assert "Paris" in first.choices[0].message.content
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert (
        "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
        == first.choices[0].message.content
    )
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= 32
