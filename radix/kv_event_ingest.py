"""Apply one replica's KV events to the prefix index, in kvgate's own block hashes.

Engines name blocks with their own hashes: the bundled engine with kvgate's (16 bytes, the
request's cache salt included), vLLM with 64-bit ints cut from sha256 over blocks of its own
size. kvgate hashes are re-derived from the events' token ids along the parent chain, keeping a
map from the engine's hash of each block to the kvgate hashes it covers (an engine block of
``k * block_size`` tokens is ``k`` kvgate blocks). A 16-byte hash over blocks of kvgate's size
is taken as kvgate's own, which is what keeps salted requests exact on bundled engines.

Limitation: events carry no cache salt. A foreign engine's blocks are re-derived from the
unsalted root of the replica's model, so salted prompts on vLLM are only known to the router
through its short-lived speculative entries (see gateway/routing/cache_tracker.py).
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from radix.hashing import BlockHash, hash_block, root_hash
from radix.kv_event_format import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, ExternalBlockHash
from radix.prefix_index import PrefixIndex

log = logging.getLogger(__name__)

KVGATE_HASH_BYTES = 16


@dataclass
class IngestCounters:
    batches: int = 0
    blocks_stored: int = 0
    blocks_removed: int = 0
    clears: int = 0
    orphans: int = 0
    """BlockStored events whose parent block was never seen (missed events): skipped."""
    unknown_removals: int = 0
    """BlockRemoved hashes never seen stored: ignored."""
    malformed: int = 0
    """Events whose token ids or block size do not add up: skipped."""


class KVEventApplier:
    """Turns one replica's event batches into inserts and removals on the prefix index.

    ``speculative`` (optional) holds blocks the router expects the replica to store soon; an
    event about a block settles it, so the block's speculative entry is dropped.
    """

    def __init__(
        self,
        index: PrefixIndex,
        replica: str,
        model: str,
        block_size: int,
        speculative: PrefixIndex | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.index = index
        self.replica = replica
        self.block_size = block_size
        self.engine_block_size = block_size
        """The replica's own KV block size, as its BlockStored events report it: it caches whole
        blocks of this size, so a prefix match counts only in multiples of it."""
        self.speculative = speculative
        self.counters = IngestCounters()
        self._root = root_hash(model)
        self._clock = clock
        self._derived: dict[ExternalBlockHash, tuple[BlockHash, ...]] = {}

    def apply(self, batch: EventBatch) -> None:
        self.counters.batches += 1
        now = self._clock()
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._stored(event, now)
            elif isinstance(event, BlockRemoved):
                self._removed(event)
            elif isinstance(event, AllBlocksCleared):
                self.clear()

    def clear(self) -> None:
        """The replica's cache is empty (it said so, or it restarted)."""
        self.counters.clears += 1
        self._derived.clear()
        self.index.clear(self.replica)
        if self.speculative is not None:
            self.speculative.clear(self.replica)

    def _stored(self, event: BlockStored, now: float) -> None:
        hashes = self._kvgate_hashes(event)
        if hashes is None:
            return
        self.engine_block_size = event.block_size
        self.index.insert(self.replica, hashes, now)
        if self.speculative is not None:
            self.speculative.remove(self.replica, hashes)
        self.counters.blocks_stored += len(hashes)

    def _removed(self, event: BlockRemoved) -> None:
        hashes: list[BlockHash] = []
        for external in event.block_hashes:
            derived = self._derived.pop(external, None)
            if derived is not None:
                hashes.extend(derived)
            elif _is_kvgate_hash(external):
                hashes.append(int.from_bytes(external, "big"))
            else:
                self.counters.unknown_removals += 1
        self.index.remove(self.replica, hashes)
        if self.speculative is not None:
            self.speculative.remove(self.replica, hashes)
        self.counters.blocks_removed += len(hashes)

    def _kvgate_hashes(self, event: BlockStored) -> list[BlockHash] | None:
        """kvgate hashes of the event's blocks, or None (counted) when they cannot be known."""
        engine_size = event.block_size
        sizes_agree = len(event.token_ids) == len(event.block_hashes) * engine_size
        if not engine_size or engine_size % self.block_size or not sizes_agree:
            self.counters.malformed += 1
            log.warning(
                "%s: KV event with %d tokens for %d blocks of %s tokens skipped",
                self.replica,
                len(event.token_ids),
                len(event.block_hashes),
                engine_size,
            )
            return None
        if engine_size == self.block_size and all(map(_is_kvgate_hash, event.block_hashes)):
            return [int.from_bytes(external, "big") for external in event.block_hashes]
        parent = self._parent_hash(event.parent_block_hash)
        if parent is None:
            self.counters.orphans += 1
            return None
        hashes: list[BlockHash] = []
        per_engine_block = engine_size // self.block_size
        for position, external in enumerate(event.block_hashes):
            covered: list[BlockHash] = []
            for sub in range(per_engine_block):
                start = (position * per_engine_block + sub) * self.block_size
                parent = hash_block(parent, event.token_ids[start : start + self.block_size])
                covered.append(parent)
            self._derived[external] = tuple(covered)
            hashes.extend(covered)
        return hashes

    def _parent_hash(self, external: ExternalBlockHash | None) -> BlockHash | None:
        if external is None:
            return self._root
        derived = self._derived.get(external)
        if derived is not None:
            return derived[-1]
        return int.from_bytes(external, "big") if _is_kvgate_hash(external) else None


def _is_kvgate_hash(external: ExternalBlockHash) -> bool:
    return isinstance(external, bytes) and len(external) == KVGATE_HASH_BYTES
