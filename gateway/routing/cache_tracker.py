"""What the router believes each replica's KV cache holds.

Per replica, one of two modes:
- predicted (no ``kv_events``): after routing, the request's blocks are inserted under the
  chosen replica, whose LRU eviction the index models with the replica's capacity;
- precise (``kv_events: tcp://...``): the replica's KV events drive the index. Between routing a
  request and its BlockStored events arriving, its blocks are speculative entries in a second,
  short-lived index (``speculative_ttl_s``), so a burst of same-prefix requests is not
  scattered. A bundled engine also announces the prompts it has queued (on its load socket);
  they become speculative entries too, so a burst spread over several gateways is not scattered
  either. Salted requests on engines that do not speak kvgate hashes rely on these alone.

Host tiers (precise mode): blocks a replica's events place in host memory (medium "CPU") still
match, but ``priced_cached`` weighs them at ``host_hit_cost`` of a recompute, so routing sees a
host hit as what it is: cheaper than recomputing, dearer than a device hit. Those blocks are
beyond the device's capacity, so precise replicas are not capped by it in the index.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.routing.config import RoutingConfig
from gateway.routing.replica_spec import ReplicaSpec, known_capacity
from radix.kv_event_ingest import KVEventApplier
from radix.kv_event_subscriber import KVEventSubscriber, SubscriberStats
from radix.prefix_index import PrefixIndex, PrefixMatch


@dataclass(frozen=True)
class ReplicaIndexStats:
    mode: str
    """"precise" (KV events) or "predicted" (the router's own guesses)."""
    blocks: int
    speculative_blocks: int


@dataclass(frozen=True)
class IndexStats:
    blocks: int
    """Distinct blocks in the index."""
    replica_blocks: int
    """(block, replica) entries."""
    approx_bytes: int
    evictions: int
    speculative_blocks: int
    per_replica: dict[str, ReplicaIndexStats]
    kv_events: dict[str, SubscriberStats]


class CacheTracker:
    def __init__(
        self,
        config: RoutingConfig,
        block_size: int,
        replicas: list[ReplicaSpec],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.block_size = block_size
        self.index = PrefixIndex(config.max_index_blocks)
        self.speculative = PrefixIndex(config.max_index_blocks)
        self.subscribers: dict[str, KVEventSubscriber] = {}
        self._specs: dict[str, ReplicaSpec] = {}
        self._clock = clock
        self._config = config
        self._running = False
        self.update(config, replicas)

    def is_precise(self, replica: str) -> bool:
        return self._specs[replica].kv_events is not None

    def engine_block_size(self, replica: str) -> int:
        """The replica's KV block size as its events report it; the gateway's until they do."""
        subscriber = self.subscribers.get(replica)
        return subscriber.applier.engine_block_size if subscriber is not None else self.block_size

    def match(self, hashes: list[int]) -> dict[str, int]:
        """Blocks of ``hashes`` each replica holds as a prefix (speculative entries included)."""
        return self.match_prefix(hashes)[0]

    def match_prefix(self, hashes: list[int]) -> tuple[dict[str, int], PrefixMatch]:
        """``match``, with the main index's handle for ``record_routed`` to reuse."""
        found = self.index.match_prefix(hashes)
        matched = dict(found.depths)
        if len(self.speculative):
            self._expire_speculative()
            for replica, blocks in self._speculative_depths(hashes, matched).items():
                if blocks > matched.get(replica, 0):
                    matched[replica] = blocks
        return matched, found

    def _speculative_depths(self, hashes: list[int], stored: dict[str, int]) -> dict[str, int]:
        """Per replica, how far its speculative entries carry the prompt: from the first block, and
        on from the end of what its KV events have stored (``stored``). An event settles the blocks it
        stores, dropping their speculative entries, so a prompt prefilled in chunks has its first
        chunks in the index and the rest speculative only: the rest continues the stored part, or
        a request arriving mid-prefill would see only what was stored so far. A block hash chains
        its prefix, so matching from a later block is matching the same chain."""
        depths = self.speculative.match(hashes)
        continued = {
            start
            for replica, start in stored.items()
            if start < len(hashes) and self.speculative.last_used(replica, hashes[start]) is not None
        }
        for start in continued:
            for replica, blocks in self.speculative.match(hashes[start:]).items():
                if stored.get(replica) == start:
                    depths[replica] = max(depths.get(replica, 0), start + blocks)
        return depths

    def host_blocks(self, hashes: list[int], matched: dict[str, int]) -> dict[str, int]:
        """Of each replica's matched blocks (``match``'s result), those only in its host tier."""
        return self.index.host_blocks(hashes, matched)

    def priced_cached(self, hashes: list[int], matched: dict[str, int], cached: dict[str, int]) -> dict[str, int]:
        """Cached tokens per replica as routing weighs them: a host-tier token counts
        ``1 - host_hit_cost`` of a device hit (it saves the recompute but costs the copy back).

        ``cached`` is the engine-facing prediction (host hits included, as ``cached_tokens`` counts them).
        """
        host = self.host_blocks(hashes, matched)
        if not host:
            return cached
        cost = self._config.host_hit_cost
        priced = dict(cached)
        for replica, blocks in host.items():
            tokens = cached.get(replica, 0)
            if tokens:
                priced[replica] = tokens - round(min(blocks * self.block_size, tokens) * cost)
        return priced

    def record_routed(self, hashes: list[int], replica: str, found: PrefixMatch | None = None) -> None:
        """``found``: ``match_prefix``'s handle for ``hashes``, which spares the index the lookups it made."""
        if self.is_precise(replica):
            self.speculative.insert(replica, hashes, self._clock())
        else:
            self.index.insert(replica, hashes, self._clock(), found=found)

    def record_restart(self, replica: str) -> None:
        """The replica restarted, so its KV cache is empty: a predicted replica's blocks are dropped
        (a precise one's KV-event subscriber sees the publisher restart and does the same from its
        events; clearing here could drop what the new process has already reported)."""
        if replica in self._specs and not self.is_precise(replica):
            self.index.clear(replica)

    def record_pending(self, replica: str, chains: list[list[bytes]]) -> None:
        """The replica says it is about to cache these prompts' blocks (kvgate hashes, from the root):
        speculative entries until its KV events confirm them, as if this gateway had routed them there."""
        if replica not in self._specs or not self.is_precise(replica):
            return
        now = self._clock()
        for chain in chains:
            self.speculative.insert(replica, [int.from_bytes(block_hash, "big") for block_hash in chain], now)

    def record_failed(self, hashes: list[int], replica: str, matched_before: int) -> None:
        """Undo ``record_routed`` for blocks the replica did not have before the failed request."""
        target = self.speculative if self.is_precise(replica) else self.index
        target.remove(replica, hashes[matched_before:])

    def update(self, config: RoutingConfig, replicas: list[ReplicaSpec]) -> None:
        """Apply a new config: replicas added, removed, or changed in mode or capacity."""
        self._config = config
        self.index.max_blocks = self.speculative.max_blocks = config.max_index_blocks
        wanted = {spec.name: spec for spec in replicas}
        for name, old in list(self._specs.items()):
            new = wanted.get(name)
            if new is None or (new.kv_events, new.kv_events_replay, new.model) != (
                old.kv_events,
                old.kv_events_replay,
                old.model,
            ):
                self._forget(name)
        for name, spec in wanted.items():
            capacity = _index_capacity(spec, config)
            if name not in self._specs:
                self._specs[name] = spec
                self.index.add_replica(name, capacity)
                self.speculative.add_replica(name)
                if self._running and spec.kv_events is not None:
                    self._subscribe(spec)
            else:
                self._specs[name] = spec
                self.index.set_capacity(name, capacity)

    def start(self) -> None:
        """Subscribe to the KV events of precise replicas; call from the event loop."""
        self._running = True
        for spec in self._specs.values():
            if spec.kv_events is not None and spec.name not in self.subscribers:
                self._subscribe(spec)

    async def stop(self) -> None:
        self._running = False
        for subscriber in list(self.subscribers.values()):
            await subscriber.stop()
        self.subscribers.clear()

    def stats(self) -> IndexStats:
        return IndexStats(
            blocks=len(self.index),
            replica_blocks=self.index.entries,
            approx_bytes=self.index.approx_bytes() + self.speculative.approx_bytes(),
            evictions=self.index.evictions,
            speculative_blocks=self.speculative.entries,
            per_replica={
                name: ReplicaIndexStats(
                    mode="precise" if spec.kv_events else "predicted",
                    blocks=self.index.blocks(name),
                    speculative_blocks=self.speculative.blocks(name),
                )
                for name, spec in self._specs.items()
            },
            kv_events={name: subscriber.stats() for name, subscriber in self.subscribers.items()},
        )

    def _subscribe(self, spec: ReplicaSpec) -> None:
        assert spec.kv_events is not None
        applier = KVEventApplier(self.index, spec.name, spec.model, self.block_size, self.speculative, self._clock)
        subscriber = KVEventSubscriber(spec.kv_events, applier, replay_endpoint=spec.kv_events_replay)
        subscriber.start()
        self.subscribers[spec.name] = subscriber

    def _forget(self, name: str) -> None:
        subscriber = self.subscribers.pop(name, None)
        if subscriber is not None:
            subscriber.stop_soon()
        self.index.remove_replica(name)
        self.speculative.remove_replica(name)
        del self._specs[name]

    def _expire_speculative(self) -> None:
        cutoff = self._clock() - self._config.speculative_ttl_s
        for name in self.speculative.replicas:
            self.speculative.expire(name, cutoff)


def _index_capacity(spec: ReplicaSpec, config: RoutingConfig) -> int | None:
    """Blocks the index keeps for a replica. Predicted mode models the replica's LRU with its KV
    capacity; precise mode follows its events, which also report blocks in a host tier beyond
    the device capacity, so only ``max_index_blocks`` bounds it."""
    if spec.kv_events is not None:
        return None
    return known_capacity(spec, config.default_capacity_blocks)
