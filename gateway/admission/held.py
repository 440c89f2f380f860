"""Requests that late binding holds at the gateway for their busy owner (gateway/routing/late_binding.py).

One line per owner replica, fewest uncached tokens first. Only a line's head tries to get
placed, whenever its owner may have freed capacity (``notify``): a request there got its first
token or ended, or a health round ran. A held request leaves when it is placed, when its wait
is up (the caller then routes it as if never held), or at once when its client goes away (its
task is cancelled); the line forgets it on every exit.
"""

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from gateway.routing.late_binding import HoldLine
from gateway.routing.types import Hold

Placement = TypeVar("Placement")


@dataclass
class HeldStats:
    """Counters for metrics: how held requests left, and how long they waited in all."""

    released: int = 0
    timed_out: int = 0
    gone: int = 0
    wait_s_total: float = 0.0
    held_by_owner: dict[str, int] = field(default_factory=dict)

    @property
    def left(self) -> int:
        return self.released + self.timed_out + self.gone


class HeldRequests:
    def __init__(self) -> None:
        self._lines: dict[str, HoldLine[asyncio.Event]] = {}
        self._stats = HeldStats()

    def __len__(self) -> int:
        return sum(len(line) for line in self._lines.values())

    async def wait(self, hold: Hold, max_wait_s: float, try_place: Callable[[], Placement | None]) -> Placement | None:
        """Wait in ``hold.owner``'s line until ``try_place()`` places the request (it returns None while
        the request should keep waiting); None when ``max_wait_s`` is up."""
        line = self._lines.setdefault(hold.owner, HoldLine())
        turn = asyncio.Event()
        entry = line.push(hold.uncached_tokens, turn)
        started = time.perf_counter()
        left_how = "gone"
        try:
            async with asyncio.timeout(max_wait_s):
                while True:
                    if line.head() is entry:
                        placement = try_place()
                        if placement is not None:
                            left_how = "released"
                            return placement
                    turn.clear()
                    await turn.wait()
        except TimeoutError:
            left_how = "timed_out"
            return None
        finally:
            line.remove(entry)
            if not line:
                self._lines.pop(hold.owner, None)
            self._count(left_how, time.perf_counter() - started)
            self.notify(hold.owner)

    def notify(self, owner: str) -> None:
        """``owner`` may have freed capacity: let the head of its line try again."""
        line = self._lines.get(owner)
        head = line.head() if line is not None else None
        if head is not None:
            head.item.set()

    def notify_all(self) -> None:
        for owner in list(self._lines):
            self.notify(owner)

    def stats(self) -> HeldStats:
        stats = self._stats
        stats.held_by_owner = {owner: len(line) for owner, line in self._lines.items()}
        return stats

    def _count(self, left_how: str, waited_s: float) -> None:
        stats = self._stats
        if left_how == "released":
            stats.released += 1
        elif left_how == "timed_out":
            stats.timed_out += 1
        else:
            stats.gone += 1
        stats.wait_s_total += waited_s
