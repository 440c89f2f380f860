"""How the router prices prefill on each replica: readings of like hardware alike, other hardware
at its own rate (``RoutingConfig.prefill_rate_spread``)."""

import pytest

from gateway.routing.config import RoutingConfig
from gateway.routing.context import RouteContext
from gateway.routing.types import ReplicaState
from tests.routing.helpers import request, state


def rates(replicas: list[ReplicaState], **config: float) -> list[float]:
    ctx = RouteContext(request(1), replicas, {}, {}, RoutingConfig(**config))
    return [ctx.prefill_rate(replica) for replica in replicas]


def test_readings_within_the_spread_are_priced_as_their_mean() -> None:
    """A replica that read 10 % faster (it just ran long prompts) must not take more of a burst."""
    alike = [state("a", prefill_tokens_per_s=10_000.0), state("b", prefill_tokens_per_s=11_000.0), state("c")]
    assert rates(alike) == pytest.approx([10_500.0] * 3), "c has no reading: the mean too"


def test_replicas_on_other_hardware_keep_their_own_rate() -> None:
    mixed = [state("a", prefill_tokens_per_s=10_000.0), state("b", prefill_tokens_per_s=30_000.0)]
    assert rates(mixed) == pytest.approx([10_000.0, 30_000.0]), "each 50 % off the mean of 20,000"


def test_a_spread_of_zero_prices_every_reading_as_read() -> None:
    alike = [state("a", prefill_tokens_per_s=10_000.0), state("b", prefill_tokens_per_s=11_000.0)]
    assert rates(alike, prefill_rate_spread=0.0) == pytest.approx([10_000.0, 11_000.0])
