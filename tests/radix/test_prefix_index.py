"""The prefix index against a brute-force model: per replica, a list of blocks in LRU order."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radix import prefix_index
from radix.hashing import block_hashes
from radix.prefix_index import PrefixIndex, eviction_target

BLOCK = 2
PROMPTS = st.lists(st.integers(0, 2), min_size=0, max_size=14)
REPLICAS = ("a", "b", "c")


def chain(tokens: list[int]) -> list[int]:
    return block_hashes(tokens, BLOCK, "m")


class ReferenceIndex:
    """Obviously-correct model: lists in LRU order, linear scans everywhere."""

    def __init__(self, max_blocks: int | None) -> None:
        self.held: dict[str, list[int]] = {}
        self.capacity: dict[str, int | None] = {}
        self.max_blocks = max_blocks

    def add(self, replica: str, capacity: int | None) -> None:
        self.held[replica] = []
        self.capacity[replica] = capacity

    def nodes(self) -> set[int]:
        return {block for blocks in self.held.values() for block in blocks}

    def insert(self, replica: str, hashes: list[int]) -> None:
        capacity = self.capacity[replica]
        blocks = self.held[replica]
        kept = hashes if capacity is None else hashes[:capacity]
        for block in reversed(kept):
            if block in blocks:
                blocks.remove(block)
            blocks.append(block)
        if capacity is not None and len(blocks) > capacity:
            del blocks[: len(blocks) - eviction_target(capacity)]
        if self.max_blocks is not None and len(self.nodes()) > self.max_blocks:
            target = eviction_target(self.max_blocks)
            while len(self.nodes()) > target:
                largest = max(self.held, key=lambda name: len(self.held[name]))
                del self.held[largest][: len(self.nodes()) - target]

    def match(self, hashes: list[int]) -> dict[str, int]:
        matched = {}
        for replica, blocks in self.held.items():
            depth = 0
            while depth < len(hashes) and hashes[depth] in blocks:
                depth += 1
            if depth:
                matched[replica] = depth
        return matched

    def remove(self, replica: str, hashes: list[int]) -> None:
        self.held[replica] = [block for block in self.held[replica] if block not in hashes]


class IndexMachine(RuleBasedStateMachine):
    @initialize(
        capacities=st.tuples(*[st.one_of(st.none(), st.integers(1, 12)) for _ in REPLICAS]),
        max_blocks=st.one_of(st.none(), st.integers(4, 30)),
        compaction=st.sampled_from([(1, 0), (2, 2), (prefix_index.COMPACT_RATIO, prefix_index.COMPACT_FLOOR)]),
    )
    def setup(self, capacities: tuple[int | None, ...], max_blocks: int | None, compaction: tuple[int, int]) -> None:
        """``compaction`` (ratio, floor): small ones compact the touch logs after a few inserts."""
        self.default_compaction = prefix_index.COMPACT_RATIO, prefix_index.COMPACT_FLOOR
        prefix_index.COMPACT_RATIO, prefix_index.COMPACT_FLOOR = compaction
        self.index = PrefixIndex(max_blocks)
        self.reference = ReferenceIndex(max_blocks)
        self.parent: dict[int, int | None] = {}
        self.now = 0.0
        for replica, capacity in zip(REPLICAS, capacities, strict=False):
            self.index.add_replica(replica, capacity)
            self.reference.add(replica, capacity)

    def hashes_of(self, tokens: list[int]) -> list[int]:
        hashes = chain(tokens)
        for position, block in enumerate(hashes):
            self.parent[block] = hashes[position - 1] if position else None
        return hashes

    @rule(replica=st.sampled_from(REPLICAS), tokens=PROMPTS, same_time=st.booleans())
    def insert(self, replica: str, tokens: list[int], same_time: bool) -> None:
        self.now += 0.0 if same_time else 1.0
        hashes = self.hashes_of(tokens)
        self.index.insert(replica, hashes, self.now)
        self.reference.insert(replica, hashes)

    @rule(tokens=PROMPTS)
    def match(self, tokens: list[int]) -> None:
        hashes = self.hashes_of(tokens)
        assert self.index.match(hashes) == self.reference.match(hashes)

    @rule(replica=st.sampled_from(REPLICAS), tokens=PROMPTS, start=st.integers(0, 6))
    def remove(self, replica: str, tokens: list[int], start: int) -> None:
        hashes = self.hashes_of(tokens)[start:]
        self.index.remove(replica, hashes)
        self.reference.remove(replica, hashes)

    @rule(replica=st.sampled_from(REPLICAS))
    def clear(self, replica: str) -> None:
        self.index.clear(replica)
        self.reference.held[replica] = []

    @rule(replica=st.sampled_from(REPLICAS), capacity=st.one_of(st.none(), st.integers(1, 12)))
    def replace_replica(self, replica: str, capacity: int | None) -> None:
        self.index.remove_replica(replica)
        del self.reference.held[replica]
        self.index.add_replica(replica, capacity)
        self.reference.add(replica, capacity)

    @precondition(lambda self: self.now > 0)
    @rule(replica=st.sampled_from(REPLICAS), back=st.floats(0, 3))
    def expire(self, replica: str, back: float) -> None:
        cutoff = self.now - back
        dropped = self.index.expire(replica, cutoff)
        blocks = self.reference.held[replica]
        kept = [block for block in blocks if self.index.last_used(replica, block) is not None]
        assert len(blocks) - len(kept) == dropped
        self.reference.held[replica] = kept

    def teardown(self) -> None:
        if hasattr(self, "default_compaction"):
            prefix_index.COMPACT_RATIO, prefix_index.COMPACT_FLOOR = self.default_compaction

    @invariant()
    def agrees_with_reference(self) -> None:
        self.index.check_integrity()
        for replica in REPLICAS:
            assert list(self.index.lru_order(replica)) == self.reference.held[replica]
        assert len(self.index) == len(self.reference.nodes())

    @invariant()
    def ancestors_are_evicted_after_descendants(self) -> None:
        """I1: a held block's parent, when the replica holds it too, is more recently used."""
        for replica in REPLICAS:
            position = {block: i for i, block in enumerate(self.index.lru_order(replica))}
            for block, i in position.items():
                parent = self.parent.get(block)
                assert parent not in position or position[parent] > i


IndexMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestIndexAgainstReference = IndexMachine.TestCase


def test_match_walks_all_replicas_at_once() -> None:
    index = PrefixIndex()
    for replica in ("a", "b", "c"):
        index.add_replica(replica)
    system = chain(list(range(8)))
    index.insert("a", system[:2], 1.0)
    index.insert("b", system, 1.0)
    index.insert("c", chain([9, 9, 9, 9]), 1.0)
    assert index.match(system) == {"a": 2, "b": 4}
    assert index.match(chain([7, 7])) == {}


def test_capacity_evicts_least_recently_used_leaves_first() -> None:
    index = PrefixIndex()
    index.add_replica("a", capacity=64)
    old, new = chain(list(range(128))), chain([1000 + t for t in range(128)])
    index.insert("a", old, 1.0)
    index.insert("a", new[:2], 2.0)
    assert index.blocks("a") == eviction_target(64) == 63
    assert index.match(old) == {"a": 61}
    assert index.match(new) == {"a": 2}
    assert index.evictions == 3
    index.check_integrity()


def test_remove_replica_frees_only_its_blocks() -> None:
    index = PrefixIndex()
    index.add_replica("a")
    index.add_replica("b")
    shared, own = chain([1, 2, 3, 4]), chain([5, 6])
    index.insert("a", shared, 1.0)
    index.insert("b", shared, 1.0)
    index.insert("a", own, 1.0)
    index.remove_replica("a")
    assert len(index) == 2 and index.replicas == ["b"]
    index.add_replica("c")
    assert index.match(shared) == {"b": 2}
    index.check_integrity()


def test_global_cap_bounds_nodes() -> None:
    index = PrefixIndex(max_blocks=100)
    for replica in ("a", "b"):
        index.add_replica(replica)
    for i in range(50):
        index.insert("a" if i % 2 else "b", chain([i] * 20), float(i))
    assert len(index) <= 100
    index.check_integrity()


def test_unknown_replica_is_an_error() -> None:
    with pytest.raises(KeyError):
        PrefixIndex().insert("nobody", chain([1, 2]), 0.0)


def test_touch_log_stays_bounded_when_old_prefixes_come_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compaction visits only the touches noted as holding stale references; old touches whose
    prefixes are touched again are among them, so the log never holds more than it may."""
    monkeypatch.setattr(prefix_index, "COMPACT_FLOOR", 0)
    index = PrefixIndex()
    index.add_replica("a")
    prompts = [chain([prefix] * 8 + [tail, tail]) for prefix in range(3, 12) for tail in range(3)]
    for now, hashes in enumerate(prompts * 4):
        index.insert("a", hashes, float(now))
        assert index._log_refs[0] <= prefix_index.COMPACT_RATIO * index.blocks("a")
    index.check_integrity()


class HandleMachine(RuleBasedStateMachine):
    """``insert`` with a ``match_prefix`` handle, fresh, stale or for another chain, leaves the
    index exactly as a plain ``insert`` does (both indexes see the same operations)."""

    @initialize(
        capacities=st.tuples(*[st.one_of(st.none(), st.integers(1, 12)) for _ in REPLICAS]),
        max_blocks=st.one_of(st.none(), st.integers(4, 30)),
    )
    def setup(self, capacities: tuple[int | None, ...], max_blocks: int | None) -> None:
        self.plain = PrefixIndex(max_blocks)
        self.handled = PrefixIndex(max_blocks)
        self.handles: list[tuple[list[int], prefix_index.PrefixMatch]] = []
        self.now = 0.0
        for replica, capacity in zip(REPLICAS, capacities, strict=False):
            self.plain.add_replica(replica, capacity)
            self.handled.add_replica(replica, capacity)

    @rule(replica=st.sampled_from(REPLICAS), tokens=PROMPTS)
    def insert(self, replica: str, tokens: list[int]) -> None:
        self.now += 1.0
        self.plain.insert(replica, chain(tokens), self.now)
        self.handled.insert(replica, chain(tokens), self.now)

    @rule(tokens=PROMPTS)
    def take_handle(self, tokens: list[int]) -> None:
        hashes = chain(tokens)
        found = self.handled.match_prefix(hashes)
        assert found.depths == self.plain.match(hashes)
        self.handles.append((hashes, found))

    @precondition(lambda self: self.handles)
    @rule(
        replica=st.sampled_from(REPLICAS),
        owner=st.booleans(),
        pick=st.integers(0, 9),
        other=st.one_of(st.none(), PROMPTS),
        on_host=st.booleans(),
    )
    def insert_with_handle(self, replica: str, owner: bool, pick: int, other: list[int] | None, on_host: bool) -> None:
        """``owner``: under the replica that matched most, as routing does; ``other``: insert a
        different chain than the handle matched (a misused handle)."""
        hashes, found = self.handles.pop(pick % len(self.handles))
        if owner and found.depths:
            replica = max(found.depths, key=found.depths.__getitem__)
        if other is not None:
            hashes = chain(other)
        self.now += 1.0
        self.plain.insert(replica, list(hashes), self.now, on_host)
        self.handled.insert(replica, hashes, self.now, on_host, found=found)

    @rule(replica=st.sampled_from(REPLICAS), tokens=PROMPTS, start=st.integers(0, 6))
    def remove(self, replica: str, tokens: list[int], start: int) -> None:
        self.plain.remove(replica, chain(tokens)[start:])
        self.handled.remove(replica, chain(tokens)[start:])

    @rule(replica=st.sampled_from(REPLICAS), tokens=PROMPTS, start=st.integers(0, 6))
    def insert_after_remove(self, replica: str, tokens: list[int], start: int) -> None:
        """The commonest stale handle: part of the matched prefix is dropped before the insert."""
        hashes = chain(tokens)
        found = self.handled.match_prefix(hashes)
        self.remove(replica, tokens, start)
        self.now += 1.0
        self.plain.insert(replica, hashes, self.now)
        self.handled.insert(replica, hashes, self.now, found=found)

    @rule(replica=st.sampled_from(REPLICAS), capacity=st.one_of(st.none(), st.integers(1, 12)))
    def replace_replica(self, replica: str, capacity: int | None) -> None:
        for index in (self.plain, self.handled):
            index.remove_replica(replica)
            index.add_replica(replica, capacity)

    @rule(replica=st.sampled_from(REPLICAS), back=st.floats(0, 3))
    def expire(self, replica: str, back: float) -> None:
        assert self.plain.expire(replica, self.now - back) == self.handled.expire(replica, self.now - back)

    @rule(tokens=PROMPTS, other=PROMPTS)
    def insert_other_chain(self, tokens: list[int], other: list[int]) -> None:
        """A misused handle: the owner of one chain's match inserts another chain with it."""
        found = self.handled.match_prefix(chain(tokens))
        if not found.depths:
            return
        owner = max(found.depths, key=found.depths.__getitem__)
        self.now += 1.0
        self.plain.insert(owner, chain(other), self.now)
        self.handled.insert(owner, chain(other), self.now, found=found)

    @invariant()
    def same_state(self) -> None:
        self.handled.check_integrity()
        self.plain.check_integrity()
        for replica in REPLICAS:
            assert list(self.handled.lru_order(replica)) == list(self.plain.lru_order(replica))
        assert self.handled.node_masks() == self.plain.node_masks()
        assert self.handled._on_host == self.plain._on_host
        assert self.handled._host_only == self.plain._host_only


HandleMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestInsertWithHandleEqualsPlainInsert = HandleMachine.TestCase


def test_insert_with_handle_skips_the_held_prefix_lookups() -> None:
    """The handle is used, not just tolerated: the held prefix is not looked up again."""
    index = PrefixIndex()
    index.add_replica("a")
    hashes = chain([1, 2] * 8)
    index.insert("a", hashes[:4], 1.0)
    found = index.match_prefix(hashes)
    assert found.depths == {"a": 4}

    class CountingDict(dict[int, int]):
        looked_up: list[int] = []

        def setdefault(self, key: int, default: int) -> int:
            self.looked_up.append(key)
            return super().setdefault(key, default)

    index._store.nodes = CountingDict(index._store.nodes)
    index.insert("a", hashes, 2.0, found=found)
    assert sorted(CountingDict.looked_up) == sorted(hashes[4:])
    index.check_integrity()


def test_match_stops_where_no_replica_holds_the_whole_prefix() -> None:
    """The running AND reaching zero inside a run of consecutive node ids ends the match, even
    when later blocks, in another run, are held again by the replica matched so far."""
    index = PrefixIndex()
    index.add_replica("a")
    index.add_replica("b")
    hashes = chain(list(range(12)))
    index.insert("a", hashes[:3], 1.0)
    index.insert("b", hashes[:1], 2.0)
    index.remove("a", hashes[:1])
    index.insert("b", hashes, 3.0)
    index.remove("b", hashes[1:3])
    assert index.match(hashes) == {"b": 1}
    index.check_integrity()


def test_match_looks_up_only_where_a_run_of_node_ids_ends() -> None:
    """A chain created by one insert has consecutive node ids: matching it probes the node table
    once, and once more for the tail a second insert added."""
    index = PrefixIndex()
    index.add_replica("a")
    hashes, other = chain(list(range(64))), chain([99, 99])
    index.insert("a", hashes[:16], 1.0)
    index.insert("a", other, 2.0)
    index.insert("a", hashes, 3.0, found=index.match_prefix(hashes))

    class CountingDict(dict[int, int]):
        looked_up: list[int] = []

        def get(self, key: int, default: int = 0) -> int:  # type: ignore[override]
            self.looked_up.append(key)
            return super().get(key, default)

    index._store.nodes = CountingDict(index._store.nodes)
    unheld = chain([98, 98])
    assert index.match(hashes + unheld) == {"a": 32}
    assert CountingDict.looked_up == [hashes[0], hashes[16], unheld[0]]
