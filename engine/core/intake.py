"""Requests that have reached the engine but wait in its command queue until the loop takes them in
between steps: the load readings count them, so a load report covers every request that reached
the replica before it was sent, however long the step running meanwhile.

A gateway takes a request as counted by a report that arrives ``COVER_GRACE_S`` after it sent it
(gateway/backends/load_view.py). Without these counts, the requests that came during a 0.15 s
prefill step were in no report until the step ended, and a burst drew requests to the replica
busiest computing (bench/notes/2026-12-05-hotspot-burst-balance.md).
"""

import threading


class Intake:
    """Counts shared by the server's event loop (arrivals), the engine loop (intake) and the load
    publisher (readings); one lock keeps each reading whole."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests = 0
        self._tokens = 0
        self._taken_requests = 0
        self._taken_tokens = 0
        self._queued_prefill_tokens = 0

    def arrived(self, prompt_tokens: int) -> None:
        """A request was put in the command queue (its prompt counted whole, as a waiting one is)."""
        with self._lock:
            self._requests += 1
            self._tokens += prompt_tokens

    def taken_in(self, prompt_tokens: int) -> None:
        """The engine loop queued an arrived request in its scheduler (engine thread only); it leaves
        the pending counts with the next reading, which counts it in the scheduler's."""
        self._taken_requests += 1
        self._taken_tokens += prompt_tokens

    def record_reading(self, queued_prefill_tokens: int) -> None:
        """The scheduler's queued prefill now, with every request taken in since the last reading in it."""
        with self._lock:
            self._queued_prefill_tokens = queued_prefill_tokens
            self._requests -= self._taken_requests
            self._tokens -= self._taken_tokens
        self._taken_requests = self._taken_tokens = 0

    def reading(self) -> tuple[int, int]:
        """(requests not yet taken in, queued prefill tokens with theirs): one consistent reading."""
        with self._lock:
            return self._requests, self._queued_prefill_tokens + self._tokens
