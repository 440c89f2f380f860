"""The host tier on real KV: copies keep every byte (fp8 scales too), and greedy output is unchanged."""

import asyncio

import pytest
import torch

from engine.core.block_manager import BlockManager
from engine.core.llm_engine import LLMEngine
from engine.core.metrics import EngineMetrics
from engine.core.scheduler import Scheduler
from engine.model.kv_cache import Fp8PagedKVCache, KVCacheShape, PagedKVCache
from engine.model.model_runner import TorchModelRunner
from engine.model.runner_api import SamplingParams
from normalize.chat_tokenizer import ChatTokenizer

torch.set_num_threads(2)

MODEL = "smollm2-135m"
LAYERS, BLOCKS, BLOCK_SIZE, HEADS, DIM = 2, 8, 4, 2, 8
SHAPE = KVCacheShape(LAYERS, BLOCKS, BLOCK_SIZE, HEADS, DIM)
CPU = torch.device("cpu")


@pytest.mark.parametrize("fp8", [False, True])
def test_blocks_round_trip_through_host_memory_bit_for_bit(fp8: bool) -> None:
    if fp8:
        cache: PagedKVCache = Fp8PagedKVCache(SHAPE, torch.float32, CPU)
    else:
        cache = PagedKVCache(SHAPE, torch.bfloat16, torch.float32, CPU)
    for layer in range(LAYERS):
        slots = torch.arange(BLOCKS * BLOCK_SIZE)
        cache.write(
            layer, slots, torch.randn(len(slots), HEADS, DIM) * (layer + 1), torch.randn(len(slots), HEADS, DIM)
        )
    before = [cache.read(layer, torch.tensor([1, 6]))[0].clone() for layer in range(LAYERS)]
    host = cache.allocate_host(3)
    assert host.pool.device.type == "cpu" and (host.scales is not None) == fp8
    cache.copy_to_host(host, [1, 6], [2, 0])
    cache.pool.zero_()
    if isinstance(cache, Fp8PagedKVCache):
        cache.scales.fill_(1.0)
    cache.copy_from_host(host, [2, 0], [4, 3])
    for layer in range(LAYERS):
        assert torch.equal(cache.read(layer, torch.tensor([4, 3]))[0], before[layer])


async def greedy(engine: LLMEngine, prompt: list[int]) -> tuple[list[int], int]:
    tokens: list[int] = []
    cached = 0
    sampling = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    async for output in engine.generate(prompt, sampling, max_total_tokens=128, eos_token_id=None):
        tokens.extend(output.token_ids)
        cached = output.num_cached_tokens
    return tokens, cached


def replay(
    kv_cache_dtype: str, num_blocks: int, host_blocks: int, prompts: list[list[int]]
) -> tuple[list[tuple[list[int], int]], int]:
    """Each prompt twice, one after another in rounds. A 12-block pool holds about one request
    (about 31 tokens, 8 blocks of 4), so each evicts the ones before; with a host tier the second
    round hits the host."""
    tokenizer = ChatTokenizer.load(MODEL)
    block_size = 4
    runner = TorchModelRunner(MODEL, block_size, num_blocks, kv_cache_dtype=kv_cache_dtype, host_blocks=host_blocks)
    manager = BlockManager(num_blocks, block_size, MODEL, host_blocks=host_blocks)
    scheduler = Scheduler(manager, max_num_seqs=4, max_num_batched_tokens=32)
    metrics = EngineMetrics(MODEL, block_size, num_blocks, host_blocks)
    engine = LLMEngine(runner, scheduler, tokenizer.tokenizer, metrics, check_invariants=True)

    async def rounds() -> list[tuple[list[int], int]]:
        engine.start(asyncio.get_running_loop())
        try:
            return [await greedy(engine, prompt) for prompt in prompts + prompts]
        finally:
            await asyncio.to_thread(engine.stop)

    results = asyncio.run(rounds())
    assert manager.num_free_blocks == num_blocks
    return results, manager.num_host_hit_blocks


PROMPTS = [
    "The history of the printing press begins in the fifteenth century, when a goldsmith in Mainz",
    "Photosynthesis is the process by which green plants use the energy of sunlight to turn water and",
    "A binary search tree keeps its keys in order, so that every lookup, insertion and deletion can",
]


@pytest.mark.slow
def test_greedy_output_with_host_hits_equals_output_without() -> None:
    tokenizer = ChatTokenizer.load(MODEL)
    prompts = [tokenizer.encode_text(text) for text in PROMPTS]
    with_host, host_hits = replay("auto", 12, 64, prompts)
    recomputed, no_host_hits = replay("auto", 12, 0, prompts)
    assert host_hits > 0 and no_host_hits == 0
    assert [tokens for tokens, _ in with_host] == [tokens for tokens, _ in recomputed]
    assert all(cached == 16 for _, cached in with_host[len(prompts) :]), "round two is served from cache"
    assert sum(cached for _, cached in recomputed) < sum(cached for _, cached in with_host)


@pytest.mark.slow
def test_fp8_host_hits_read_the_same_kv_as_device_hits() -> None:
    """fp8 KV read back from the cache differs from fresh KV, so a hit is compared with a device
    hit (a pool big enough to keep everything), not with a recompute."""
    tokenizer = ChatTokenizer.load(MODEL)
    prompts = [tokenizer.encode_text(text) for text in PROMPTS]
    with_host, host_hits = replay("fp8", 12, 64, prompts)
    on_device, device_only_host_hits = replay("fp8", 64, 0, prompts)
    assert host_hits > 0 and device_only_host_hits == 0
    assert [cached for _, cached in with_host] == [cached for _, cached in on_device]
    assert [tokens for tokens, _ in with_host] == [tokens for tokens, _ in on_device]
