"""The engine loop in-process with the cost-model runner: streaming, abort, and a failing step."""

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable

import pytest

from engine.core.block_manager import BlockManager
from engine.core.llm_engine import EngineError, LLMEngine
from engine.core.metrics import EngineMetrics
from engine.core.scheduler import Scheduler
from engine.model.runner_api import SamplingParams, SeqChunk
from engine.sim.sim_runner import SIM_PRESETS, SimCosts, SimRunner
from normalize.chat_tokenizer import ChatTokenizer

NUM_BLOCKS = 32


class FailingOnceRunner(SimRunner):
    """The cost model, except that its first step raises (a fault injected into the runner)."""

    failed = False

    def execute(self, chunks: list[SeqChunk]) -> list[int | None]:
        if not self.failed:
            self.failed = True
            raise RuntimeError("device lost")
        return super().execute(chunks)


def make_engine(runner_type: type[SimRunner] = SimRunner, costs: SimCosts = SIM_PRESETS["instant"]) -> LLMEngine:
    tokenizer = ChatTokenizer.load("smollm2-135m")
    runner = runner_type(16, NUM_BLOCKS, costs, tokenizer.encode_text(" one two three"))
    scheduler = Scheduler(BlockManager(NUM_BLOCKS, 16, "m"), max_num_seqs=4, max_num_batched_tokens=64)
    return LLMEngine(runner, scheduler, tokenizer.tokenizer, EngineMetrics("m", 16, NUM_BLOCKS), check_invariants=True)


async def collect(engine: LLMEngine, prompt: list[int], max_tokens: int) -> str:
    text = []
    async for output in engine.generate(prompt, SamplingParams(max_tokens=max_tokens), 256, eos_token_id=None):
        text.append(output.text)
    return "".join(text)


def run(engine: LLMEngine, scenario: Callable[[], Awaitable[None]]) -> None:
    async def main() -> None:
        engine.start(asyncio.get_running_loop())
        try:
            await scenario()
        finally:
            await asyncio.to_thread(engine.stop)

    asyncio.run(main())


def test_concurrent_requests_stream_their_own_text() -> None:
    engine = make_engine()

    async def scenario() -> None:
        texts = await asyncio.gather(*(collect(engine, list(range(5 + i)), 6) for i in range(6)))
        assert all(len(text.split()) == 6 for text in texts)

    run(engine, scenario)
    assert engine.block_manager.num_free_blocks == NUM_BLOCKS


def test_closing_the_stream_early_aborts_the_request() -> None:
    """Decode steps of 0.1 s: left running, the request would take at least 20 s however busy the machine,
    twice the time it gets to leave after the stream closes."""
    decode_step_s, max_tokens = 0.1, 200
    engine = make_engine(costs=dataclasses.replace(SIM_PRESETS["instant"], decode_base_s=decode_step_s))

    async def scenario() -> None:
        stream = engine.generate(list(range(40)), SamplingParams(max_tokens=max_tokens), 256, eos_token_id=None)
        await anext(stream)
        await stream.aclose()
        deadline = time.monotonic() + decode_step_s * max_tokens / 2
        while engine.stats().running or engine.stats().waiting:
            assert time.monotonic() < deadline, f"not aborted: {engine.stats()}"
            await asyncio.sleep(0.01)

    run(engine, scenario)
    assert engine.block_manager.num_free_blocks == NUM_BLOCKS
    engine.scheduler.assert_invariants()


def test_a_failing_step_fails_its_requests_and_the_engine_keeps_serving() -> None:
    engine = make_engine(FailingOnceRunner)

    async def scenario() -> None:
        with pytest.raises(EngineError, match="device lost"):
            await collect(engine, [1, 2, 3], 4)
        assert (await collect(engine, [1, 2, 3], 3)).split() == ["one", "two", "three"]

    run(engine, scenario)
    assert engine.block_manager.num_free_blocks == NUM_BLOCKS


def test_only_steps_with_a_real_prefill_measure_the_prefill_rate() -> None:
    """A short tail's step time is the step's fixed cost: counted, a warm prompt's 10-token tail
    would report a prefill rate far below the engine's."""
    engine = make_engine()

    async def scenario() -> None:
        await collect(engine, list(range(10)), 1)
        assert engine.stats().prefill_tokens_per_s is None
        await collect(engine, list(range(100, 200)), 1)
        assert engine.stats().prefill_tokens_per_s

    run(engine, scenario)


def test_a_request_that_arrives_during_a_step_is_in_the_load_before_the_loop_takes_it_in() -> None:
    """A 0.4 s prefill step: a request that arrives meanwhile waits in the command queue until the
    step ends. The load counts it already (whole, as a waiting prompt), or a gateway that sent it
    would take a report without it as counting it (gateway/backends/load_view.py)."""
    engine = make_engine(costs=dataclasses.replace(SIM_PRESETS["instant"], prefill_per_token_s=0.01))

    async def scenario() -> None:
        first = asyncio.create_task(collect(engine, list(range(40)), 1))
        await asyncio.sleep(0.15)
        assert engine.load().queued_prefill_tokens == 40
        second = asyncio.create_task(collect(engine, list(range(100, 110)), 1))
        await asyncio.sleep(0.05)
        reading = engine.load()
        assert (reading.running, reading.waiting, reading.queued_prefill_tokens) == (1, 1, 50)
        assert engine.stats().waiting == 1
        await asyncio.gather(first, second)
        await asyncio.sleep(0.05)
        assert (engine.load().waiting, engine.load().queued_prefill_tokens) == (0, 0)

    run(engine, scenario)
