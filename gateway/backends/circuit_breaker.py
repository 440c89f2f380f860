"""Passive ejection of a failing replica: a circuit breaker on consecutive request failures.

closed --(eject_after_failures failures in a row)--> open --(eject_s later)--> half-open
half-open lets one probe request through (another after eject_s if it never reports back):
success closes the breaker, failure opens it again.
An active health check that sees the replica come back closes it at once.
"""

import logging
import time
from collections.abc import Callable
from enum import Enum

from gateway.config import HealthConfig

log = logging.getLogger("kvgate.circuit_breaker")


class BreakerState(Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    def __init__(self, name: str, config: HealthConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.config = config
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._probe_started: float | None = None

    @property
    def state(self) -> BreakerState:
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self.config.eject_s:
            self._state = BreakerState.HALF_OPEN
        return self._state

    def allows_request(self) -> bool:
        state = self.state
        if state is BreakerState.HALF_OPEN:
            return self._probe_started is None or self._clock() - self._probe_started >= self.config.eject_s
        return state is BreakerState.CLOSED

    def on_request(self) -> None:
        """A request was sent; in half-open state it is the one probe."""
        if self.state is BreakerState.HALF_OPEN:
            self._probe_started = self._clock()

    def record_success(self) -> None:
        if self._state is not BreakerState.CLOSED:
            log.info("backend %s: circuit closed", self.name)
        self.reset()

    def record_failure(self) -> None:
        self._failures += 1
        if self.state is BreakerState.HALF_OPEN or (
            self._state is BreakerState.CLOSED and self._failures >= self.config.eject_after_failures
        ):
            log.warning("backend %s: circuit open after %d failures in a row", self.name, self._failures)
            self._state = BreakerState.OPEN
            self._opened_at = self._clock()
            self._probe_started = None

    def reset(self) -> None:
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._probe_started = None
