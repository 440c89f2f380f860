"""The cost of constrained decoding: decode tokens/s with and without a JSON schema, at batch 1 and 16.

The real engine (scheduler, paged cache, SmolLM2 runner) in this process. Every request generates
exactly ``--output-tokens`` tokens: unconstrained ones ignore EOS, constrained ones follow a schema
whose one string field is longer than that (``minLength``), so the grammar never ends them early
and both runs decode the same number of tokens. Decode rate: tokens after each request's first, over
the time from the last first token to the last token.

    python -m bench.engine.grammar_decode [--batches 1 16] [--output-tokens 64] [--threads 2] [--repeats 3]

With ``--repeats 5`` on the shared 2-core dev machine (load average 12-19 from other jobs, so
absolute rates swing 2-4x): batch 1 free 38.3 tok/s, JSON schema 37.4 (0.98); batch 16 free 234.1,
JSON schema 250.7 (1.07): no cost measurable above the machine's noise (docs/structured_outputs.md).
"""

import argparse
import asyncio
import time

import torch

from engine.core.block_manager import BlockManager
from engine.core.llm_engine import LLMEngine
from engine.core.metrics import EngineMetrics
from engine.core.scheduler import Scheduler
from engine.model.grammar import GrammarCompiler
from engine.model.model_runner import TorchModelRunner
from engine.model.runner_api import SamplingParams
from normalize.chat_tokenizer import ChatTokenizer

MODEL = "smollm2-135m"
BLOCK_SIZE = 16


def long_text_schema(min_chars: int) -> dict:
    return {
        "type": "object",
        "properties": {"story": {"type": "string", "minLength": min_chars}},
        "required": ["story"],
        "additionalProperties": False,
    }


async def decode_rate(engine: LLMEngine, prompts: list[list[int]], sampling: SamplingParams) -> float:
    first: list[float] = []
    counts: list[int] = []

    async def one(prompt: list[int]) -> None:
        count = 0
        async for output in engine.generate(prompt, sampling, 4096, None):
            count += len(output.token_ids)
            if count == 1:
                first.append(time.monotonic())
        counts.append(count)

    await asyncio.gather(*(one(prompt) for prompt in prompts))
    end = time.monotonic()
    return sum(count - 1 for count in counts) / (end - max(first))


async def main_async(args: argparse.Namespace) -> None:
    tokenizer = ChatTokenizer.load(MODEL)
    compiler = GrammarCompiler(tokenizer)
    schema = compiler.json_schema(long_text_schema(args.output_tokens * 8), "bench")
    num_blocks = max(args.batches) * 8 + 16
    runner = TorchModelRunner(MODEL, block_size=BLOCK_SIZE, num_blocks=num_blocks)
    scheduler = Scheduler(BlockManager(num_blocks, BLOCK_SIZE, MODEL), max(args.batches), 2048)
    engine = LLMEngine(runner, scheduler, tokenizer.tokenizer, EngineMetrics(MODEL, BLOCK_SIZE, num_blocks))
    engine.start(asyncio.get_running_loop())
    try:
        for batch in args.batches:
            prompts = [
                tokenizer.encode_chat([{"role": "user", "content": f"Write story number {i} about a cat."}])
                for i in range(batch)
            ]
            free = SamplingParams(temperature=0.0, max_tokens=args.output_tokens, ignore_eos=True)
            constrained = SamplingParams(temperature=0.0, max_tokens=args.output_tokens, constraint=schema)
            await decode_rate(engine, prompts[:1], free)  # warm-up
            rates = {"free": 0.0, "json schema": 0.0}
            for _ in range(args.repeats):  # interleaved, best of each: the shared machine's load comes and goes
                for name, sampling in (("free", free), ("json schema", constrained)):
                    rates[name] = max(rates[name], await decode_rate(engine, prompts, sampling))
            print(
                f"batch {batch:>3}: free {rates['free']:7.1f} tok/s   json schema {rates['json schema']:7.1f} tok/s"
                f"   ratio {rates['json schema'] / rates['free']:.2f}",
                flush=True,
            )
    finally:
        await asyncio.to_thread(engine.stop)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs per setting")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
