"""Cost of the prefix index: time of match + insert for a 4,096-token prompt, bytes per block.

The index is filled with ``--blocks`` distinct blocks spread over ``--replicas`` replicas, as
chains of 256 blocks that share group prefixes (like system prompts). Each timed operation
matches a fresh prompt whose first half is an indexed chain, then inserts it under the replica
that matched most (a random one if none did), as cache-aware routing does per request.
Targets (issue 4): p50 <= 100 us with 1,000,000 blocks over 16 replicas, <= 200 B per block.

    python -m bench.micro.index_cost [--blocks 1000000] [--replicas 16] [--ops 2000]
"""

import argparse
import gc
import random
import statistics
import time
import tracemalloc

from radix.prefix_index import PrefixIndex

PROMPT_BLOCKS = 256
"""A 4,096-token prompt in 16-token blocks."""
GROUP_BLOCKS = 32
"""Blocks of a shared group prefix at the start of each filling chain."""


def random_chain(rng: random.Random, prefix: list[int], length: int) -> list[int]:
    return prefix + [rng.getrandbits(128) for _ in range(length - len(prefix))]


def fill(index: PrefixIndex, rng: random.Random, blocks: int, replicas: list[str]) -> None:
    """Insert chains under random replicas until ``blocks`` distinct blocks are indexed."""
    groups = [random_chain(rng, [], GROUP_BLOCKS) for _ in range(64)]
    now = 0.0
    while len(index) < blocks:
        length = min(PROMPT_BLOCKS, GROUP_BLOCKS + blocks - len(index))
        now += 1.0
        index.insert(rng.choice(replicas), random_chain(rng, rng.choice(groups), length), now)


def measure_memory(index: PrefixIndex, rng: random.Random, blocks: int, replicas: list[str]) -> None:
    gc.collect()
    tracemalloc.start()
    fill(index, rng, blocks, replicas)
    gc.collect()
    used, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"indexed blocks: {len(index):,}  (replica, block) entries: {index.entries:,}")
    print(f"memory: {used / 2**20:.1f} MiB = {used / len(index):.0f} B/block, {used / index.entries:.0f} B/entry")


def measure_time(index: PrefixIndex, rng: random.Random, replicas: list[str], ops: int) -> None:
    hot = [random_chain(rng, [], PROMPT_BLOCKS) for _ in range(64)]
    for chain in hot:
        index.insert(rng.choice(replicas), chain, 0.0)
    timings: list[float] = []
    cpu: list[float] = []
    for op in range(ops):
        prompt = random_chain(rng, rng.choice(hot)[: PROMPT_BLOCKS // 2], PROMPT_BLOCKS)
        start_cpu = time.process_time_ns()
        start = time.perf_counter_ns()
        found = index.match_prefix(prompt)
        matched = found.depths
        replica = max(matched, key=matched.__getitem__) if matched else rng.choice(replicas)
        index.insert(replica, prompt, 1.0 + op, found=found)
        timings.append((time.perf_counter_ns() - start) / 1000)
        cpu.append((time.process_time_ns() - start_cpu) / 1000)
    timings.sort()
    print(
        f"match+insert of {PROMPT_BLOCKS} blocks, {len(index):,} indexed: "
        f"p50 {statistics.median(timings):.1f} us, p99 {timings[int(len(timings) * 0.99)]:.1f} us, "
        f"CPU time p50 {statistics.median(cpu):.1f} us ({ops} ops)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=1_000_000)
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    replicas = [f"replica-{i}" for i in range(args.replicas)]
    index = PrefixIndex(max_blocks=args.blocks * 2)
    for name in replicas:
        index.add_replica(name, capacity=args.blocks // args.replicas * 2)
    measure_memory(index, rng, args.blocks, replicas)
    measure_time(index, rng, replicas, args.ops)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
