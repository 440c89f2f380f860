"""A fixed pool of KV blocks with reference counts, an automatic prefix cache and a host tier.

Invariants (checked by ``assert_invariants``):

* every block is exactly one of: in use (ref count > 0), empty-free (no hash), cached-free
  (ref count 0, hash kept so a later prompt can hit it);
* a hashed block is the one ``_cached`` maps its hash to, and vice versa;
* only full blocks whose KV has been computed carry a hash;
* a block hash is cached in one tier at most: on the device or in the host pool;
* a cached-free block is in the wanted queue iff a queued sequence will hit it, else in the
  retained queue iff an active session's latest turn holds it;
* outside ``allocate`` no host slot is claimed, and ``transfers`` are drained every step.

Free blocks keep their contents and hash until they are reused. Allocation takes empty blocks
first, then evicts cached-free blocks least-recently-freed first: those nothing wants, then
those an active session retains (see engine/core/session_retention.py), then, last, those a queued
prompt will hit (``want_prefix``): a router sent that prompt here for its prefix, and a burst of
long prompts admitted ahead of it must not evict it (SGLang's radix cache likewise keeps a
queued request's match). A sequence frees its blocks tail first, so its tail is evicted before
its head. The full prompt blocks running sequences are still computing are known
(``waits_for_prefix``), so a queued prompt that shares them waits for them instead of computing
them a second time.

With a host pool, an evicted block is copied to host memory instead of being dropped, and a
prompt whose prefix continues in the host pool gets those blocks copied back ("host hits";
they count as cached tokens, as a KV connector's hits do in vLLM). The copies are queued in
``transfers`` in decision order; the runner performs them, in that order, before the step's
forward pass, so a copy never reads a block or slot that a later decision reused.
"""

from collections import Counter, OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass

from engine.core.host_kv_pool import HostKVPool
from engine.core.sequence import Sequence
from engine.core.session_retention import SessionRetention
from engine.model.lora_modules import LoRARef
from engine.model.runner_api import BlockTransfer
from radix.blocks import blocks_for
from radix.hashing import BlockHash, extend_block_hashes, hash_to_bytes
from radix.kv_event_format import MEDIUM_CPU, MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KVEvent


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: BlockHash | None = None
    token_ids: tuple[int, ...] = ()
    """The tokens whose KV the block holds, compared on a hash hit."""
    parent_hash: BlockHash | None = None
    """The hash of the block before it in its prompt (None for a first block)."""
    lora: LoRARef | None = None
    """The LoRA adapter its KV was computed under (None: the base model)."""
    cache_salt: str | None = None
    """A first block's cache salt (its KV events name it, so consumers can derive its hash)."""


@dataclass(frozen=True)
class _HostHit:
    index: int
    """Position of the block in the sequence."""


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        model_name: str,
        host_blocks: int = 0,
        retention: SessionRetention | None = None,
    ) -> None:
        self.block_size = block_size
        self.model_name = model_name
        self.blocks = [Block(block_id) for block_id in range(num_blocks)]
        self._empty: deque[int] = deque(range(num_blocks))
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._retained: OrderedDict[int, None] = OrderedDict()
        """Cached-free blocks of active sessions' latest turns: evicted only after ``_evictable``."""
        self._wanted_free: OrderedDict[int, None] = OrderedDict()
        """Cached-free blocks a queued sequence will hit: evicted only when nothing else is free."""
        self._wants: dict[BlockHash, int] = {}
        """Per cached hash, the queued sequences that will hit it."""
        self._computing: dict[BlockHash, int] = {}
        """Per hash, the running sequences computing that full prompt block (not yet cached)."""
        self._cached: dict[BlockHash, int] = {}
        self.host = HostKVPool(host_blocks)
        self.retention = retention
        self.transfers: list[BlockTransfer] = []
        """Copies between device blocks and host slots the runner must do before the next forward."""
        self.num_host_hit_blocks = 0
        """Blocks copied back from the host pool instead of being recomputed, since start."""
        self.events: list[KVEvent] = []
        """KV events not yet published; the engine drains them after every step."""

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take (empty plus cached-free)."""
        return len(self._empty) + self.num_cached_free_blocks

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self._evictable) + len(self._retained) + len(self._wanted_free)

    @property
    def num_retained_free_blocks(self) -> int:
        return len(self._retained)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks on the device that a prompt can hit, in use or not."""
        return len(self._cached)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use by sequences (vLLM's kv_cache_usage_perc)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.block_size)

    def allocate(self, seq: Sequence) -> bool:
        """Give a waiting sequence blocks for all of ``seq.token_ids``, reusing cached prefix blocks.

        Sets ``seq.num_computed_tokens`` to the tokens found in cache (device and host tier) and
        ``seq.num_host_hit_tokens`` to those of the host tier. At least the last token is always
        left to compute, since the model must run on it to sample. Returns False (and changes
        nothing) when the pool cannot hold the sequence now.
        """
        assert not seq.block_table
        hits = self._prefix_hits(seq)
        device_hits = [hit for hit in hits if isinstance(hit, int)]
        reviving = sum(1 for block_id in device_hits if self.blocks[block_id].ref_count == 0)
        num_new = self.blocks_for(len(seq.token_ids)) - len(device_hits)
        if num_new > self.num_free_blocks - reviving:
            return False
        for block_id in device_hits:
            self._take(block_id)
        host_hits = [hit for hit in hits if isinstance(hit, _HostHit)]
        claimed = [self.host.claim(seq.block_hashes[hit.index]) for hit in host_hits]
        table: list[int] = []
        for hit in hits:
            table.append(hit if isinstance(hit, int) else self._take_free())
        for hit, entry in zip(host_hits, claimed, strict=True):
            self._revive_from_host(seq, hit.index, table[hit.index], entry.slot)
            self.host.release(entry.slot)
        if host_hits:
            self.events.append(
                BlockRemoved([hash_to_bytes(seq.block_hashes[hit.index]) for hit in host_hits], MEDIUM_CPU)
            )
            self._emit_stored(seq, [hit.index for hit in host_hits])
            self.num_host_hit_blocks += len(host_hits)
        seq.block_table = table + [self._take_free() for _ in range(num_new - len(host_hits))]
        seq.num_computed_tokens = len(hits) * self.block_size
        seq.num_host_hit_tokens = len(host_hits) * self.block_size
        seq.num_registered_blocks = len(hits)
        self.release_wants(seq)
        seq.computing = (len(hits), len(seq.token_ids) // self.block_size)
        for index in range(*seq.computing):
            block_hash = seq.block_hashes[index]
            self._computing[block_hash] = self._computing.get(block_hash, 0) + 1
        return True

    def want_prefix(self, seq: Sequence) -> None:
        """A sequence was queued: the cached prefix it will hit is evicted last until it is admitted
        or leaves (``release_wants``); a router sent it here for that prefix. Its free blocks join
        the wanted queue tail first, so that if even they must go, the tail goes before the head."""
        wanted = []
        for block_hash in self._hit_candidates(seq):
            if block_hash not in self._cached:
                break
            wanted.append(block_hash)
            self._wants[block_hash] = self._wants.get(block_hash, 0) + 1
        for block_hash in reversed(wanted):
            block_id = self._cached[block_hash]
            if block_id in self._evictable or block_id in self._retained:
                self._evictable.pop(block_id, None)
                self._retained.pop(block_id, None)
                self._wanted_free[block_id] = None
        seq.wanted_hashes = wanted

    def release_wants(self, seq: Sequence) -> None:
        """The sequence left the queue (admitted, aborted): its prefix is evicted as any other
        (rejoining the LRU tail first, so its tail still goes before its head)."""
        for block_hash in reversed(seq.wanted_hashes):
            count = self._wants.pop(block_hash, 0) - 1
            if count > 0:
                self._wants[block_hash] = count
                continue
            block_id = self._cached.get(block_hash)
            if block_id is not None and block_id in self._wanted_free:
                del self._wanted_free[block_id]
                self._free_queue(block_hash)[block_id] = None
        seq.wanted_hashes = []

    def waits_for_prefix(self, seq: Sequence) -> bool:
        """Whether the next block the queued ``seq`` would compute is one a running sequence is
        computing now: admitted now, it would compute that block a second time."""
        if not self._computing:
            return False
        candidates = self._hit_candidates(seq)
        found = len(self._prefix_hits(seq))
        return found < len(candidates) and candidates[found] in self._computing

    def awaited_block(self, seq: Sequence) -> BlockHash | None:
        """The block a running sequence is computing that the queued ``seq`` would compute next, if
        any: ``waits_for_prefix`` by hashes alone, for load reports. The prefix ``seq`` found cached
        when it was queued is held for it (``want_prefix``), so the scan starts past it."""
        if not self._computing:
            return None
        for index in range(len(seq.wanted_hashes), self._num_hit_candidates(seq)):
            block_hash = seq.block_hashes[index]
            if block_hash in self._cached:
                continue
            return block_hash if block_hash in self._computing else None
        return None

    def _hit_candidates(self, seq: Sequence) -> list[BlockHash]:
        """Hashes of the leading full blocks a prompt may hit (never its last token's block)."""
        return seq.block_hashes[: self._num_hit_candidates(seq)]

    def _num_hit_candidates(self, seq: Sequence) -> int:
        """How many of ``seq.block_hashes`` (hashed here as far as needed) a prompt may hit."""
        extend_block_hashes(
            seq.block_hashes, seq.token_ids, self.block_size, self.model_name, seq.cache_salt, seq.adapter_name
        )
        return (len(seq.token_ids) - 1) // self.block_size

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
        self._stop_computing(seq, num_full)
        if num_full <= seq.num_registered_blocks:
            return
        computed = seq.token_ids[: num_full * self.block_size]
        extend_block_hashes(
            seq.block_hashes, computed, self.block_size, self.model_name, seq.cache_salt, seq.adapter_name
        )
        stored: list[int] = []
        for index in range(seq.num_registered_blocks, num_full):
            block = self.blocks[seq.block_table[index]]
            block_hash = seq.block_hashes[index]
            if block.block_hash is not None or block_hash in self._cached:
                continue
            if self.host.discard(block_hash):
                self.events.append(BlockRemoved([hash_to_bytes(block_hash)], MEDIUM_CPU))
            self._set_hash(seq, index, block)
            stored.append(index)
        if stored:
            self._emit_stored(seq, stored)
        seq.num_registered_blocks = num_full

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references, tail block first; hashed blocks stay cached.

        A sequence of a session first becomes that session's latest turn, so its blocks are
        retained as they are freed.
        """
        self._stop_computing(seq, seq.computing[1])
        if self.retention is not None and seq.session is not None:
            hashes = seq.block_hashes[: seq.num_registered_blocks]
            stale, pushed_out, retained = self.retention.record_turn(seq.session, hashes, seq.session_ttl_s)
            self._apply_retention(stale, retained, pushed_out)
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table = []
        seq.num_registered_blocks = 0

    def pin(self, block_ids: list[int]) -> None:
        """Keep blocks in use past their sequence (a KV transfer holds them): they stay cached and
        cannot be evicted until ``unpin``."""
        for block_id in block_ids:
            self._take(block_id)

    def unpin(self, block_ids: list[int]) -> None:
        """Drop the references ``pin`` (or ``install_remote``) took, tail block first, as ``free`` does."""
        for block_id in reversed(block_ids):
            self._release(block_id)

    def num_prefix_hit_blocks(self, seq: Sequence) -> int:
        """How many of the prompt's leading full blocks are cached here (device or host tier)."""
        return len(self._prefix_hits(seq))

    def install_remote(self, seq: Sequence, first: int, count: int) -> list[tuple[int, int]]:
        """Take device blocks for the prompt's full blocks ``first .. first + count``, whose KV was
        computed by another engine, and cache them under the sequence's hashes (BlockStored).

        Returns ``(index in the prompt, block id)`` of each block taken, with a reference held: the
        caller writes their bytes, queues the sequence, then ``unpin``s them. Blocks already cached
        on the device are skipped (a host-tier copy gives way to the arriving one). Stops, rather
        than evict a prefix a queued prompt wants, when no other block is free. Host-tier copies
        of evicted blocks land in ``transfers``: run them before writing the bytes.
        """
        candidates = self._hit_candidates(seq)
        taken: list[tuple[int, int]] = []
        for index in range(first, min(first + count, len(candidates))):
            block_hash = candidates[index]
            if block_hash in self._cached:
                continue
            if not (self._empty or self._evictable or self._retained):
                break
            if self.host.discard(block_hash):
                self.events.append(BlockRemoved([hash_to_bytes(block_hash)], MEDIUM_CPU))
            block_id = self._take_free()
            self._set_hash(seq, index, self.blocks[block_id])
            taken.append((index, block_id))
        if taken:
            self._emit_stored(seq, [index for index, _ in taken])
        return taken

    def uninstall(self, taken: list[tuple[int, int]]) -> None:
        """Undo ``install_remote`` when the bytes could not be written: forget the blocks' hashes
        (BlockRemoved) and drop the references it took."""
        for _, block_id in taken:
            block = self.blocks[block_id]
            assert block.block_hash is not None
            del self._cached[block.block_hash]
            self.events.append(BlockRemoved([hash_to_bytes(block.block_hash)], MEDIUM_GPU))
            block.block_hash = None
            block.token_ids = ()
            block.parent_hash = None
            block.lora = None
            block.cache_salt = None
        self.unpin([block_id for _, block_id in taken])

    def reset_prefix_cache(self) -> None:
        """Forget every hash, in both tiers; blocks in use keep serving their sequences but can no longer be hit."""
        for block_id in self._cached.values():
            block = self.blocks[block_id]
            block.block_hash = None
            block.token_ids = ()
            block.parent_hash = None
            block.lora = None
            block.cache_salt = None
        self._cached.clear()
        self._empty.extend(self._evictable)
        self._empty.extend(self._retained)
        self._empty.extend(self._wanted_free)
        self._evictable.clear()
        self._retained.clear()
        self._wanted_free.clear()
        self.host.clear()
        if self.retention is not None:
            self.retention.clear()
        self.events.append(AllBlocksCleared())

    def take_transfers(self) -> list[BlockTransfer]:
        """The copies decided since the last call, in the order they must run."""
        transfers, self.transfers = self.transfers, []
        return transfers

    def snapshot(self) -> list[BlockStored]:
        """One BlockStored per cached block, least recently used first (the host tier's, then the
        device's cached-free blocks in eviction order, then blocks in use, deepest first), so a
        consumer's LRU order matches ours."""
        in_use = [block for block in self.blocks if block.block_hash is not None and block.ref_count > 0]
        depth: dict[BlockHash, int] = {}

        def depth_of(block: Block) -> int:
            chain = []
            while block.block_hash is not None and block.block_hash not in depth:
                chain.append(block.block_hash)
                parent_id = self._cached.get(block.parent_hash) if block.parent_hash is not None else None
                if parent_id is None:
                    break
                block = self.blocks[parent_id]
            base = depth.get(block.block_hash, 0) if block.block_hash is not None else 0
            for offset, block_hash in enumerate(reversed(chain)):
                depth[block_hash] = base + offset + 1
            return depth[chain[0]] if chain else base

        in_use.sort(key=depth_of, reverse=True)
        device = [self.blocks[block_id] for block_id in (*self._evictable, *self._retained)] + in_use
        host = [
            _stored(
                self.block_size,
                block_hash,
                entry.parent_hash,
                entry.token_ids,
                MEDIUM_CPU,
                entry.lora,
                entry.cache_salt,
            )
            for block_hash, entry in self.host.entries()
        ]
        return host + [
            _stored(
                self.block_size,
                block.block_hash,
                block.parent_hash,
                block.token_ids,
                MEDIUM_GPU,
                block.lora,
                block.cache_salt,
            )
            for block in device
            if block.block_hash is not None
        ]

    def drain_events(self) -> list[KVEvent]:
        events, self.events = self.events, []
        return events

    def assert_invariants(self, queued: Iterable[Sequence] = (), running: Iterable[Sequence] = ()) -> None:
        """The invariants above; with the scheduler's ``queued`` and ``running`` sequences, also
        that the wanted prefixes are exactly the queued ones' and the blocks being computed
        exactly the running ones' (no want or computing count outlives its sequence)."""
        wants: Counter[BlockHash] = Counter(block_hash for seq in queued for block_hash in seq.wanted_hashes)
        computing: Counter[BlockHash] = Counter(
            seq.block_hashes[index] for seq in running for index in range(*seq.computing)
        )
        if wants or computing or queued or running:
            assert wants == Counter(self._wants), "a want without its queued sequence, or one missing"
            assert computing == Counter(self._computing), "a computing block without its running sequence"
        empty, evictable, retained = set(self._empty), set(self._evictable), set(self._retained)
        wanted = set(self._wanted_free)
        assert len(empty) == len(self._empty), "a block is twice in the empty list"
        assert not empty & evictable, "a block is both empty-free and cached-free"
        assert not (empty | evictable) & retained, "a retained block is also in another free list"
        assert not (empty | evictable | retained) & wanted, "a wanted block is also in another free list"
        assert all(count > 0 for count in self._wants.values()), "a want count is not positive"
        assert all(count > 0 for count in self._computing.values()), "a computing count is not positive"
        for block_id in evictable | retained | wanted:
            free_hash = self.blocks[block_id].block_hash
            assert (free_hash in self._wants) == (block_id in wanted), "a wanted block in the wrong free queue"
        free = empty | evictable | retained | wanted
        in_use = {block.block_id for block in self.blocks if block.ref_count > 0}
        assert all(block.ref_count >= 0 for block in self.blocks), "negative ref count"
        assert not in_use & free, "a free block is referenced"
        assert len(free) + len(in_use) == self.num_blocks, "a block is lost"
        assert all(self.blocks[block_id].block_hash is None for block_id in empty), "an empty block has a hash"
        assert all(self.blocks[block_id].block_hash is not None for block_id in evictable | retained | wanted), (
            "cached-free block without hash"
        )
        for block_hash, block_id in self._cached.items():
            assert self.blocks[block_id].block_hash == block_hash, "hash map and block disagree"
        hashed = sum(1 for block in self.blocks if block.block_hash is not None)
        assert hashed == len(self._cached), "a hashed block is missing from the hash map"
        assert not set(self.host.hashes()) & set(self._cached), "a block is cached on device and host at once"
        self.host.assert_invariants()
        assert not self.transfers, "copies were decided but never handed to the runner"
        if self.retention is None:
            assert not retained, "retained blocks without retention"
            return
        self.retention.assert_invariants()
        for block_id in retained | evictable:
            free_hash = self.blocks[block_id].block_hash
            assert free_hash is not None
            assert self.retention.is_retained(free_hash) == (block_id in retained), "a block in the wrong free queue"

    def _prefix_hits(self, seq: Sequence) -> list[int | _HostHit]:
        """Cached blocks matching the sequence's leading full blocks, token ids compared.

        A device hit is its block id; a block found in the host pool is a ``_HostHit``.
        """
        hits: list[int | _HostHit] = []
        for index, block_hash in enumerate(self._hit_candidates(seq)):
            tokens = self._block_tokens(seq, index)
            block_id = self._cached.get(block_hash)
            if block_id is not None and self.blocks[block_id].token_ids == tokens:
                hits.append(block_id)
            elif block_id is None and self.host.find(block_hash, tokens):
                hits.append(_HostHit(index))
            else:
                break
        return hits

    def _block_tokens(self, seq: Sequence, index: int) -> tuple[int, ...]:
        start = index * self.block_size
        return tuple(seq.token_ids[start : start + self.block_size])

    def _set_hash(self, seq: Sequence, index: int, block: Block) -> None:
        block_hash = seq.block_hashes[index]
        block.block_hash = block_hash
        block.token_ids = self._block_tokens(seq, index)
        block.parent_hash = seq.block_hashes[index - 1] if index > 0 else None
        block.lora = seq.adapter
        block.cache_salt = seq.cache_salt if index == 0 else None
        self._cached[block_hash] = block.block_id

    def _revive_from_host(self, seq: Sequence, index: int, block_id: int, slot: int) -> None:
        """Queue the copy of host slot ``slot`` into device block ``block_id`` and cache it there."""
        self.transfers.append(BlockTransfer(to_host=False, device_block=block_id, host_slot=slot))
        self._set_hash(seq, index, self.blocks[block_id])

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            for queue in (self._evictable, self._retained, self._wanted_free):
                if block_id in queue:
                    del queue[block_id]
                    break
        block.ref_count += 1

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            if block.block_hash is None:
                self._empty.append(block_id)
            else:
                self._free_queue(block.block_hash)[block_id] = None

    def _free_queue(self, block_hash: BlockHash) -> OrderedDict[int, None]:
        """Where a cached block goes when its last user frees it."""
        if block_hash in self._wants:
            return self._wanted_free
        if self.retention is not None and self.retention.is_retained(block_hash):
            return self._retained
        return self._evictable

    def _stop_computing(self, seq: Sequence, up_to: int) -> None:
        """The sequence's full prompt blocks before index ``up_to`` are computed (or never will be)."""
        start, end = seq.computing
        stop = min(up_to, end)
        for index in range(start, stop):
            block_hash = seq.block_hashes[index]
            count = self._computing.pop(block_hash) - 1
            if count:
                self._computing[block_hash] = count
        seq.computing = (max(start, stop), end)

    def _take_free(self) -> int:
        if self._empty:
            block_id = self._empty.popleft()
        else:
            block_id = self._pop_cached_free()
            self._evict(self.blocks[block_id])
        self.blocks[block_id].ref_count = 1
        return block_id

    def _pop_cached_free(self) -> int:
        """The next cached-free block to evict: one-shots first, then retained turns, then the
        prefixes queued prompts will hit."""
        if self._retained and self.retention is not None:
            self._apply_retention(self.retention.expire(), [])
        queue = self._evictable or self._retained or self._wanted_free
        block_id, _ = queue.popitem(last=False)
        return block_id

    def _apply_retention(
        self, released: list[BlockHash], retained: list[BlockHash], pushed_out: Iterable[BlockHash] = ()
    ) -> None:
        """Move cached-free blocks between the two queues as hashes lose or gain retention.

        A stale block (a superseded turn, an expired session) goes to the old end of the evictable
        queue: it has waited longest. A block whose session the retention bound pushed out goes to
        the new end: it may be as hot as anything there (a system prompt many sessions share), and
        sending it to the front made it the first to go, below one-shot blocks.
        """
        for block_hash in released:
            block_id = self._cached.get(block_hash)
            if block_id is not None and block_id in self._retained:
                del self._retained[block_id]
                self._evictable[block_id] = None
                self._evictable.move_to_end(block_id, last=False)
        for block_hash in pushed_out:
            block_id = self._cached.get(block_hash)
            if block_id is not None and block_id in self._retained:
                del self._retained[block_id]
                self._evictable[block_id] = None
        for block_hash in retained:
            block_id = self._cached.get(block_hash)
            if block_id is not None and block_id in self._evictable:
                del self._evictable[block_id]
                self._retained[block_id] = None

    def _evict(self, block: Block) -> None:
        """Drop the block's hash from the device cache; with a host pool, move the block there."""
        assert block.block_hash is not None
        block_hash = block.block_hash
        del self._cached[block_hash]
        self.events.append(BlockRemoved([hash_to_bytes(block_hash)], MEDIUM_GPU))
        stored = (
            self.host.store(block_hash, block.token_ids, block.parent_hash, block.lora, block.cache_salt)
            if self.host.num_slots
            else None
        )
        if stored is not None:
            slot, displaced = stored
            if displaced is not None:
                self.events.append(BlockRemoved([hash_to_bytes(displaced)], MEDIUM_CPU))
            self.transfers.append(BlockTransfer(to_host=True, device_block=block.block_id, host_slot=slot))
            self.events.append(
                _stored(
                    self.block_size,
                    block_hash,
                    block.parent_hash,
                    block.token_ids,
                    MEDIUM_CPU,
                    block.lora,
                    block.cache_salt,
                )
            )
        block.block_hash = None
        block.token_ids = ()
        block.parent_hash = None
        block.lora = None
        block.cache_salt = None

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
                    lora_id=seq.adapter.lora_id if seq.adapter is not None else None,
                    lora_name=seq.adapter_name,
                    extra_keys=_extra_keys(seq, run),
                )
            )


def _extra_keys(seq: Sequence, run: list[int]) -> list[tuple[str, ...] | None] | None:
    """vLLM's ``extra_keys`` of the run's blocks: what their hashes cover besides token ids (the
    adapter on every block, the cache salt on the first), so a consumer can derive them."""
    keys = [_block_keys(seq.adapter_name, seq.cache_salt if index == 0 else None) for index in run]
    return keys if any(keys) else None


def _block_keys(adapter: str | None, cache_salt: str | None) -> tuple[str, ...] | None:
    keys = tuple(key for key in (adapter, cache_salt) if key)
    return keys or None


def _stored(
    block_size: int,
    block_hash: BlockHash,
    parent_hash: BlockHash | None,
    token_ids: tuple[int, ...],
    medium: str,
    lora: LoRARef | None,
    cache_salt: str | None = None,
) -> BlockStored:
    """One block's BlockStored; an adapter's block carries its ``lora_id`` and ``lora_name`` as vLLM's do,
    and ``extra_keys`` names the adapter and a first block's salt."""
    keys = _block_keys(lora.name if lora is not None else None, cache_salt)
    return BlockStored(
        block_hashes=[hash_to_bytes(block_hash)],
        parent_block_hash=hash_to_bytes(parent_hash) if parent_hash is not None else None,
        token_ids=list(token_ids),
        block_size=block_size,
        lora_id=lora.lora_id if lora is not None else None,
        medium=medium,
        lora_name=lora.name if lora is not None else None,
        extra_keys=[keys] if keys else None,
    )
