"""The engine's load as its load socket and ``/stats`` give it: the scheduler's requests, plus those
that have reached the engine and wait in its command queue until the step running now ends, and
the latest request of each gateway view that the reading counts (``protocol/load_mark.py``).

Without the queued ones, the requests that came during a 0.15 s prefill step were in no report
until the step ended, and a burst drew requests to the replica busiest computing
(bench/notes/2026-12-05-hotspot-burst-balance.md).
"""

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

from protocol.load_mark import LOAD_MARK_TTL_S, MAX_ORIGINS, LoadMark


class LoadCounts(NamedTuple):
    running: int
    waiting: int
    queued_prefill_tokens: int
    arrivals: dict[str, int]
    """By origin, the latest ordinal this reading counts or that has ended here."""


class LoadReading:
    """Shared by the server's event loop (arrivals), the engine loop (intake, readings) and the load
    publisher (reads); one lock keeps a request from being counted in both queues, or in neither,
    and its mark from being reported before the reading counts it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._queued_prefill_tokens = 0
        self._arrived_requests = 0
        self._arrived_tokens = 0
        self._marks: OrderedDict[str, tuple[int, float]] = OrderedDict()
        """Origin -> (latest ordinal, when it was heard), least recently heard first."""

    def arrived(self, prompt_tokens: int, mark: LoadMark | None = None) -> None:
        """A request was put in the command queue (its prompt counted whole, as a waiting one is)."""
        with self._lock:
            self._arrived_requests += 1
            self._arrived_tokens += prompt_tokens
            if mark is not None:
                self._heard(mark)

    def ended(self, mark: LoadMark | None) -> None:
        """A request is done here, counted or not (refused, an embedding): no reading counts it now."""
        if mark is not None:
            with self._lock:
                self._heard(mark)

    def _heard(self, mark: LoadMark) -> None:
        marks = self._marks
        previous = marks.pop(mark.origin, None)
        marks[mark.origin] = (max(mark.ordinal, previous[0] if previous else 0), self._clock())
        if len(marks) > MAX_ORIGINS:
            marks.popitem(last=False)

    @contextmanager
    def taking_in(self, prompt_tokens: int) -> Iterator[None]:
        """The engine loop moves an arrived request into its scheduler within this block (which,
        raising, leaves it out of both)."""
        with self._lock:
            try:
                yield
            finally:
                self._arrived_requests -= 1
                self._arrived_tokens -= prompt_tokens
            self._queued_prefill_tokens += prompt_tokens

    def record(self, queued_prefill_tokens: int) -> None:
        """The scheduler's queued prefill, read by the engine loop."""
        with self._lock:
            self._queued_prefill_tokens = queued_prefill_tokens

    def now(self, scheduled: Callable[[], tuple[int, int]]) -> LoadCounts:
        """``scheduled``: the scheduler's (running, waiting); the command queue's requests count as waiting."""
        with self._lock:
            running, waiting = scheduled()
            return LoadCounts(
                running,
                waiting + self._arrived_requests,
                self._queued_prefill_tokens + self._arrived_tokens,
                self._current_marks(),
            )

    def _current_marks(self) -> dict[str, int]:
        marks, expired_before = self._marks, self._clock() - LOAD_MARK_TTL_S
        while marks and next(iter(marks.values()))[1] < expired_before:
            marks.popitem(last=False)
        return {origin: ordinal for origin, (ordinal, _) in marks.items()}
