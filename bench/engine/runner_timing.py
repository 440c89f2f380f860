"""Time the real model runner: prefill of a long prompt, and decode steps by batch size and context.

Decode steps attend over pool blocks whose contents are whatever is there: the time of a step does
not depend on the values, so no prefill is needed to set a context up. These numbers calibrate the
simulated engine's cost model.

    python -m bench.engine.runner_timing [--dtype float32] [--kv-cache-dtype auto] [--threads 2]

Measured on the 2-core dev machine (SmolLM2-135M, block 16, KV in the model dtype), best of 5 while
other jobs shared the cores (load average 4-5, so medians were 1.1-3x these):

    python -m bench.engine.runner_timing --threads 2                               (float32)
      prefill 2000 tokens cold 4.44 s; 100 new tokens after 1900 cached 0.31 s
      decode step, context 512:  batch 1 36.7 ms, batch 8 76.2 ms, batch 32 218 ms
      decode step, context 2048: batch 1 46.8 ms, batch 8 154 ms,  batch 32 639 ms
      SimCosts fit: prefill_per_token_s=0.00222, prefill_per_token_context_s=4.56e-07,
        decode_base_s=0.0224, decode_per_seq_s=0.00185, decode_per_context_token_s=8.42e-06
    python -m bench.engine.runner_timing --threads 1 --dtype bfloat16
      prefill 2000 tokens cold 3.40 s; 100 new tokens after 1900 cached 0.27 s
      decode step, context 512:  batch 1 23.8 ms, batch 8 42.4 ms, batch 32 114 ms
      decode step, context 2048: batch 1 29.8 ms, batch 8 93.7 ms, batch 32 522 ms

With two threads on cores other processes also use, OpenMP barriers stall whenever one thread is
descheduled, so a step can take several times its one-thread time: on a busy machine, measure
(and run engines) with ``--threads 1``.
"""

import argparse
import statistics
import time

import numpy as np
import torch

from engine.model.model_runner import TorchModelRunner
from engine.model.runner_api import SamplingParams, SeqChunk
from radix.blocks import blocks_for

GREEDY = SamplingParams(temperature=0.0)


def step_seconds(runner: TorchModelRunner, chunks: list[SeqChunk], repeats: int) -> tuple[float, float]:
    """Median and best time of one ``execute`` call (best is the cleaner number on a shared machine)."""
    runner.execute(chunks)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        runner.execute(chunks)
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def table_for(seq: int, tokens: int, block_size: int, blocks_per_seq: int) -> list[int]:
    return list(range(seq * blocks_per_seq, seq * blocks_per_seq + blocks_for(tokens, block_size)))


def prefill_chunk(start_pos: int, new_tokens: int, block_size: int) -> SeqChunk:
    table = table_for(0, start_pos + new_tokens, block_size, 0)
    tokens = [(17 * i) % 1000 + 100 for i in range(new_tokens)]
    return SeqChunk(0, tokens, start_pos, table, True, GREEDY)


def decode_batch(batch: int, context: int, block_size: int) -> list[SeqChunk]:
    blocks_per_seq = blocks_for(context, block_size)
    return [
        SeqChunk(seq, [100 + seq], context - 1, table_for(seq, context, block_size, blocks_per_seq), True, GREEDY, 1)
        for seq in range(batch)
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048])
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    blocks_needed = max(
        max(args.batches) * blocks_for(max(args.contexts), args.block_size), blocks_for(2000, args.block_size)
    )
    start = time.perf_counter()
    runner = TorchModelRunner(args.model, args.block_size, blocks_needed, args.device, args.dtype, args.kv_cache_dtype)
    print(f"load {time.perf_counter() - start:.2f} s  ({args.dtype}, kv {args.kv_cache_dtype}, {args.threads} threads)")
    cold = step_seconds(runner, [prefill_chunk(0, 2000, args.block_size)], args.repeats)
    print(f"prefill 2000 tokens cold: {milliseconds(cold)}")
    cached = step_seconds(runner, [prefill_chunk(1900, 100, args.block_size)], args.repeats)
    print(f"prefill 100 new tokens after 1900 cached: {milliseconds(cached)}")
    decode_grid: list[tuple[int, int, float]] = []
    for context in args.contexts:
        for batch in args.batches:
            step = step_seconds(runner, decode_batch(batch, context, args.block_size), args.repeats)
            print(f"decode step batch {batch:3d} context {context:5d}: {milliseconds(step)}")
            decode_grid.append((batch, context, step[1]))
    print_sim_costs(cold[1], cached[1], decode_grid)


def print_sim_costs(cold_s: float, cached_s: float, decode_grid: list[tuple[int, int, float]]) -> None:
    """Least-squares fit of ``engine.sim.sim_runner.SimCosts`` constants to the best times."""
    per_token = cold_s / 2000
    per_token_context = max(cached_s - 100 * per_token, 0.0) / (100 * 1900)
    rows = np.array([[1.0, batch, batch * context] for batch, context, _ in decode_grid])
    seconds = np.array([step for _, _, step in decode_grid])
    base, per_seq, per_context_token = np.linalg.lstsq(rows, seconds, rcond=None)[0]
    print(
        f"SimCosts fit: prefill_per_token_s={per_token:.3g}, prefill_per_token_context_s={per_token_context:.3g}, "
        f"decode_base_s={base:.3g}, decode_per_seq_s={per_seq:.3g}, decode_per_context_token_s={per_context_token:.3g}"
    )


def milliseconds(times: tuple[float, float]) -> str:
    return f"{times[0] * 1000:7.1f} ms median, {times[1] * 1000:7.1f} ms best"


if __name__ == "__main__":
    main()
