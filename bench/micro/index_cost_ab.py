"""Interleave old and new trees on bench.micro.index_cost's workload: CPU time and wall p50 per op.

Fills and times exactly as ``bench.micro.index_cost`` (without its memory measurement), importing
``radix`` and ``bench`` from the tree given, and uses ``match_prefix``'s handle when the tree
has one. Run it alternately on two trees (e.g. ``git archive main`` unpacked) with the same seeds:

    python bench/micro/index_cost_ab.py TREE SEED [CAPACITY]

``CAPACITY``: blocks per replica (default twice the fill's share, so nothing is evicted); a
smaller one keeps replicas full, so that evictions run inside the timed operations (compare the
mean then: p50 leaves the batched evictions out).
"""

import argparse
import os
import random
import statistics
import sys
import time


def main(
    tree: str, seed: int, capacity: int | None = None, blocks: int = 1_000_000, replica_count: int = 16, ops: int = 2000
) -> None:
    sys.path.insert(0, tree)
    from bench.micro.index_cost import PROMPT_BLOCKS, fill, random_chain
    from radix.prefix_index import PrefixIndex

    rng = random.Random(seed)
    replicas = [f"replica-{i}" for i in range(replica_count)]
    index = PrefixIndex(max_blocks=blocks * 2)
    for name in replicas:
        index.add_replica(name, capacity=capacity or blocks // replica_count * 2)
    fill(index, rng, blocks, replicas)
    hot = [random_chain(rng, [], PROMPT_BLOCKS) for _ in range(64)]
    for chain in hot:
        index.insert(rng.choice(replicas), chain, 0.0)
    has_handle = hasattr(index, "match_prefix")
    wall: list[float] = []
    cpu: list[float] = []
    for op in range(ops):
        prompt = random_chain(rng, rng.choice(hot)[: PROMPT_BLOCKS // 2], PROMPT_BLOCKS)
        start_cpu = time.process_time_ns()
        start = time.perf_counter_ns()
        found = index.match_prefix(prompt) if has_handle else None
        matched = found.depths if found is not None else index.match(prompt)
        replica = max(matched, key=matched.__getitem__) if matched else rng.choice(replicas)
        if found is not None:
            index.insert(replica, prompt, 1.0 + op, found=found)
        else:
            index.insert(replica, prompt, 1.0 + op)
        wall.append((time.perf_counter_ns() - start) / 1000)
        cpu.append((time.process_time_ns() - start_cpu) / 1000)
    print(
        f"{'handle' if has_handle else 'plain'} seed {seed}: CPU time p50 {statistics.median(cpu):.1f} us, "
        f"mean {statistics.fmean(cpu):.1f} us, wall p50 {statistics.median(wall):.1f} us, "
        f"evictions {index.evictions:,}, load {os.getloadavg()[0]:.2f}",
        flush=True,
    )


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", help="source tree to import radix and bench from")
    parser.add_argument("seed", type=int)
    parser.add_argument("capacity", type=int, nargs="?", help="blocks per replica (default: nothing is evicted)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse()
    main(args.tree, args.seed, args.capacity)
