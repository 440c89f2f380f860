"""The admission queue: requests that fit on no replica right now wait here, by priority, fairly across tenants.

Order: the highest priority class first; within a class, round-robin over the tenants that have
someone waiting, first come first served within a tenant. A request that finds nobody of its
class or above waiting tries to get placed at once. When the queue is full, a newcomer sheds the
newest waiter of the lowest class below its own (that waiter gets 429 with ``Retry-After``).
Failing that, the queue is shared fairly between tenants: a newcomer whose tenant holds at least
two places fewer than the tenant holding the most sheds that tenant's newest waiter of its own
class or below (429 ``shed_for_fairness``), so one tenant can never fill the queue against
another: any tenant gets a place while it holds fewer than its equal share. Otherwise the
newcomer is refused with 429. Only the head of that order tries to get placed, whenever capacity may have changed
(a request ended, a health check ran, the config was reloaded); the rest keep their place
(vLLM's scheduler admits in the same strict order, so a large request is never starved).
A waiter leaves at once when its client goes away (its task is cancelled) or its time is up.
"""

import asyncio
import itertools
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from gateway.errors import service_unavailable, too_many_requests

Placement = TypeVar("Placement")
_ARRIVALS = itertools.count()


@dataclass(eq=False)
class _Waiter:
    tenant: str
    priority: int = 0
    arrival: int = field(default_factory=lambda: next(_ARRIVALS))
    turn: asyncio.Event = field(default_factory=asyncio.Event)
    shed: str | None = None
    """Why it was pushed out of a full queue: ``priority`` (for a request of a higher class) or
    ``fairness`` (for a tenant holding fewer places)."""


Lines = OrderedDict[str, deque[_Waiter]]
"""One priority class: a line per tenant, in round-robin order."""


class AdmissionQueue:
    def __init__(self, max_queue: int, timeout_s: float) -> None:
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self._classes: dict[int, Lines] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def configure(self, max_queue: int, timeout_s: float) -> None:
        """Adopt reloaded limits; waiting requests keep their place."""
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self.notify()

    def waiting_by_tenant(self) -> dict[str, int]:
        waiting: dict[str, int] = {}
        for lines in self._classes.values():
            for tenant, line in lines.items():
                waiting[tenant] = waiting.get(tenant, 0) + len(line)
        return waiting

    async def admit(self, tenant: str, try_place: Callable[[], Placement | None], priority: int = 0) -> Placement:
        """``try_place()`` now if nobody of this class or above waits, else once it is this request's
        turn; 429/503 on failure.

        ``try_place`` returns a placement or None (no room anywhere); it raises for a request
        that must not wait (e.g. no healthy replica at all).
        """
        if not any(level >= priority for level in self._classes):
            placement = try_place()
            if placement is not None:
                return placement
        if self._size >= self.max_queue and not self._shed_below(priority) and not self._shed_for(tenant, priority):
            raise too_many_requests(
                f"The gateway is at capacity and its queue is full ({self.max_queue} waiting); retry shortly.",
                retry_after_s=1,
                code="queue_full",
            )
        waiter = self._enqueue(tenant, priority)
        self.notify()
        try:
            async with asyncio.timeout(self.timeout_s):
                while True:
                    if waiter.shed is not None:
                        raise _shed_error(waiter.shed)
                    if self._head() is waiter:
                        placement = try_place()
                        if placement is not None:
                            self._classes[priority].move_to_end(tenant)
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

    def _enqueue(self, tenant: str, priority: int) -> _Waiter:
        waiter = _Waiter(tenant, priority)
        self._classes.setdefault(priority, OrderedDict()).setdefault(tenant, deque()).append(waiter)
        self._size += 1
        return waiter

    def _remove(self, waiter: _Waiter) -> None:
        lines = self._classes.get(waiter.priority)
        line = lines.get(waiter.tenant) if lines is not None else None
        if lines is None or line is None or waiter not in line:
            return
        line.remove(waiter)
        self._size -= 1
        if not line:
            del lines[waiter.tenant]
        if not lines:
            del self._classes[waiter.priority]

    def _shed_below(self, priority: int) -> bool:
        """Push the newest waiter of the lowest class below ``priority`` out of the queue; False if none."""
        lower = [level for level in self._classes if level < priority]
        if not lower:
            return False
        lines = self._classes[min(lower)]
        self._shed(max((line[-1] for line in lines.values()), key=lambda waiter: waiter.arrival), "priority")
        return True

    def _shed_for(self, tenant: str, priority: int) -> bool:
        """Push out the newest waiter (of class ``priority`` or below) of the tenant holding the most
        places, when that is at least two more than ``tenant`` holds; False otherwise."""
        waiting = self.waiting_by_tenant()
        mine = waiting.get(tenant, 0)
        for other, count in sorted(waiting.items(), key=lambda item: -item[1]):
            if count < mine + 2:
                return False
            if other == tenant:
                continue
            own_or_below = [
                lines[other][-1] for level, lines in self._classes.items() if level <= priority and other in lines
            ]
            if own_or_below:
                self._shed(max(own_or_below, key=lambda waiter: waiter.arrival), "fairness")
                return True
        return False

    def _shed(self, waiter: _Waiter, reason: str) -> None:
        self._remove(waiter)
        waiter.shed = reason
        waiter.turn.set()

    def _head(self) -> _Waiter | None:
        if not self._classes:
            return None
        for line in self._classes[max(self._classes)].values():
            return line[0]
        return None


def _shed_error(reason: str) -> Exception:
    if reason == "priority":
        message, code = "shed this request for one of a higher priority", "shed_for_priority"
    else:
        message, code = "shed this request to give another tenant its share of the queue", "shed_for_fairness"
    return too_many_requests(f"The gateway is overloaded and {message}; retry shortly.", retry_after_s=1, code=code)
