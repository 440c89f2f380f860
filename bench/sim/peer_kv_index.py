"""What a precise peer router knows of each replica's device cache: the block hashes its KV
events say are stored there, for the modelled peers of ``bench simulate --peers`` (Dynamo's KV
router, llm-d's precise prefix-cache scorer).

Both real routers subscribe to the engines' vLLM-format KV events and keep an index of block
hash -> replicas; both score a prompt by the longest run of its blocks, from block 0, that a
replica holds (Dynamo's device overlap, llm-d's ``LongestPrefix`` strategy). Only the device tier
(``medium`` GPU) is tracked: the benchmarks here run no host tier for the peers.
"""

from collections.abc import Iterable, Sequence

from radix.hashing import BlockHash, hash_to_bytes
from radix.kv_event_format import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KVEvent


class PeerKVIndex:
    def __init__(self, replicas: Sequence[str]) -> None:
        self.replicas = list(replicas)
        self._held: dict[str, set[bytes | int]] = {name: set() for name in self.replicas}

    def apply(self, replica: str, events: Iterable[KVEvent]) -> None:
        held = self._held[replica]
        for event in events:
            if isinstance(event, BlockStored) and event.medium in (MEDIUM_GPU, None):
                held.update(event.block_hashes)
            elif isinstance(event, BlockRemoved) and event.medium in (MEDIUM_GPU, None):
                held.difference_update(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                held.clear()

    def add(self, replica: str, block_hashes: Iterable[BlockHash]) -> None:
        """Mark blocks held directly (tests; a speculative insert)."""
        self._held[replica].update(hash_to_bytes(block_hash) for block_hash in block_hashes)

    def prefix_blocks(self, block_hashes: Sequence[BlockHash]) -> dict[str, int]:
        """Per replica, how many of the prompt's blocks it holds consecutively from block 0."""
        wire = [hash_to_bytes(block_hash) for block_hash in block_hashes]
        matched: dict[str, int] = {}
        for name in self.replicas:
            held = self._held[name]
            count = 0
            for block_hash in wire:
                if block_hash not in held:
                    break
                count += 1
            matched[name] = count
        return matched
