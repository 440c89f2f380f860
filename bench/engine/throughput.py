"""Throughput and TTFT of concurrent requests: kvgate's engine against transformers' continuous batching.

``--requests`` prompts of ``--prompt-tokens`` distinct random token ids, each generating exactly
``--output-tokens`` tokens (EOS ignored), all submitted at once. kvgate runs as a real server
process and is driven over HTTP with streaming; transformers runs ``generate_batch`` (paged
attention, continuous batching) in this process with the same float32 weights, the same token
budget per step.

    python -m bench.engine.throughput [--requests 32] [--prompt-tokens 512] [--output-tokens 128]

Measured on the shared 2-core dev machine (load average 6-8 from other jobs, so absolute numbers
are several times worse than on an idle machine):

* ``--requests 8 --prompt-tokens 256 --output-tokens 32``: kvgate 18.0 output tokens/s, TTFT p50
  10.2 s; transformers ``generate_batch`` 2.7 output tokens/s, TTFT p50 24.2 s; 6.75x.
* ``--skip-transformers`` at the full 32 x 512 -> 128: kvgate 23.4 output tokens/s, TTFT p50
  61.7 s. transformers was not run at that size (at 2.7 tokens/s it would need about 25 minutes).
"""

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.engine.engine_process import start_engine
from bench.harness.loadgen import Target, run_load
from bench.workloads.types import BenchRequest
from radix.blocks import blocks_for

MODEL = "smollm2-135m"


@dataclass
class Outcome:
    name: str
    output_tokens: int
    seconds: float
    ttft_p50_s: float

    def line(self) -> str:
        return (
            f"{self.name:<26} {self.output_tokens / self.seconds:8.1f} output tokens/s   "
            f"TTFT p50 {self.ttft_p50_s:6.2f} s   ({self.output_tokens} tokens in {self.seconds:.1f} s)"
        )


def make_prompts(count: int, length: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(1000, 40000) for _ in range(length)] for _ in range(count)]


def run_kvgate(prompts: list[list[int]], output_tokens: int, budget: int) -> Outcome:
    requests = [BenchRequest(f"r{i}", f"r{i}", 0.0, output_tokens, tuple(prompt)) for i, prompt in enumerate(prompts)]
    blocks = len(prompts) * blocks_for(len(prompts[0]) + output_tokens, 16) + 64
    flags = [
        "--num-blocks", str(blocks),
        "--max-model-len", str(len(prompts[0]) + output_tokens),
        "--max-num-seqs", str(len(prompts)),
        "--max-num-batched-tokens", str(budget),
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as log_dir:
        engine = start_engine(Path(log_dir), *flags)
        try:
            load = asyncio.run(run_load(requests, Target((engine.url,), MODEL), label="kvgate"))
        finally:
            engine.stop()
    failed = [result for result in load.results if not result.ok]
    if failed:
        raise SystemExit(f"kvgate: {len(failed)} requests failed: {failed[0].error or failed[0].status}")
    ttft = statistics.median(result.ttft_s for result in load.results if result.ttft_s is not None)
    return Outcome("kvgate engine", sum(result.output_tokens for result in load.results), load.duration_s, ttft)


def run_transformers(prompts: list[list[int]], output_tokens: int, threads: int, budget: int) -> Outcome:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from engine.model.loader import load_model
    from normalize.model_files import resolve_model

    torch.set_num_threads(threads)
    load_model(MODEL)
    model = AutoModelForCausalLM.from_pretrained(
        resolve_model(MODEL).cache_dir / "hf", dtype=torch.float32, attn_implementation="sdpa"
    )
    generation = GenerationConfig(max_new_tokens=output_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    batching = ContinuousBatchingConfig(
        page_size=16,
        num_blocks=len(prompts) * blocks_for(len(prompts[0]) + output_tokens, 16) + 64,
        max_batch_tokens=budget,
        allow_block_sharing=False,
    )
    started = time.perf_counter()
    outputs = model.generate_batch(
        prompts, generation_config=generation, continuous_batching_config=batching, record_timestamps=True, warmup=False
    )
    seconds = time.perf_counter() - started
    ttfts = [output.timestamps[0] - output.created_time for output in outputs.values() if output.timestamps]
    produced = sum(len(output.generated_tokens) for output in outputs.values())
    return Outcome(
        "transformers generate_batch", produced, seconds, statistics.median(ttfts) if ttfts else float("nan")
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument(
        "--threads",
        type=int,
        default=2,
        help="torch threads of transformers (the engine uses torch's default, one per core)",
    )
    parser.add_argument("--max-batch-tokens", type=int, default=2048, help="token budget per step of both contenders")
    parser.add_argument("--skip-transformers", action="store_true")
    args = parser.parse_args(argv)
    prompts = make_prompts(args.requests, args.prompt_tokens)
    print(
        f"{args.requests} requests x {args.prompt_tokens} prompt tokens -> {args.output_tokens} output tokens, float32"
    )
    kvgate = run_kvgate(prompts, args.output_tokens, args.max_batch_tokens)
    print(kvgate.line())
    if not args.skip_transformers:
        baseline = run_transformers(prompts, args.output_tokens, args.threads, args.max_batch_tokens)
        print(baseline.line())
        print(
            f"kvgate / transformers throughput: {kvgate.output_tokens / kvgate.seconds / (baseline.output_tokens / baseline.seconds):.2f}x"
        )


if __name__ == "__main__":
    main()
