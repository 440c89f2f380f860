"""The full engine (scheduler, block manager, prefix cache, real runner) on the bundled SmolLM2,
and its OpenAI extras (logprobs, n > 1 with a seed, logit bias, embeddings) checked against transformers."""

import asyncio
from pathlib import Path

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from engine.core.block_manager import BlockManager
from engine.core.llm_engine import LLMEngine
from engine.core.metrics import EngineMetrics
from engine.core.scheduler import Scheduler
from engine.model.loader import load_model
from engine.model.model_runner import TorchModelRunner
from engine.model.runner_api import SamplingParams
from normalize.chat_tokenizer import ChatTokenizer
from normalize.model_files import resolve_model
from tests.engine.reference import transformers_greedy
from tests.procs import ManagedProcess

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
def real_engine(real_engines: list[ManagedProcess]) -> ManagedProcess:
    return real_engines[0]


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


PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def reference() -> PreTrainedModel:
    """transformers' model on the same float32 weights, for logprobs and hidden states."""
    load_model(MODEL)
    folder = resolve_model(MODEL).cache_dir / "hf"
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")


@pytest.fixture(scope="module")
def api_client(real_engine: ManagedProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{real_engine.url}/v1", api_key="unused", max_retries=0)


@torch.inference_mode()
def test_completion_logprobs_match_transformers(
    api_client: openai.OpenAI, reference: PreTrainedModel, tokenizer: ChatTokenizer
) -> None:
    prompt = tokenizer.encode_text(PROMPT)
    result = api_client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0, logprobs=3)
    logprobs = result.choices[0].logprobs
    expected = torch.log_softmax(reference(torch.tensor([prompt])).logits[0, -1].float(), dim=-1)
    top = expected.topk(3)
    assert logprobs.tokens[0] == tokenizer.decode([int(top.indices[0])], skip_special_tokens=False)
    assert logprobs.token_logprobs[0] == pytest.approx(top.values[0].item(), abs=1e-3)
    names = [tokenizer.decode([int(index)], skip_special_tokens=False) for index in top.indices]
    assert list(logprobs.top_logprobs[0]) == names
    assert list(logprobs.top_logprobs[0].values()) == pytest.approx(top.values.tolist(), abs=1e-3)
    streamed = api_client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=2, temperature=0, logprobs=3, stream=True
    )
    streamed_logprobs = [value for chunk in streamed for value in chunk.choices[0].logprobs.token_logprobs]
    assert streamed_logprobs == pytest.approx(logprobs.token_logprobs, abs=1e-4)


def test_n_seeded_samples_differ_reproduce_and_share_the_prompt(api_client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Write one sentence about the sea, the sky and the mountains."}]

    def sample() -> openai.types.chat.ChatCompletion:
        return api_client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=6, n=3, temperature=1.0, seed=7, extra_body={"ignore_eos": True}
        )

    first, second = sample(), sample()
    texts = [choice.message.content for choice in sorted(first.choices, key=lambda choice: choice.index)]
    assert len(set(texts)) > 1, "seed + index gives each sample its own draws"
    assert texts == [choice.message.content for choice in sorted(second.choices, key=lambda choice: choice.index)]
    prompt_tokens = first.usage.prompt_tokens
    assert first.usage.completion_tokens == 18
    assert first.usage.prompt_tokens_details.cached_tokens == (prompt_tokens - 1) // 16 * 16 > 0


def test_logit_bias_forces_a_token_and_penalties_spare_the_prompt(
    api_client: openai.OpenAI, tokenizer: ChatTokenizer
) -> None:
    banana = tokenizer.encode_text(" banana")
    assert len(banana) == 1
    biased = api_client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0, logit_bias={str(banana[0]): 100}
    )
    assert biased.choices[0].text == " banana" * 3
    plain = api_client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0)
    penalized = api_client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, frequency_penalty=2.0, presence_penalty=2.0
    )
    first_plain = tokenizer.encode_text(plain.choices[0].text)[0]
    assert tokenizer.encode_text(penalized.choices[0].text)[0] == first_plain, "the prompt is not penalized"


@torch.inference_mode()
def test_embeddings_are_the_normalized_last_hidden_state(
    api_client: openai.OpenAI, reference: PreTrainedModel, tokenizer: ChatTokenizer
) -> None:
    texts = ["The capital of France is Paris.", "Bananas are yellow."]
    result = api_client.embeddings.create(model=MODEL, input=texts)
    for text, item in zip(texts, result.data, strict=True):
        hidden = reference.model(torch.tensor([tokenizer.encode_text(text)])).last_hidden_state[0, -1]
        expected = torch.nn.functional.normalize(hidden.float(), dim=-1)
        assert torch.allclose(torch.tensor(item.embedding), expected, atol=1e-4)
    assert result.usage.prompt_tokens == sum(len(tokenizer.encode_text(text)) for text in texts)
