"""The admission queue: requests that fit on no replica right now wait here, fairly across tenants.

Order: round-robin over the tenants that have someone waiting, first come first served within a
tenant. Only the head of that order tries to get placed, whenever capacity may have changed
(a request ended, a health check ran, the config was reloaded); the rest keep their place
(vLLM's scheduler admits in the same strict order, so a large request is never starved).
A waiter leaves at once when its client goes away (its task is cancelled) or its time is up.
"""

import asyncio
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from gateway.errors import service_unavailable, too_many_requests

Placement = TypeVar("Placement")


@dataclass(eq=False)
class _Waiter:
    tenant: str
    turn: asyncio.Event = field(default_factory=asyncio.Event)


class AdmissionQueue:
    def __init__(self, max_queue: int, timeout_s: float) -> None:
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self._lines: OrderedDict[str, deque[_Waiter]] = OrderedDict()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def configure(self, max_queue: int, timeout_s: float) -> None:
        """Adopt reloaded limits; waiting requests keep their place."""
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self.notify()

    def waiting_by_tenant(self) -> dict[str, int]:
        return {tenant: len(line) for tenant, line in self._lines.items()}

    async def admit(self, tenant: str, try_place: Callable[[], Placement | None]) -> Placement:
        """``try_place()`` now if nobody waits, else once it is this request's turn; 429/503 on failure.

        ``try_place`` returns a placement or None (no room anywhere); it raises for a request
        that must not wait (e.g. no healthy replica at all).
        """
        if not self._size:
            placement = try_place()
            if placement is not None:
                return placement
        if self._size >= self.max_queue:
            raise too_many_requests(
                f"The gateway is at capacity and its queue is full ({self.max_queue} waiting); retry shortly.",
                retry_after_s=1,
                code="queue_full",
            )
        waiter = self._enqueue(tenant)
        self.notify()
        try:
            async with asyncio.timeout(self.timeout_s):
                while True:
                    if self._head() is waiter:
                        placement = try_place()
                        if placement is not None:
                            self._lines.move_to_end(tenant)
                            return placement
                    waiter.turn.clear()
                    await waiter.turn.wait()
        except TimeoutError:
            raise service_unavailable(
                f"No replica had room for this request within the queue timeout of {self.timeout_s:g} s.",
                retry_after_s=1,
            ) from None
        finally:
            self._remove(waiter)
            self.notify()

    def notify(self) -> None:
        """Capacity may have changed: let the head of the queue try again."""
        head = self._head()
        if head is not None:
            head.turn.set()

    def _enqueue(self, tenant: str) -> _Waiter:
        waiter = _Waiter(tenant)
        self._lines.setdefault(tenant, deque()).append(waiter)
        self._size += 1
        return waiter

    def _remove(self, waiter: _Waiter) -> None:
        line = self._lines[waiter.tenant]
        line.remove(waiter)
        self._size -= 1
        if not line:
            del self._lines[waiter.tenant]

    def _head(self) -> _Waiter | None:
        for line in self._lines.values():
            return line[0]
        return None
