"""The prefix index on shapes other than bench.micro.index_cost's: CPU time per operation, one tree.

Fills 1,000,000 blocks over 16 replicas as ``bench.micro.index_cost`` does (except ``small``),
importing ``radix`` and ``bench`` from the tree given, then times one of:

- ``turns``: 256 conversations grow by 8 blocks a turn, turns interleaved, so a conversation's
  blocks come from many small inserts; match + insert (with the match's handle when the tree
  has one) of turns 24-39 (200-320 blocks).
- ``small``: the overhead benchmark's use, on an index that fits in the CPU caches (no fill):
  one replica, 16 system prompts of 125 blocks, 3 new blocks a request; match + insert (with
  the handle) of requests 1,000-5,999.
- ``events``: what precise mode does on KV events: insert of a 64-block chain without a handle
  (BlockStored), then remove of its last 32 blocks (BlockRemoved), or of its last one with
  ``events-1``; ``store-1``: insert of one block without a handle (a decode step's BlockStored).

Run it alternately on two trees (e.g. ``git archive main`` unpacked) with the same seeds:

    python bench/micro/index_cost_shapes.py TREE SEED turns|small|events|events-1|store-1
"""

import argparse
import os
import random
import statistics
import sys
import time
from typing import Any

REPLICAS = [f"replica-{i}" for i in range(16)]


def turns(index: Any, rng: random.Random) -> list[float]:
    conversations: list[list[int]] = [[] for _ in range(256)]
    owners = [rng.choice(REPLICAS) for _ in conversations]
    has_handle = hasattr(index, "match_prefix")
    cpu: list[float] = []
    for turn in range(40):
        for conversation, owner in zip(conversations, owners, strict=True):
            conversation.extend(rng.getrandbits(128) for _ in range(8))
            start = time.process_time_ns()
            if has_handle:
                index.insert(owner, conversation, float(turn), found=index.match_prefix(conversation))
            else:
                index.match(conversation)
                index.insert(owner, conversation, float(turn))
            if turn >= 24:
                cpu.append((time.process_time_ns() - start) / 1000)
    return cpu


def small(index: Any, rng: random.Random) -> list[float]:
    index.add_replica("small")
    systems = [[rng.getrandbits(128) for _ in range(125)] for _ in range(16)]
    has_handle = hasattr(index, "match_prefix")
    cpu: list[float] = []
    for op in range(6000):
        prompt = systems[op % len(systems)] + [rng.getrandbits(128) for _ in range(3)]
        start = time.process_time_ns()
        if has_handle:
            index.insert("small", prompt, float(op), found=index.match_prefix(prompt))
        else:
            index.match(prompt)
            index.insert("small", prompt, float(op))
        if op >= 1000:
            cpu.append((time.process_time_ns() - start) / 1000)
    return cpu


def events(index: Any, rng: random.Random, removed: int, random_chain: Any) -> tuple[list[float], list[float]]:
    inserts: list[float] = []
    removals: list[float] = []
    for op in range(2000):
        chain = random_chain(rng, [], 64)
        replica = rng.choice(REPLICAS)
        start = time.process_time_ns()
        index.insert(replica, chain, 1.0 + op)
        inserted = time.process_time_ns()
        index.remove(replica, chain[64 - removed :])
        inserts.append((inserted - start) / 1000)
        removals.append((time.process_time_ns() - inserted) / 1000)
    return inserts, removals


def store_one(index: Any, rng: random.Random) -> list[float]:
    cpu: list[float] = []
    for op in range(3000):
        block = [rng.getrandbits(128)]
        replica = rng.choice(REPLICAS)
        start = time.process_time_ns()
        index.insert(replica, block, 1.0 + op)
        cpu.append((time.process_time_ns() - start) / 1000)
    return cpu


def main(tree: str, seed: int, shape: str) -> None:
    sys.path.insert(0, tree)
    from bench.micro.index_cost import fill, random_chain
    from radix.prefix_index import PrefixIndex

    rng = random.Random(seed)
    index = PrefixIndex(max_blocks=2_000_000)
    if shape != "small":
        for name in REPLICAS:
            index.add_replica(name, capacity=125_000)
        fill(index, rng, 1_000_000, REPLICAS)
    if shape in ("turns", "small"):
        cpu = turns(index, rng) if shape == "turns" else small(index, rng)
        figures = f"match + insert CPU p50 {statistics.median(cpu):.1f} us"
    elif shape == "store-1":
        figures = f"insert of one block without a handle CPU p50 {statistics.median(store_one(index, rng)):.1f} us"
    else:
        removed = 1 if shape == "events-1" else 32
        inserts, removals = events(index, rng, removed, random_chain)
        figures = (
            f"insert of 64 blocks without a handle CPU p50 {statistics.median(inserts):.1f} us, "
            f"remove of {removed} CPU p50 {statistics.median(removals):.1f} us"
        )
    print(f"{tree} seed {seed} {shape}: {figures}, load {os.getloadavg()[0]:.2f}", flush=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", help="source tree to import radix and bench from")
    parser.add_argument("seed", type=int)
    parser.add_argument("shape", choices=["turns", "small", "events", "events-1", "store-1"])
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse()
    main(args.tree, args.seed, args.shape)
