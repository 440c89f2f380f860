"""The retention bound is shared fairly between namespaces (tenants): one tenant flooding sessions
pushes out its own, never another's that holds no more than its share (issue 28, finding 7)."""

import random

from engine.core.block_manager import BlockManager
from engine.core.session_retention import SessionRetention, namespace_of
from tests.engine.test_session_retention import BLOCK, MODEL, Clock, cached, serve


def hashes(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


def test_the_namespace_is_the_part_before_the_first_colon() -> None:
    assert namespace_of("ab12:cd34") == "ab12"
    assert namespace_of("ab12:cd:34") == "ab12"
    assert namespace_of("user-7") == ""
    assert namespace_of(":x") == ""


def test_a_flood_of_one_tenants_sessions_pushes_out_its_own() -> None:
    clock = Clock()
    retention = SessionRetention(100, ttl_s=600, clock=clock)
    retention.record_turn("victim:chat", hashes(0, 30))
    for index in range(20):
        clock.now += 1
        _, pushed_out, _ = retention.record_turn(f"attacker:s{index}", hashes(1000 + 40 * index, 40))
        assert not set(pushed_out) & set(range(30))
        retention.assert_invariants()
    assert all(retention.is_retained(block_hash) for block_hash in range(30))
    assert retention.retained_by("victim") == 30 and retention.num_retained <= 100
    assert retention.is_retained(1000 + 40 * 19), "the flood's newest session is kept"


def test_with_one_namespace_the_least_recently_seen_session_goes_first() -> None:
    """As before namespaces: keys without one share one namespace, plain least-recently-seen."""
    clock = Clock()
    retention = SessionRetention(10, ttl_s=600, clock=clock)
    retention.record_turn("a", hashes(0, 4))
    clock.now += 1
    retention.record_turn("b", hashes(100, 4))
    clock.now += 1
    retention.record_turn("a", hashes(0, 4))
    clock.now += 1
    _, pushed_out, _ = retention.record_turn("c", hashes(200, 4))
    assert sorted(pushed_out) == hashes(100, 4)
    retention.assert_invariants()


def test_a_namespace_over_its_share_loses_its_sessions_to_a_newcomer() -> None:
    """Fair, not first come: a tenant that took the whole bound yields to one that arrives later."""
    clock = Clock()
    retention = SessionRetention(60, ttl_s=600, clock=clock)
    for index in range(6):
        clock.now += 1
        retention.record_turn(f"big:s{index}", hashes(10 * index, 10))
    clock.now += 1
    retention.record_turn("small:s", hashes(1000, 20))
    assert retention.retained_by("small") == 20 and retention.retained_by("big") == 40
    retention.assert_invariants()


def test_the_newest_turn_alone_over_its_share_keeps_its_leading_blocks() -> None:
    clock = Clock()
    retention = SessionRetention(50, ttl_s=600, clock=clock)
    retention.record_turn("other:s", hashes(0, 20))
    clock.now += 1
    retention.record_turn("big:s", hashes(1000, 50))
    assert retention.retained_by("other") == 20 and retention.num_retained == 50
    assert retention.is_retained(1000) and retention.is_retained(1029) and not retention.is_retained(1030)
    retention.assert_invariants()


def test_hashes_shared_between_namespaces_keep_the_counts_straight() -> None:
    """Random turns over overlapping hashes, many namespaces: the bound and the counts always hold."""
    rng = random.Random(28)
    clock = Clock()
    retention = SessionRetention(40, ttl_s=50, clock=clock)
    for _ in range(2000):
        clock.now += rng.random()
        namespace = rng.choice(["a", "b", "c", ""])
        session = f"{namespace}:{rng.randrange(6)}" if namespace else str(rng.randrange(6))
        start = rng.randrange(0, 60)
        retention.record_turn(session, hashes(start, rng.randrange(0, 30)))
        assert retention.num_retained <= 40
        retention.assert_invariants()


def test_a_flooding_tenant_cannot_evict_a_retained_turn_from_the_cache() -> None:
    """Through the block manager: the victim's turn stays cached while another namespace floods."""
    clock = Clock()
    manager = BlockManager(16, BLOCK, MODEL, retention=SessionRetention(8, ttl_s=600, clock=clock))
    turn = list(range(100, 112))  # 3 blocks
    serve(manager, 0, turn + [0], session="victim:chat")
    for index in range(8):
        clock.now += 1
        serve(manager, index + 1, list(range(1000 + 100 * index, 1016 + 100 * index)) + [0], session=f"att:{index}")
    assert cached(manager, turn) == 3
