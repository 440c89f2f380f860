"""The engine's load as its load socket and ``/stats`` give it: the scheduler's requests, plus those
that have reached the engine and wait in its command queue until the step running now ends.

A gateway takes a request as counted by a report that arrives ``COVER_GRACE_S`` after it sent it
(gateway/backends/load_view.py). Without the queued ones, the requests that came during a 0.15 s
prefill step were in no report until the step ended, and a burst drew requests to the replica
busiest computing (bench/notes/2026-12-05-hotspot-burst-balance.md).
"""

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple


class LoadCounts(NamedTuple):
    running: int
    waiting: int
    queued_prefill_tokens: int


class LoadReading:
    """Shared by the server's event loop (arrivals), the engine loop (intake, readings) and the load
    publisher (reads); one lock keeps a request from being counted in both queues, or in neither."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queued_prefill_tokens = 0
        self._arrived_requests = 0
        self._arrived_tokens = 0

    def arrived(self, prompt_tokens: int) -> None:
        """A request was put in the command queue (its prompt counted whole, as a waiting one is)."""
        with self._lock:
            self._arrived_requests += 1
            self._arrived_tokens += prompt_tokens

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
                running, waiting + self._arrived_requests, self._queued_prefill_tokens + self._arrived_tokens
            )
