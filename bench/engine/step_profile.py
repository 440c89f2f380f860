"""Where one runner step's time goes: cold prefill, a cached prompt, and a batched decode step.

Three steps, as the engine runs them (SmolLM2-135M, block 16):

- ``cold``: a 1,536-token prompt with nothing cached;
- ``cached``: the last 128 tokens of a 1,536-token prompt whose first 1,408 are cached;
- ``decode``: 16 sequences decoding one token each at a context of ``--decode-context``.

Each step is timed in CPU seconds of this process (``time.process_time``), not wall time: on a
shared machine, CPU time counts the work the step did and hardly what other processes did.
With one thread (the default here) CPU time is the step's cost; with more, OpenMP threads that
spin while waiting add to it. ``--profile`` prints torch.profiler's table of operators by self
CPU time for each step. ``--lora FOLDER`` runs every step under that PEFT LoRA adapter (its cost
over the base model's is the adapter's; a step without adapter rows runs the base model's ops only).

    python -m bench.engine.step_profile [--dtype bfloat16] [--threads 1] [--repeats 5] [--profile] [--lora DIR]
"""

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from engine.model.lora_modules import LoRAModule, check_modules
from engine.model.model_runner import TorchModelRunner
from engine.model.runner_api import SamplingParams, SeqChunk
from radix.blocks import blocks_for

GREEDY = SamplingParams(temperature=0.0)
BLOCK_SIZE = 16


def prompt_tokens(count: int, seed: int) -> list[int]:
    return [(7919 * (i + seed)) % 40000 + 1000 for i in range(count)]


def cold_step(prompt: int) -> list[SeqChunk]:
    return [SeqChunk(0, prompt_tokens(prompt, 0), 0, list(range(blocks_for(prompt, BLOCK_SIZE))), True, GREEDY)]


def cached_step(prompt: int, cached: int) -> list[SeqChunk]:
    table = list(range(blocks_for(prompt, BLOCK_SIZE)))
    return [SeqChunk(0, prompt_tokens(prompt, 0)[cached:], cached, table, True, GREEDY)]


def decode_step(batch: int, context: int, first_block: int) -> list[SeqChunk]:
    per_seq = blocks_for(context, BLOCK_SIZE)
    return [
        SeqChunk(
            seq,
            [1000 + seq],
            context - 1,
            list(range(first_block + seq * per_seq, first_block + (seq + 1) * per_seq)),
            True,
            GREEDY,
            1,
        )
        for seq in range(batch)
    ]


def cpu_seconds(step: Callable[[], object], repeats: int) -> list[float]:
    step()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        step()
        times.append(time.process_time() - start)
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=1536)
    parser.add_argument("--cached", type=int, default=1408)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--decode-context", type=int, default=192)
    parser.add_argument("--steps", nargs="+", default=["cold", "cached", "decode"])
    parser.add_argument("--profile", action="store_true", help="print torch.profiler's operator table per step")
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--lora", type=Path, metavar="DIR", help="run every step under this PEFT LoRA adapter")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    prompt_blocks = blocks_for(args.prompt, BLOCK_SIZE)
    num_blocks = prompt_blocks + args.batch * blocks_for(args.decode_context, BLOCK_SIZE)
    modules = (LoRAModule("bench", args.lora),) if args.lora else ()
    adapters = tuple(check_modules(modules, args.model, max_rank=1 << 16))
    runner = TorchModelRunner(
        args.model, BLOCK_SIZE, num_blocks, "cpu", args.dtype, args.kv_cache_dtype, adapters=adapters
    )
    steps = {
        "cold": cold_step(args.prompt),
        "cached": cached_step(args.prompt, args.cached),
        "decode": decode_step(args.batch, args.decode_context, prompt_blocks),
    }
    for chunk in (chunk for chunks in steps.values() for chunk in chunks):
        chunk.lora_id = len(adapters)
    runner.execute(steps["cold"])
    print(f"{args.dtype}, kv {args.kv_cache_dtype}, {args.threads} threads, LoRA: {args.lora or 'none'}")
    for name in args.steps:
        chunks = steps[name]
        times = cpu_seconds(partial(runner.execute, chunks), args.repeats)
        print(
            f"{name:7s} CPU ms: median {statistics.median(times) * 1e3:8.2f}  min {min(times) * 1e3:8.2f}"
            f"  all {[round(t * 1e3, 1) for t in times]}"
        )
        if args.profile:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                runner.execute(chunks)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
