"""The admission queue's order, free of clocks and tasks: who is next, and who is shed for a newcomer.

Order: the highest priority class first; within a class, round-robin over the tenants that have
someone waiting, first come first served within a tenant. When the queue is full, a newcomer sheds
the newest waiter of the lowest class below its own; failing that, a newcomer whose tenant holds at
least two places fewer than the tenant holding the most sheds that tenant's newest waiter of its own
class or below. The gateway drives it in real time (gateway/admission/queue.py) and ``kvgate bench
simulate`` in virtual time.
"""

import itertools
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

T = TypeVar("T")
_ARRIVALS = itertools.count()

ShedReason = Literal["priority", "fairness"]
"""Why a waiter was pushed out of a full queue: for a request of a higher class, or for a tenant
holding fewer places."""


@dataclass(eq=False)
class Waiter(Generic[T]):
    tenant: str
    priority: int
    item: T
    """What the driver wakes or runs when it is this waiter's turn."""
    arrival: int = field(default_factory=lambda: next(_ARRIVALS))
    shed: ShedReason | None = None


Lines = OrderedDict[str, deque[Waiter[T]]]
"""One priority class: a line per tenant, in round-robin order."""


class AdmissionOrder(Generic[T]):
    def __init__(self) -> None:
        self._classes: dict[int, Lines[T]] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def waiting_by_tenant(self) -> dict[str, int]:
        waiting: dict[str, int] = {}
        for lines in self._classes.values():
            for tenant, line in lines.items():
                waiting[tenant] = waiting.get(tenant, 0) + len(line)
        return waiting

    def anyone_at_or_above(self, priority: int) -> bool:
        """Someone of this class or a higher one waits: a newcomer of ``priority`` must queue behind them."""
        return any(level >= priority for level in self._classes)

    def enqueue(self, tenant: str, priority: int, item: T) -> Waiter[T]:
        waiter = Waiter(tenant, priority, item)
        self._classes.setdefault(priority, OrderedDict()).setdefault(tenant, deque()).append(waiter)
        self._size += 1
        return waiter

    def head(self) -> Waiter[T] | None:
        """The one waiter that tries to get placed next."""
        if not self._classes:
            return None
        for line in self._classes[max(self._classes)].values():
            return line[0]
        return None

    def served(self, waiter: Waiter[T]) -> None:
        """``waiter`` got placed: it leaves, and its tenant goes to the back of its class's round robin."""
        lines = self._classes.get(waiter.priority)
        if lines is not None and waiter.tenant in lines:
            lines.move_to_end(waiter.tenant)
        self.remove(waiter)

    def remove(self, waiter: Waiter[T]) -> None:
        """Take ``waiter`` out (placed, timed out, its client left, shed); a second call does nothing."""
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

    def shed_for(self, tenant: str, priority: int) -> Waiter[T] | None:
        """Make room for a newcomer of ``tenant`` and ``priority`` in a full queue: the waiter pushed out
        (its ``shed`` says why), or None when nobody may be."""
        lower = [level for level in self._classes if level < priority]
        if lower:
            lines = self._classes[min(lower)]
            return self._shed(max((line[-1] for line in lines.values()), key=lambda w: w.arrival), "priority")
        waiting = self.waiting_by_tenant()
        mine = waiting.get(tenant, 0)
        for other, count in sorted(waiting.items(), key=lambda item: -item[1]):
            if count < mine + 2:
                return None
            if other == tenant:
                continue
            own_or_below = [
                lines[other][-1] for level, lines in self._classes.items() if level <= priority and other in lines
            ]
            if own_or_below:
                return self._shed(max(own_or_below, key=lambda w: w.arrival), "fairness")
        return None

    def _shed(self, waiter: Waiter[T], reason: ShedReason) -> Waiter[T]:
        self.remove(waiter)
        waiter.shed = reason
        return waiter
