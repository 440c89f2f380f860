"""The admission queue: requests that fit on no replica right now wait here, by priority, fairly across tenants.

The order (gateway/admission/admission_order.py): the highest priority class first, round-robin
over tenants within a class, first come first served within a tenant; a full queue sheds by class,
then by fairness between tenants (429 ``shed_for_priority`` / ``shed_for_fairness``), or refuses the
newcomer with 429. A request that finds nobody of its class or above waiting tries to get placed at
once. Only the head of the order tries to get placed, whenever capacity may have changed (a request
ended, a health check ran, the config was reloaded); the rest keep their place (vLLM's scheduler
admits in the same strict order, so a large request is never starved). A waiter leaves at once when
its client goes away (its task is cancelled) or its time is up.
"""

import asyncio
from collections.abc import Callable
from typing import TypeVar

from gateway.admission.admission_order import AdmissionOrder, ShedReason
from gateway.errors import service_unavailable, too_many_requests

Placement = TypeVar("Placement")


class AdmissionQueue:
    def __init__(self, max_queue: int, timeout_s: float) -> None:
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self._order: AdmissionOrder[asyncio.Event] = AdmissionOrder()

    def __len__(self) -> int:
        return len(self._order)

    def configure(self, max_queue: int, timeout_s: float) -> None:
        """Adopt reloaded limits; waiting requests keep their place."""
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self.notify()

    def waiting_by_tenant(self) -> dict[str, int]:
        return self._order.waiting_by_tenant()

    async def admit(self, tenant: str, try_place: Callable[[], Placement | None], priority: int = 0) -> Placement:
        """``try_place()`` now if nobody of this class or above waits, else once it is this request's
        turn; 429/503 on failure.

        ``try_place`` returns a placement or None (no room anywhere); it raises for a request
        that must not wait (e.g. no healthy replica at all).
        """
        order = self._order
        if not order.anyone_at_or_above(priority):
            placement = try_place()
            if placement is not None:
                return placement
        if len(order) >= self.max_queue:
            shed = order.shed_for(tenant, priority)
            if shed is None:
                raise too_many_requests(
                    f"The gateway is at capacity and its queue is full ({self.max_queue} waiting); retry shortly.",
                    retry_after_s=1,
                    code="queue_full",
                )
            shed.item.set()
        waiter = order.enqueue(tenant, priority, asyncio.Event())
        self.notify()
        try:
            async with asyncio.timeout(self.timeout_s):
                while True:
                    if waiter.shed is not None:
                        raise _shed_error(waiter.shed)
                    if order.head() is waiter:
                        placement = try_place()
                        if placement is not None:
                            order.served(waiter)
                            return placement
                    waiter.item.clear()
                    await waiter.item.wait()
        except TimeoutError:
            raise service_unavailable(
                f"No replica had room for this request within the queue timeout of {self.timeout_s:g} s.",
                retry_after_s=1,
            ) from None
        finally:
            order.remove(waiter)
            self.notify()

    def notify(self) -> None:
        """Capacity may have changed: let the head of the queue try again."""
        head = self._order.head()
        if head is not None:
            head.item.set()


def _shed_error(reason: ShedReason) -> Exception:
    if reason == "priority":
        message, code = "shed this request for one of a higher priority", "shed_for_priority"
    else:
        message, code = "shed this request to give another tenant its share of the queue", "shed_for_fairness"
    return too_many_requests(f"The gateway is overloaded and {message}; retry shortly.", retry_after_s=1, code=code)
