"""Grammars apply per sequence inside one continuous batch: the real engine on SmolLM2, in process."""

import asyncio
import json

import jsonschema
import pytest
import torch

from engine.core.block_manager import BlockManager
from engine.core.llm_engine import LLMEngine
from engine.core.metrics import EngineMetrics
from engine.core.scheduler import Scheduler
from engine.model.grammar import GrammarCompiler
from engine.model.model_runner import TorchModelRunner
from engine.model.runner_api import SamplingParams, SeqChunk
from normalize.chat_tokenizer import ChatTokenizer

torch.set_num_threads(2)
pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16}, "country": {"type": "string", "maxLength": 16}},
    "required": ["city", "country"],
    "additionalProperties": False,
}
NUMBERS = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 2, "maxItems": 4}


def test_two_schemas_and_a_free_sequence_in_one_batch_each_follow_their_own() -> None:
    tokenizer = ChatTokenizer.load(MODEL)
    compiler = GrammarCompiler(tokenizer)
    runner = TorchModelRunner(MODEL, block_size=16, num_blocks=64)
    steps: list[list[SeqChunk]] = []
    execute = runner.execute

    def recording(chunks: list[SeqChunk]) -> list[int | None]:
        steps.append([chunk for chunk in chunks if chunk.sample])
        return execute(chunks)

    runner.execute = recording  # type: ignore[method-assign]
    scheduler = Scheduler(BlockManager(64, 16, MODEL), max_num_seqs=8, max_num_batched_tokens=512)
    engine = LLMEngine(runner, scheduler, tokenizer.tokenizer, EngineMetrics(MODEL, 16, 64), check_invariants=True)
    prompt = tokenizer.encode_chat([{"role": "user", "content": "Tell me about Paris."}])
    requests = [
        SamplingParams(temperature=0.0, max_tokens=40, constraint=compiler.json_schema(CITY, "a")),
        SamplingParams(temperature=0.0, max_tokens=40, constraint=compiler.json_schema(NUMBERS, "b")),
        SamplingParams(temperature=0.0, max_tokens=12),
    ]

    async def answer(sampling: SamplingParams) -> str:
        text = ""
        async for output in engine.generate(prompt, sampling, 2048, tokenizer.eos_token_id):
            text += output.text
        return text

    async def run() -> tuple[list[str], str]:
        engine.start(asyncio.get_running_loop())
        try:
            together = await asyncio.gather(*(answer(sampling) for sampling in requests))
            alone = await answer(requests[2])
            return list(together), alone
        finally:
            await asyncio.to_thread(engine.stop)

    (city, numbers, free), free_alone = asyncio.run(run())
    jsonschema.validate(json.loads(city), CITY)
    jsonschema.validate(json.loads(numbers), NUMBERS)
    assert free == free_alone, "an unconstrained sequence is untouched by its neighbours' masks"
    mixed = [step for step in steps if len({id(chunk.constraint) for chunk in step}) == 3]
    assert mixed, "the three sequences sampled in one step, each under its own constraint (or none)"
