from gateway.backends.circuit_breaker import BreakerState, CircuitBreaker
from gateway.config import HealthConfig


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def breaker() -> tuple[CircuitBreaker, Clock]:
    clock = Clock()
    return CircuitBreaker("b", HealthConfig(eject_after_failures=3, eject_s=5.0), clock), clock


def test_opens_after_consecutive_failures_only() -> None:
    cb, _ = breaker()
    cb.record_failure()
    cb.record_failure()
    cb.record_success()
    cb.record_failure()
    cb.record_failure()
    assert cb.allows_request()
    cb.record_failure()
    assert cb.state is BreakerState.OPEN and not cb.allows_request()


def test_half_open_lets_one_probe_through_and_closes_on_success() -> None:
    cb, clock = breaker()
    for _ in range(3):
        cb.record_failure()
    clock.now = 5.0
    assert cb.state is BreakerState.HALF_OPEN and cb.allows_request()
    cb.on_request()
    assert not cb.allows_request()
    cb.record_success()
    assert cb.state is BreakerState.CLOSED and cb.allows_request()


def test_failed_probe_opens_again_and_a_lost_probe_expires() -> None:
    cb, clock = breaker()
    for _ in range(3):
        cb.record_failure()
    clock.now = 5.0
    cb.on_request()
    cb.record_failure()
    assert cb.state is BreakerState.OPEN
    clock.now = 10.0
    cb.on_request()
    clock.now = 15.0
    assert cb.allows_request()
