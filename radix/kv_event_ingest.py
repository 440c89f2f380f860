"""Apply one replica's KV events to the prefix index, in kvgate's own block hashes.

Engines name blocks with their own hashes: vLLM with 64-bit ints cut from sha256 over blocks of
its own size, the bundled engine with the same 64-bit cut of kvgate's own hash (older bundled
engines sent kvgate's whole hash, 16 bytes). kvgate hashes are re-derived from the events' token
ids along the parent chain, keeping a map from the engine's hash of each block to the kvgate
hashes it covers (an engine block of ``k * block_size`` tokens is ``k`` kvgate blocks); a block
already mapped keeps its derivation (a copy to another tier names it again without its parent).
A prompt's first block is derived from the root of the event's LoRA adapter and of the cache salt
that vLLM's ``extra_keys`` carries on that block, which the bundled engine sends the same way, so
salted requests stay exact. A 16-byte hash over blocks of kvgate's size is taken as kvgate's own.

LoRA: a foreign engine's block cached under an adapter is re-derived from the adapter's root
(``root_hash(model, adapter=...)``, the event's ``lora_name``; an event with only the older
``lora_id`` gets a root of its own, ``lora-id:<id>``), so it never matches a base-model request
or another adapter's. A bundled engine's hashes already have the adapter (and the cache salt)
in their root, so they are taken as they are, like its base-model hashes. Tiers: an event's ``medium`` says where the block lives; None or "GPU"
is the device, any other ("CPU", a disk tier) is host memory, recorded as such in the index so
the router can price a hit there as a copy rather than as free (radix/prefix_index.py).

Limitation: a first block stored without its salt (vLLM's host-tier events may not carry
``extra_keys``) is derived from the unsalted root, unless its hash is already mapped.
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from radix.hashing import BlockHash, hash_block, root_hash
from radix.kv_event_format import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    ExternalBlockHash,
)
from radix.prefix_index import PrefixIndex

log = logging.getLogger(__name__)

KVGATE_HASH_BYTES = 16
_DEVICE, _HOST = 1, 2
"""Tier bits of ``KVEventApplier._tiers``."""


def is_host_medium(medium: str | None) -> bool:
    """Whether an event's ``medium`` is off the device (None, as older vLLM sends, is the device)."""
    return medium is not None and medium.upper() != MEDIUM_GPU


def adapter_of(event: BlockStored) -> str | None:
    """The LoRA adapter whose hashes the event's blocks carry (None: the base model)."""
    if event.lora_name:
        return event.lora_name
    return f"lora-id:{event.lora_id}" if event.lora_id is not None else None


def salt_of(event: BlockStored) -> str | None:
    """The cache salt of a prompt's first block: in vLLM's ``extra_keys`` for that block, the
    string that follows the LoRA name (vLLM lists the adapter, multimodal keys, then the salt)."""
    if event.parent_block_hash is not None or not event.extra_keys:
        return None
    keys = event.extra_keys[0]
    if not isinstance(keys, list | tuple):
        return None
    strings = [key for key in keys if isinstance(key, str)]
    if strings and event.lora_name and strings[0] == event.lora_name:
        strings = strings[1:]
    return strings[-1] if strings else None


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
        self._model = model
        self._roots: dict[str | None, BlockHash] = {None: root_hash(model)}
        self._clock = clock
        self._derived: dict[ExternalBlockHash, tuple[BlockHash, ...]] = {}
        self._tiers: dict[ExternalBlockHash, int] = {}
        """Tiers (``_DEVICE | _HOST``) each derived engine block is stored in: its derivation is
        kept until it has left all of them."""

    def apply(self, batch: EventBatch) -> None:
        self.counters.batches += 1
        now = self._clock()
        waiting: dict[ExternalBlockHash, list[BlockStored]] = {}
        removed: list[BlockRemoved] = []
        for event in batch.events:
            if isinstance(event, BlockRemoved) and (not removed or removed[-1].medium == event.medium):
                removed.append(event)
                continue
            if removed:
                self._removed(removed)
                removed = [event] if isinstance(event, BlockRemoved) else []
            if isinstance(event, BlockStored):
                self._stored_or_wait(event, now, waiting)
            elif isinstance(event, AllBlocksCleared):
                self._give_up(waiting)
                self.clear()
        if removed:
            self._removed(removed)
        self._give_up(waiting)

    def _stored_or_wait(
        self, event: BlockStored, now: float, waiting: dict[ExternalBlockHash, list[BlockStored]]
    ) -> None:
        """Apply ``event``, then the events of this batch that waited for its blocks. An event whose
        parent is not known yet waits for it: a snapshot lists blocks least recently used first,
        so a prompt's tail before its head."""
        ready = [event]
        while ready:
            current = ready.pop()
            parent = current.parent_block_hash
            if parent is not None and parent not in self._derived and not _is_kvgate_hash(parent):
                waiting.setdefault(parent, []).append(current)
                continue
            self._stored(current, now)
            for external in current.block_hashes:
                ready.extend(waiting.pop(external, ()))

    def _give_up(self, waiting: dict[ExternalBlockHash, list[BlockStored]]) -> None:
        """Events whose parent never came are orphans (events were missed)."""
        self.counters.orphans += sum(len(events) for events in waiting.values())
        waiting.clear()

    def clear(self) -> None:
        """The replica's cache is empty (it said so, or it restarted)."""
        self.counters.clears += 1
        self._derived.clear()
        self._tiers.clear()
        self.index.clear(self.replica)
        if self.speculative is not None:
            self.speculative.clear(self.replica)

    def _stored(self, event: BlockStored, now: float) -> None:
        hashes = self._kvgate_hashes(event)
        if hashes is None:
            return
        on_host = is_host_medium(event.medium)
        tier = _HOST if on_host else _DEVICE
        for external in event.block_hashes:
            if external in self._derived:
                self._tiers[external] = self._tiers.get(external, 0) | tier
        self.engine_block_size = event.block_size
        self.index.insert(self.replica, hashes, now, on_host)
        if self.speculative is not None:
            self.speculative.remove(self.replica, hashes)
        self.counters.blocks_stored += len(hashes)

    def _removed(self, run: list[BlockRemoved]) -> None:
        """A run of consecutive removals from one medium, applied as one: engines send one event
        per evicted block (vLLM does), and one index call per block cost ~10x as much."""
        hashes: list[BlockHash] = []
        medium = run[0].medium
        on_host = None if medium is None else is_host_medium(medium)
        for external in (external for event in run for external in event.block_hashes):
            derived = self._derived.get(external)
            if derived is not None:
                hashes.extend(derived)
                self._forget_tier(external, on_host)
            elif isinstance(external, bytes) and _is_kvgate_hash(external):
                hashes.append(int.from_bytes(external, "big"))
            else:
                self.counters.unknown_removals += 1
        self.index.remove(self.replica, hashes, on_host)
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
            return [int.from_bytes(external, "big") for external in event.block_hashes if isinstance(external, bytes)]
        parent = self._parent_hash(event.parent_block_hash, adapter_of(event), salt_of(event))
        if parent is None:
            self.counters.orphans += 1
            return None
        hashes: list[BlockHash] = []
        per_engine_block = engine_size // self.block_size
        for position, external in enumerate(event.block_hashes):
            known = self._derived.get(external)
            if known is not None:
                hashes.extend(known)
                parent = known[-1]
                continue
            covered: list[BlockHash] = []
            for sub in range(per_engine_block):
                start = (position * per_engine_block + sub) * self.block_size
                parent = hash_block(parent, event.token_ids[start : start + self.block_size])
                covered.append(parent)
            self._derived[external] = tuple(covered)
            hashes.extend(covered)
        return hashes

    def _parent_hash(
        self, external: ExternalBlockHash | None, adapter: str | None, salt: str | None
    ) -> BlockHash | None:
        if external is None:
            if salt is not None:
                return root_hash(self._model, salt, adapter)
            root = self._roots.get(adapter)
            if root is None:
                root = self._roots[adapter] = root_hash(self._model, adapter=adapter)
            return root
        derived = self._derived.get(external)
        if derived is not None:
            return derived[-1]
        if isinstance(external, bytes) and _is_kvgate_hash(external):
            return int.from_bytes(external, "big")
        return None

    def _forget_tier(self, external: ExternalBlockHash, on_host: bool | None) -> None:
        """The engine block left a tier (None: every tier); drop its derivation once it is in none."""
        left = self._tiers.get(external, 0)
        if on_host is not None:
            left &= ~(_HOST if on_host else _DEVICE)
        if left:
            self._tiers[external] = left
        else:
            self._tiers.pop(external, None)
            del self._derived[external]


def _is_kvgate_hash(external: ExternalBlockHash) -> bool:
    return isinstance(external, bytes) and len(external) == KVGATE_HASH_BYTES
