"""Requests that late binding holds at the gateway for their busy owner (gateway/routing/late_binding.py).

One line per owner replica, fewest uncached tokens first (``HoldLines``, which ``kvgate bench
simulate`` drives in virtual time). Only a line's head tries to get placed, whenever its owner may
have freed capacity (``notify``): a request there got its first token or ended, or a health round
ran. A held request leaves when it is placed, when its wait is up (the caller then routes it as if
never held), or at once when its client goes away (its task is cancelled); the line forgets it on
every exit.
"""

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

from gateway.routing.late_binding import HeldStats, HoldLines, LeftHow
from gateway.routing.types import Hold

Placement = TypeVar("Placement")


class HeldRequests:
    def __init__(self) -> None:
        self._lines: HoldLines[asyncio.Event] = HoldLines()

    def __len__(self) -> int:
        return len(self._lines)

    async def wait(self, hold: Hold, max_wait_s: float, try_place: Callable[[], Placement | None]) -> Placement | None:
        """Wait in ``hold.owner``'s line until ``try_place()`` places the request (it returns None while
        the request should keep waiting); None when ``max_wait_s`` is up."""
        turn = asyncio.Event()
        entry = self._lines.hold(hold.owner, hold.uncached_tokens, turn, time.perf_counter())
        left_how: LeftHow = "gone"
        try:
            async with asyncio.timeout(max_wait_s):
                while True:
                    if self._lines.head(hold.owner) is entry:
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
            self._lines.leave(hold.owner, entry, left_how, time.perf_counter())
            self.notify(hold.owner)

    def notify(self, owner: str) -> None:
        """``owner`` may have freed capacity: let the head of its line try again."""
        head = self._lines.head(owner)
        if head is not None:
            head.item.set()

    def notify_all(self) -> None:
        for owner in self._lines.owners():
            self.notify(owner)

    def stats(self) -> HeldStats:
        return self._lines.stats()
