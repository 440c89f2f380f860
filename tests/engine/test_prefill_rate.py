"""The prefill rate the engine and the simulator's replicas report: one rule for both."""

import pytest

from engine.core.prefill_rate import DECAY, MIN_TOKENS, PrefillRate


def test_short_prefill_steps_do_not_count_and_longer_ones_average_with_decay() -> None:
    rate = PrefillRate()
    rate.record(MIN_TOKENS - 1, 1.0)
    assert rate.tokens_per_s is None
    rate.record(1000, 1.0)
    assert rate.tokens_per_s == pytest.approx(1000.0)
    rate.record(MIN_TOKENS - 1, 10.0)
    assert rate.tokens_per_s == pytest.approx(1000.0), "a short tail's step leaves the rate as it was"
    rate.record(3000, 1.0)
    assert rate.tokens_per_s == pytest.approx((1000 * DECAY + 3000) / (DECAY + 1))
