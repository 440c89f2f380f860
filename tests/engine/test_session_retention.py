"""Retention hints: one-shot blocks are evicted before the latest turn of an active session."""

from engine.core.block_manager import BlockManager
from engine.core.sequence import Sequence
from engine.core.session_retention import SessionRetention
from engine.model.runner_api import SamplingParams
from radix.hashing import block_hashes

BLOCK = 4
MODEL = "test-model"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def serve(
    manager: BlockManager,
    seq_id: int,
    tokens: list[int],
    session: str | None = None,
    session_ttl_s: float | None = None,
) -> Sequence:
    """Admit, compute and finish one request (of ``session``, retained for ``session_ttl_s``)."""
    seq = Sequence(
        seq_id,
        tokens,
        SamplingParams(max_tokens=1),
        max_total_tokens=1024,
        session=session,
        session_ttl_s=session_ttl_s,
    )
    assert manager.allocate(seq)
    seq.num_computed_tokens = len(tokens)
    manager.register_computed_blocks(seq)
    manager.free(seq)
    manager.assert_invariants()
    return seq


def cached(manager: BlockManager, tokens: list[int]) -> int:
    """Leading full blocks of ``tokens`` still on the device."""
    count = 0
    for block_hash in block_hashes(tokens, BLOCK, MODEL):
        if block_hash not in manager._cached:
            break
        count += 1
    return count


def test_one_shots_are_evicted_before_an_active_sessions_latest_turn() -> None:
    clock = Clock()
    manager = BlockManager(8, BLOCK, MODEL, retention=SessionRetention(4, ttl_s=60, clock=clock))
    turn = list(range(100, 108))
    serve(manager, 0, turn + [0], session="chat-1")
    one_shot = list(range(200, 208))
    serve(manager, 1, one_shot + [0])  # freed after the turn: plain LRU would evict the turn first
    assert manager.num_retained_free_blocks == 2
    serve(manager, 2, list(range(300, 320)) + [0])  # needs 6 blocks: 3 empty + 3 evicted
    assert cached(manager, turn) == 2
    assert cached(manager, one_shot) == 0


def test_a_new_turn_replaces_the_previous_one() -> None:
    clock = Clock()
    manager = BlockManager(10, BLOCK, MODEL, retention=SessionRetention(8, ttl_s=60, clock=clock))
    first = list(range(100, 108))
    serve(manager, 0, first + [1], session="s")
    second = list(range(400, 408))
    serve(manager, 1, second + [1], session="s")
    assert manager.retention is not None and manager.retention.num_retained == 2
    serve(manager, 2, list(range(500, 528)) + [1])  # 8 blocks: all but the 2 retained
    assert cached(manager, second) == 2
    assert cached(manager, first) == 0


def test_sessions_go_inactive_after_the_ttl() -> None:
    clock = Clock()
    manager = BlockManager(8, BLOCK, MODEL, retention=SessionRetention(4, ttl_s=60, clock=clock))
    turn = list(range(100, 108))
    serve(manager, 0, turn + [0], session="chat-1")
    clock.now = 30.0
    one_shot = list(range(200, 208))
    serve(manager, 1, one_shot + [0])
    clock.now = 61.0  # chat-1 last seen 61 s ago: no longer active, plain LRU again
    serve(manager, 2, list(range(300, 320)) + [0])
    assert cached(manager, turn) == 0
    assert cached(manager, one_shot) == 2
    assert manager.retention is not None and manager.retention.num_sessions == 0


def test_a_flood_of_sessions_cannot_pin_more_than_the_bound() -> None:
    clock = Clock()
    manager = BlockManager(16, BLOCK, MODEL, retention=SessionRetention(4, ttl_s=600, clock=clock))
    turns = [list(range(1000 * s, 1000 * s + 8)) for s in range(6)]
    for session, turn in enumerate(turns):
        clock.now += 1
        serve(manager, session, turn + [0], session=f"s{session}")
    assert manager.retention is not None
    assert manager.retention.num_retained <= 4 and manager.num_retained_free_blocks <= 4
    serve(manager, 99, list(range(9000, 9044)) + [0])  # 12 blocks: all but the 4 retained
    assert [cached(manager, turn) for turn in turns] == [0, 0, 0, 0, 2, 2]


def test_a_turn_longer_than_the_bound_keeps_its_leading_blocks() -> None:
    clock = Clock()
    retention = SessionRetention(2, ttl_s=600, clock=clock)
    manager = BlockManager(8, BLOCK, MODEL, retention=retention)
    turn = list(range(100, 116))
    serve(manager, 0, turn + [0], session="long")
    assert retention.num_retained == 2
    serve(manager, 1, list(range(300, 320)) + [0])  # 6 blocks: all but the 2 retained
    assert cached(manager, turn) == 2


def test_without_sessions_eviction_stays_plain_lru() -> None:
    manager = BlockManager(8, BLOCK, MODEL, retention=SessionRetention(4, ttl_s=60))
    older = list(range(100, 108))
    serve(manager, 0, older + [0])
    newer = list(range(200, 208))
    serve(manager, 1, newer + [0])
    serve(manager, 2, list(range(300, 320)) + [0])
    assert cached(manager, older) == 0 and cached(manager, newer) == 2
    assert manager.num_retained_free_blocks == 0


def test_a_session_the_bound_pushes_out_is_not_evicted_before_older_one_shots() -> None:
    """Its blocks may be as hot as any (a system prompt many requests share): they rejoin the
    evictable queue at its new end, not at its front, where plain LRU would never have put them."""
    clock = Clock()
    manager = BlockManager(12, BLOCK, MODEL, retention=SessionRetention(2, ttl_s=60, clock=clock))
    one_shot = list(range(200, 208))
    serve(manager, 0, one_shot + [0])
    pushed = list(range(100, 108))
    serve(manager, 1, pushed + [0], session="a")
    serve(manager, 2, list(range(400, 408)) + [0], session="b")  # over the bound of 2: "a" loses retention
    assert manager.num_retained_free_blocks == 2
    serve(manager, 3, list(range(300, 328)) + [0])  # needs 8 blocks: 6 empty + 2 evicted
    assert cached(manager, one_shot) == 0, "the older one-shot goes first, as under plain LRU"
    assert cached(manager, pushed) == 2
