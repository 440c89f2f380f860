"""Late binding: hold a follow-up for its busy owner at the gateway instead of spilling it.

cache_aware moves a request off the replica holding its longest useful match (its owner) when
the owner's estimated TTFT breaks ``ttft_target_s`` and another replica's does not (reason
``load-spill``); the prefix is then recomputed and duplicated elsewhere. With
``routing.late_binding.enabled`` such a request instead waits in a per-owner line at the gateway,
provided the owner's estimated TTFT is at most ``max_wait_s`` above the spill's. Whenever the owner
frees capacity (one of its requests gets its first token or ends, a health round runs), the
line's head, the request with the fewest prompt tokens left to compute there
(shortest-uncached-first), is routed again: it goes to the owner once the owner rule keeps it
there (the owner is within target again, or no longer slower than the others by more than the
target), and keeps waiting otherwise. After ``max_wait_s`` it is routed as if never held.

``hold_for_owner`` decides (a pure function of one routing decision); ``HoldLines`` keeps the
lines and counts how requests leave them, free of clocks: the gateway drives it in real time
(``HeldRequests``, gateway/routing/held_requests.py) and ``kvgate bench simulate`` in virtual time.
"""

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

from gateway.routing.context import RouteContext
from gateway.routing.types import Hold

T = TypeVar("T")


def hold_for_owner(ctx: RouteContext, chosen: str, max_wait_s: float) -> Hold | None:
    """A hold when ``chosen`` is a load spill off an owner whose estimated TTFT is at most
    ``max_wait_s`` above ``chosen``'s (waiting costs at most that much); None otherwise, and never
    for a shared prefix, which cache_aware means to copy to a replica with room, nor for a new
    conversation's first turn, placed like one, nor for a short prompt's match, which saves too
    little to wait for."""
    never_held = ctx.short_prompt_match or ctx.shared_prefix or ctx.new_session
    if not ctx.has_useful_match or never_held or ctx.is_owner(chosen):
        return None
    by_name = {replica.name: replica for replica in ctx.replicas}
    owners = [(ctx.estimated_ttft_s(replica), replica.name) for replica in ctx.replicas if ctx.is_owner(replica.name)]
    if not owners or chosen not in by_name:
        return None
    owner_s, owner = min(owners)
    if owner_s - ctx.estimated_ttft_s(by_name[chosen]) > max_wait_s:
        return None
    return Hold(owner, ctx.request.prompt_tokens - ctx.cached.get(owner, 0))


_ARRIVALS = itertools.count()


@dataclass(eq=False)
class HeldEntry(Generic[T]):
    item: T
    since: float = 0.0
    """When it was held, on its driver's clock."""
    gone: bool = False


class HoldLine(Generic[T]):
    """One owner's held requests, fewest uncached tokens first (then first come, first served)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, HeldEntry[T]]] = []
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, uncached_tokens: int, item: T, since: float = 0.0) -> HeldEntry[T]:
        entry = HeldEntry(item, since)
        heapq.heappush(self._heap, (uncached_tokens, next(_ARRIVALS), entry))
        self._size += 1
        return entry

    def head(self) -> HeldEntry[T] | None:
        while self._heap and self._heap[0][2].gone:
            heapq.heappop(self._heap)
        return self._heap[0][2] if self._heap else None

    def remove(self, entry: HeldEntry[T]) -> None:
        """Take ``entry`` out (released, timed out or its client left); a second call does nothing."""
        if not entry.gone:
            entry.gone = True
            self._size -= 1
            self.head()


LeftHow = Literal["released", "timed_out", "gone"]
"""How a held request left its line: placed on the owner, its wait was up, or its client left."""


@dataclass
class HeldStats:
    """Requests held, how they left, and how long they waited in all."""

    held: int = 0
    released: int = 0
    timed_out: int = 0
    gone: int = 0
    wait_s_total: float = 0.0
    held_by_owner: dict[str, int] = field(default_factory=dict)

    @property
    def left(self) -> int:
        return self.released + self.timed_out + self.gone


class HoldLines(Generic[T]):
    """Every owner's line of held requests; the driver says when (``now``) and tries the heads."""

    def __init__(self) -> None:
        self._lines: dict[str, HoldLine[T]] = {}
        self._stats = HeldStats()

    def __len__(self) -> int:
        return sum(len(line) for line in self._lines.values())

    def owners(self) -> list[str]:
        return list(self._lines)

    def hold(self, owner: str, uncached_tokens: int, item: T, now: float) -> HeldEntry[T]:
        self._stats.held += 1
        return self._lines.setdefault(owner, HoldLine()).push(uncached_tokens, item, now)

    def head(self, owner: str) -> HeldEntry[T] | None:
        """The request of ``owner``'s line that tries to get placed next."""
        line = self._lines.get(owner)
        return line.head() if line is not None else None

    def leave(self, owner: str, entry: HeldEntry[T], how: LeftHow, now: float) -> None:
        """Take ``entry`` out of ``owner``'s line and count how it left; a second call does nothing."""
        line = self._lines.get(owner)
        if line is None or entry.gone:
            return
        line.remove(entry)
        if not line:
            del self._lines[owner]
        stats = self._stats
        if how == "released":
            stats.released += 1
        elif how == "timed_out":
            stats.timed_out += 1
        else:
            stats.gone += 1
        stats.wait_s_total += now - entry.since

    def stats(self) -> HeldStats:
        stats = self._stats
        stats.held_by_owner = {owner: len(line) for owner, line in self._lines.items()}
        return stats
