"""The prefill rate the engine and the simulator's replicas report: one rule for both."""

import pytest

from engine.core.prefill_rate import DECAY, MIN_PREFILL_SHARE, MIN_TOKENS, PrefillRate


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


def test_a_steps_decode_only_cost_is_not_counted_as_prefill_time() -> None:
    """On a GPU a step's fixed cost (the weights read) is most of a short prefill's step: the rate
    must not depend on whether recent prefills were short or long."""
    step_fixed_s, per_token_s = 0.008, 32e-6
    short, long = PrefillRate(), PrefillRate()
    for rate in (short, long):
        rate.record(0, step_fixed_s)
    for _ in range(20):
        short.record(128, step_fixed_s + 128 * per_token_s)
        long.record(2048, step_fixed_s + 2048 * per_token_s)
    assert short.tokens_per_s == pytest.approx(1 / per_token_s)
    assert long.tokens_per_s == pytest.approx(1 / per_token_s)


def test_a_prefill_step_faster_than_the_decode_baseline_keeps_the_rate_finite() -> None:
    rate = PrefillRate()
    rate.record(0, 1.0)
    rate.record(100, 0.5)
    assert rate.tokens_per_s == pytest.approx(100 / (0.5 * MIN_PREFILL_SHARE))
