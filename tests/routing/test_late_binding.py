"""Late binding: when to hold a load spill for its owner, the owner's line (fewest uncached tokens
first), the wait's timeout, and a client that leaves while held."""

import asyncio
import functools

import pytest

from gateway.routing.held_requests import HeldRequests
from gateway.routing.late_binding import HoldLine
from gateway.routing.types import Hold
from tests.routing.helpers import request, route_and_send, router, state, warm

FAST = 10_000.0
"""Prefill tokens/s: an idle replica computes the 1,024-token prompt in 0.1 s."""
LATE = {"enabled": True, "max_wait_s": 1.0}


def swamped_owner(owner_prefill_tokens: int = 6000) -> list:
    """b owns prefix 1 and has ``owner_prefill_tokens`` queued; a and c are idle."""
    return [state("a"), state("b", in_flight=1, prefill_tokens=owner_prefill_tokens), state("c")]


def test_a_load_spill_is_held_for_its_owner_when_late_binding_is_on() -> None:
    r = router(prefill_tokens_per_s=FAST, ttft_target_s=0.5, late_binding=LATE)
    warm(r, "b", prefix=1)
    decision = r.route(request(1), swamped_owner()).decision
    assert (decision.backend, decision.reason) == ("a", "load-spill"), "the decision it would take unheld"
    assert decision.hold == Hold("b", 1024 - 960), "b's ~0.61 s is 0.51 s above a's ~0.10 s: within 1 s"


def test_without_late_binding_or_when_told_not_to_the_spill_stands() -> None:
    off = router(prefill_tokens_per_s=FAST, ttft_target_s=0.5)
    warm(off, "b", prefix=1)
    assert off.route(request(1), swamped_owner()).decision.hold is None
    on = router(prefill_tokens_per_s=FAST, ttft_target_s=0.5, late_binding=LATE)
    warm(on, "b", prefix=1)
    assert on.route(request(1), swamped_owner(), may_hold=False).decision.hold is None, "a request whose wait is up"


def test_an_owner_more_than_max_wait_slower_than_the_spill_is_not_waited_for() -> None:
    r = router(prefill_tokens_per_s=FAST, ttft_target_s=0.5, late_binding={"enabled": True, "max_wait_s": 0.75})
    warm(r, "b", prefix=1)
    near = r.route(request(1), swamped_owner(8000)).decision
    assert near.hold is not None, "b ~0.81 s, 0.71 s above a's ~0.10 s"
    far = r.route(request(1), swamped_owner(12_000)).decision
    assert (far.backend, far.hold) == ("a", None), "b ~1.21 s, 1.11 s above a's: spill at once"


def test_no_hold_where_there_is_no_spill() -> None:
    r = router(prefill_tokens_per_s=FAST, ttft_target_s=0.5, late_binding=LATE)
    warm(r, "b", prefix=1)
    owner_in_time = r.route(request(1), [state("a"), state("b", in_flight=1, prefill_tokens=3000), state("c")]).decision
    assert (owner_in_time.backend, owner_in_time.hold) == ("b", None)
    one_shot = r.route(request(2), swamped_owner()).decision
    assert (one_shot.reason, one_shot.hold) == ("no-match", None)


def test_a_shared_prefix_moved_off_its_owner_is_not_held() -> None:
    """cache_aware means to copy a shared prefix to a replica with room, not to wait for it."""
    r = router(prefill_tokens_per_s=FAST, ttft_target_s=0.5, late_binding=LATE, shared_prefix_requests=1.5)
    warm(r, "b", prefix=1)
    for i in range(2):  # two siblings: a count of just under 2 once it has faded a little
        sibling = request(1, request_id=f"sibling-{i}")
        route_and_send(r, sibling, [state("a"), state("b"), state("c")])
    decision = r.route(request(1), swamped_owner()).decision
    assert (decision.backend, decision.reason, decision.hold) == ("a", "load-spill", None)


def test_a_new_conversation_moved_off_its_owner_is_not_held_its_next_turn_is() -> None:
    """A first turn is placed like a shared prefix (tests/routing/test_conversation_spread.py)."""
    r = router(prefill_tokens_per_s=FAST, ttft_target_s=0.5, late_binding=LATE)
    warm(r, "b", prefix=1)
    first = r.route(request(1, request_id="first", session_key="user-1"), swamped_owner())
    assert (first.decision.backend, first.decision.reason, first.decision.hold) == ("a", "load-spill", None)
    r.on_routed(first, "b")
    second = r.route(request(1, request_id="second", session_key="user-1"), swamped_owner()).decision
    assert (second.backend, second.hold) == ("a", Hold("b", 1024 - 960))


def test_a_hold_line_serves_the_fewest_uncached_tokens_first_then_first_come() -> None:
    line: HoldLine[str] = HoldLine()
    for name, uncached in [("big", 900), ("small", 100), ("mid", 500), ("small-later", 100)]:
        line.push(uncached, name)
    mid = line.head()
    order = []
    while (head := line.head()) is not None:
        order.append(head.item)
        line.remove(head)
    assert mid is not None and mid.item == "small"
    assert order == ["small", "small-later", "mid", "big"]
    assert len(line) == 0


def test_removing_a_waiter_from_the_middle_keeps_the_order_and_the_count() -> None:
    line: HoldLine[str] = HoldLine()
    entries = {name: line.push(uncached, name) for name, uncached in [("a", 1), ("b", 2), ("c", 3)]}
    line.remove(entries["b"])
    line.remove(entries["b"])
    assert len(line) == 2
    head = line.head()
    assert head is not None and head.item == "a"
    line.remove(head)
    head = line.head()
    assert head is not None and head.item == "c"


async def test_held_requests_are_released_shortest_uncached_first_as_the_owner_frees_capacity() -> None:
    held = HeldRequests()
    free_slots = 0
    released: list[int] = []

    def try_place(uncached: int) -> int | None:
        nonlocal free_slots
        if free_slots == 0:
            return None
        free_slots -= 1
        released.append(uncached)
        return uncached

    waits = [
        asyncio.create_task(held.wait(Hold("b", uncached), 30.0, functools.partial(try_place, uncached)))
        for uncached in (300, 100, 200)
    ]
    await until(lambda: held.stats().held_by_owner == {"b": 3})
    for expected in ([100], [100, 200], [100, 200, 300]):
        free_slots += 1
        held.notify("b")
        await until(lambda expected=expected: released == expected)
    assert await asyncio.gather(*waits) == [300, 100, 200]
    stats = held.stats()
    assert (stats.released, stats.timed_out, stats.gone, stats.held_by_owner) == (3, 0, 0, {})


async def test_a_held_request_whose_wait_is_up_comes_back_unplaced() -> None:
    held = HeldRequests()
    tries = 0

    def never() -> str | None:
        nonlocal tries
        tries += 1
        return None

    assert await held.wait(Hold("b", 10), 0.05, never) is None
    stats = held.stats()
    assert tries == 1 and (stats.timed_out, stats.held_by_owner, len(held)) == (1, {}, 0)
    assert stats.wait_s_total >= 0.05


async def test_a_client_that_leaves_while_held_leaves_nothing_behind_and_the_next_one_moves_up() -> None:
    held = HeldRequests()
    free = False
    first = asyncio.create_task(held.wait(Hold("b", 10), 30.0, lambda: "first" if free else None))
    second = asyncio.create_task(held.wait(Hold("b", 20), 30.0, lambda: "second" if free else None))
    await until(lambda: held.stats().held_by_owner == {"b": 2})
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert held.stats().held_by_owner == {"b": 1} and held.stats().gone == 1
    free = True
    held.notify("b")
    assert await second == "second", "the head's exit moved the next request up"
    assert (len(held), held.stats().held_by_owner) == (0, {})


async def until(condition: object, timeout_s: float = 10.0) -> None:
    """Yield to the event loop until ``condition()`` holds."""
    assert callable(condition)
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0)
