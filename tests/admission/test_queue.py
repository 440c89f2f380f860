"""The admission queue: bounded, timed, fair across tenants, and left at once on cancellation."""

import asyncio

import pytest

from gateway.admission.queue import AdmissionQueue
from gateway.errors import OpenAIError


class Slots:
    """A replica with ``free`` slots; try_place takes one."""

    def __init__(self, free: int) -> None:
        self.free = free

    def take(self, label: str) -> str | None:
        if self.free <= 0:
            return None
        self.free -= 1
        return label


async def test_admits_at_once_when_there_is_room() -> None:
    queue = AdmissionQueue(max_queue=1, timeout_s=1)
    assert await queue.admit("a", lambda: "placed") == "placed"
    assert len(queue) == 0


async def test_full_queue_answers_429_with_retry_after() -> None:
    queue = AdmissionQueue(max_queue=1, timeout_s=5)
    slots = Slots(0)
    waiting = asyncio.create_task(queue.admit("a", lambda: slots.take("x")))
    await asyncio.sleep(0)
    with pytest.raises(OpenAIError) as error:
        await queue.admit("a", lambda: slots.take("y"))
    assert error.value.status == 429 and error.value.headers["Retry-After"] == "1"
    waiting.cancel()


async def test_waiting_too_long_answers_503() -> None:
    queue = AdmissionQueue(max_queue=4, timeout_s=0.05)
    with pytest.raises(OpenAIError) as error:
        await queue.admit("a", lambda: None)
    assert error.value.status == 503 and "queue timeout" in error.value.message
    assert len(queue) == 0


async def test_cancelled_waiter_leaves_the_queue_at_once() -> None:
    queue = AdmissionQueue(max_queue=4, timeout_s=5)
    waiting = asyncio.create_task(queue.admit("a", lambda: None))
    await asyncio.sleep(0.01)
    assert len(queue) == 1
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert len(queue) == 0


async def test_tenants_take_turns() -> None:
    queue = AdmissionQueue(max_queue=10, timeout_s=5)
    slots = Slots(0)
    admitted: list[str] = []

    async def request(tenant: str, label: str) -> None:
        admitted.append(await queue.admit(tenant, lambda: slots.take(label)))

    tasks = [asyncio.create_task(request("a", f"a{i}")) for i in range(3)]
    await asyncio.sleep(0.01)
    tasks.append(asyncio.create_task(request("b", "b0")))
    await asyncio.sleep(0.01)
    for _ in range(4):
        slots.free += 1
        queue.notify()
        await asyncio.sleep(0.01)
    await asyncio.gather(*tasks)
    assert admitted == ["a0", "b0", "a1", "a2"]


async def test_newcomers_wait_behind_the_queue() -> None:
    queue = AdmissionQueue(max_queue=10, timeout_s=5)
    slots = Slots(0)
    first = asyncio.create_task(queue.admit("a", lambda: slots.take("first")))
    await asyncio.sleep(0.01)
    slots.free = 1
    second = asyncio.create_task(queue.admit("b", lambda: slots.take("second")))
    assert await first == "first"
    slots.free = 1
    queue.notify()
    assert await second == "second"


async def test_a_higher_class_leaves_the_queue_first() -> None:
    queue = AdmissionQueue(max_queue=10, timeout_s=5)
    slots = Slots(0)
    low = asyncio.create_task(queue.admit("batch", lambda: slots.take("low"), priority=0))
    await asyncio.sleep(0)
    high = asyncio.create_task(queue.admit("interactive", lambda: slots.take("high"), priority=5))
    await asyncio.sleep(0)
    slots.free = 1
    queue.notify()
    assert await high == "high" and not low.done()
    slots.free = 1
    queue.notify()
    assert await low == "low"


async def test_a_full_queue_sheds_its_lowest_class_for_a_higher_one() -> None:
    queue = AdmissionQueue(max_queue=2, timeout_s=5)
    slots = Slots(0)
    low = [asyncio.create_task(queue.admit("batch", lambda: slots.take("low"), priority=0)) for _ in range(2)]
    await asyncio.sleep(0)
    high = asyncio.create_task(queue.admit("interactive", lambda: slots.take("high"), priority=1))
    await asyncio.sleep(0)
    with pytest.raises(OpenAIError) as shed:
        await low[1]
    assert shed.value.status == 429 and shed.value.code == "shed_for_priority" and shed.value.headers["Retry-After"]
    assert not low[0].done() and len(queue) == 2
    with pytest.raises(OpenAIError) as refused:
        await queue.admit("batch", lambda: slots.take("late"), priority=0)
    assert refused.value.code == "queue_full", "the lowest class is refused, not let in by shedding its own"
    slots.free = 2
    queue.notify()
    assert await high == "high" and await low[0] == "low"


async def test_one_tenant_cannot_fill_the_queue_against_another() -> None:
    """A full queue held by one tenant sheds that tenant's newest waiter for another tenant's request."""
    queue = AdmissionQueue(max_queue=4, timeout_s=5)
    slots = Slots(0)
    flood = [asyncio.create_task(queue.admit("flood", lambda: slots.take("f"))) for _ in range(4)]
    await asyncio.sleep(0)
    assert queue.waiting_by_tenant() == {"flood": 4}
    other = asyncio.create_task(queue.admit("other", lambda: slots.take("o")))
    await asyncio.sleep(0)
    assert queue.waiting_by_tenant() == {"flood": 3, "other": 1}
    shed = await asyncio.gather(flood[-1], return_exceptions=True)
    assert isinstance(shed[0], OpenAIError) and shed[0].status == 429 and shed[0].code == "shed_for_fairness"
    with pytest.raises(OpenAIError) as refused:
        await queue.admit("flood", lambda: slots.take("f"))
    assert refused.value.code == "queue_full", "the flooding tenant gets no place back from the other"
    third = asyncio.create_task(queue.admit("third", lambda: slots.take("t")))
    await asyncio.sleep(0)
    assert queue.waiting_by_tenant() == {"flood": 2, "other": 1, "third": 1}
    assert isinstance((await asyncio.gather(flood[2], return_exceptions=True))[0], OpenAIError)
    with pytest.raises(OpenAIError) as refused:
        await queue.admit("other", lambda: slots.take("o"))
    assert refused.value.code == "queue_full", "2 against 1: shedding would only move the imbalance"
    slots.free = 4
    queue.notify()
    assert sorted(await asyncio.gather(*flood[:2], other, third)) == ["f", "f", "o", "t"]
