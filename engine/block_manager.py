"""A fixed pool of KV blocks with reference counts and an automatic prefix cache.

Invariants (checked by ``assert_invariants``):

* every block is exactly one of: in use (ref count > 0), empty-free (no hash), cached-free
  (ref count 0, hash kept so a later prompt can hit it);
* a hashed block is the one ``_cached`` maps its hash to, and vice versa;
* only full blocks whose KV has been computed carry a hash.

Free blocks keep their contents and hash until they are reused. Allocation takes empty blocks
first, then evicts cached-free blocks least-recently-freed first; a sequence frees its blocks
tail first, so its tail is evicted before its head.
"""

from collections import OrderedDict, deque
from dataclasses import dataclass

from engine.sequence import Sequence
from radix.blocks import blocks_for
from radix.hashing import BlockHash, extend_block_hashes, hash_to_bytes
from radix.kv_event_format import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: BlockHash | None = None
    token_ids: tuple[int, ...] = ()
    """The tokens whose KV the block holds, compared on a hash hit."""


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, model_name: str) -> None:
        self.block_size = block_size
        self.model_name = model_name
        self.blocks = [Block(block_id) for block_id in range(num_blocks)]
        self._empty: deque[int] = deque(range(num_blocks))
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._cached: dict[BlockHash, int] = {}
        self.events: list[KVEvent] = []
        """KV events not yet published; the engine drains them after every step."""

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take (empty plus cached-free)."""
        return len(self._empty) + len(self._evictable)

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that a prompt can hit, in use or not."""
        return len(self._cached)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use by sequences (vLLM's kv_cache_usage_perc)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.block_size)

    def allocate(self, seq: Sequence) -> bool:
        """Give a waiting sequence blocks for all of ``seq.token_ids``, reusing cached prefix blocks.

        Sets ``seq.num_computed_tokens`` to the tokens found in cache. At least the last token is
        always left to compute, since the model must run on it to sample. Returns False (and
        changes nothing) when the pool cannot hold the sequence now.
        """
        assert not seq.block_table
        hits = self._prefix_hits(seq)
        reviving = sum(1 for block_id in hits if self.blocks[block_id].ref_count == 0)
        num_new = self.blocks_for(len(seq.token_ids)) - len(hits)
        if num_new > self.num_free_blocks - reviving:
            return False
        for block_id in hits:
            self._take(block_id)
        seq.block_table = hits + [self._take_free() for _ in range(num_new)]
        seq.num_computed_tokens = len(hits) * self.block_size
        seq.num_registered_blocks = len(hits)
        return True

    def can_append(self, seq: Sequence) -> bool:
        """Whether the pool can cover every token of ``seq`` (a decode may need one more block)."""
        return self.blocks_for(len(seq.token_ids)) - len(seq.block_table) <= self.num_free_blocks

    def append_slots(self, seq: Sequence) -> None:
        """Grow ``seq.block_table`` to cover all its tokens; call after ``can_append``."""
        while len(seq.block_table) < self.blocks_for(len(seq.token_ids)):
            seq.block_table.append(self._take_free())

    def register_computed_blocks(self, seq: Sequence) -> None:
        """Offer the sequence's newly computed full blocks to the prefix cache."""
        num_full = seq.num_computed_tokens // self.block_size
        if num_full <= seq.num_registered_blocks:
            return
        computed = seq.token_ids[: num_full * self.block_size]
        extend_block_hashes(seq.block_hashes, computed, self.block_size, self.model_name, seq.cache_salt)
        stored: list[int] = []
        for index in range(seq.num_registered_blocks, num_full):
            block = self.blocks[seq.block_table[index]]
            block_hash = seq.block_hashes[index]
            if block.block_hash is not None or block_hash in self._cached:
                continue
            block.block_hash = block_hash
            block.token_ids = tuple(seq.token_ids[index * self.block_size : (index + 1) * self.block_size])
            self._cached[block_hash] = block.block_id
            stored.append(index)
        if stored:
            self._emit_stored(seq, stored)
        seq.num_registered_blocks = num_full

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references, tail block first; hashed blocks stay cached."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.block_hash is None:
                    self._empty.append(block_id)
                else:
                    self._evictable[block_id] = None
        seq.block_table = []
        seq.num_registered_blocks = 0

    def reset_prefix_cache(self) -> None:
        """Forget every hash; blocks in use keep serving their sequences but can no longer be hit."""
        for block_id in self._cached.values():
            block = self.blocks[block_id]
            block.block_hash = None
            block.token_ids = ()
        self._cached.clear()
        self._empty.extend(self._evictable)
        self._evictable.clear()
        self.events.append(AllBlocksCleared())

    def drain_events(self) -> list[KVEvent]:
        events, self.events = self.events, []
        return events

    def assert_invariants(self) -> None:
        empty, evictable = set(self._empty), set(self._evictable)
        assert len(empty) == len(self._empty), "a block is twice in the empty list"
        assert not empty & evictable, "a block is both empty-free and cached-free"
        in_use = {block.block_id for block in self.blocks if block.ref_count > 0}
        assert all(block.ref_count >= 0 for block in self.blocks), "negative ref count"
        assert not in_use & (empty | evictable), "a free block is referenced"
        assert len(empty) + len(evictable) + len(in_use) == self.num_blocks, "a block is lost"
        assert all(self.blocks[block_id].block_hash is None for block_id in empty), "an empty block has a hash"
        assert all(self.blocks[block_id].block_hash is not None for block_id in evictable), (
            "cached-free block without hash"
        )
        for block_hash, block_id in self._cached.items():
            assert self.blocks[block_id].block_hash == block_hash, "hash map and block disagree"
        hashed = sum(1 for block in self.blocks if block.block_hash is not None)
        assert hashed == len(self._cached), "a hashed block is missing from the hash map"

    def _prefix_hits(self, seq: Sequence) -> list[int]:
        """Cached blocks matching the sequence's leading full blocks, token ids compared."""
        max_hit_blocks = (len(seq.token_ids) - 1) // self.block_size
        extend_block_hashes(seq.block_hashes, seq.token_ids, self.block_size, self.model_name, seq.cache_salt)
        hits: list[int] = []
        for index in range(max_hit_blocks):
            block_id = self._cached.get(seq.block_hashes[index])
            start = index * self.block_size
            if block_id is None or self.blocks[block_id].token_ids != tuple(
                seq.token_ids[start : start + self.block_size]
            ):
                break
            hits.append(block_id)
        return hits

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._evictable[block_id]
        block.ref_count += 1

    def _take_free(self) -> int:
        if self._empty:
            block_id = self._empty.popleft()
        else:
            block_id, _ = self._evictable.popitem(last=False)
            self._evict(self.blocks[block_id])
        self.blocks[block_id].ref_count = 1
        return block_id

    def _evict(self, block: Block) -> None:
        assert block.block_hash is not None
        del self._cached[block.block_hash]
        self.events.append(BlockRemoved([hash_to_bytes(block.block_hash)]))
        block.block_hash = None
        block.token_ids = ()

    def _emit_stored(self, seq: Sequence, indices: list[int]) -> None:
        """One BlockStored per run of consecutive newly cached blocks."""
        runs: list[list[int]] = []
        for index in indices:
            if runs and runs[-1][-1] == index - 1:
                runs[-1].append(index)
            else:
                runs.append([index])
        for run in runs:
            parent = seq.block_hashes[run[0] - 1] if run[0] > 0 else None
            self.events.append(
                BlockStored(
                    block_hashes=[hash_to_bytes(seq.block_hashes[index]) for index in run],
                    parent_block_hash=hash_to_bytes(parent) if parent is not None else None,
                    token_ids=seq.token_ids[run[0] * self.block_size : (run[-1] + 1) * self.block_size],
                    block_size=self.block_size,
                )
            )
