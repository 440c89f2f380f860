"""DecayingCounts: an exponentially weighted count per key, in a bounded table."""

import math

import pytest

from gateway.routing.decaying_counts import DecayingCounts


def test_a_count_fades_by_e_every_time_constant() -> None:
    counts: DecayingCounts[str] = DecayingCounts(time_constant_s=10.0, max_keys=8)
    assert counts.add("a", 4.0, now=0.0) == 0.0
    assert counts.value("a", now=10.0) == pytest.approx(4.0 / math.e)
    assert counts.add("a", 1.0, now=20.0) == pytest.approx(4.0 / math.e**2), "add returns the count before"
    assert counts.value("a", now=20.0) == pytest.approx(4.0 / math.e**2 + 1.0)
    assert counts.value("unknown", now=20.0) == 0.0


def test_a_clock_that_steps_back_does_not_grow_a_count() -> None:
    counts: DecayingCounts[str] = DecayingCounts(time_constant_s=1.0, max_keys=8)
    counts.add("a", 2.0, now=5.0)
    assert counts.value("a", now=4.0) == 2.0


def test_the_least_recently_counted_key_is_forgotten_first() -> None:
    counts: DecayingCounts[int] = DecayingCounts(time_constant_s=1e9, max_keys=2)
    counts.add(1, 1.0, now=0.0)
    counts.add(2, 1.0, now=1.0)
    counts.add(1, 1.0, now=2.0)
    counts.add(3, 1.0, now=3.0)
    assert len(counts) == 2
    assert counts.value(2, now=3.0) == 0.0, "2 was counted least recently"
    assert counts.value(1, now=3.0) == pytest.approx(2.0)
