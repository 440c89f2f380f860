"""The policy registry (gateway/routing/registry.py) and route reasons: one declaration, byte-identical text."""

import orjson
import pytest
from pydantic import ValidationError

from gateway.routing.config import POLICIES, SCORERS, RoutingConfig
from gateway.routing.registry import POLICIES as POLICY_REGISTRY
from gateway.routing.registry import SCORERS as SCORER_REGISTRY
from gateway.routing.types import RouteReason
from tests.routing.helpers import request, router, state

IDLE = [state("a"), state("b"), state("c")]


def test_the_config_accepts_exactly_the_registered_names() -> None:
    assert tuple(POLICY_REGISTRY) == POLICIES and tuple(SCORER_REGISTRY) == SCORERS
    for policy in POLICY_REGISTRY:
        assert RoutingConfig(policy=policy).policy == policy
    with pytest.raises(ValidationError, match="unknown routing policy 'fastest'"):
        RoutingConfig(policy="fastest")
    with pytest.raises(ValidationError, match="unknown scorer"):
        RoutingConfig(scorers={"fastest": 1.0})


@pytest.mark.parametrize("policy", list(POLICY_REGISTRY))
def test_every_policy_uses_declared_scorers_and_names_a_route_reason(policy: str) -> None:
    assert set(POLICY_REGISTRY[policy].weights) <= set(SCORER_REGISTRY)
    decision = router(policy).route(request(1, session_key="s"), IDLE).decision
    assert isinstance(decision.reason, RouteReason)


def test_route_reasons_read_as_the_text_they_always_were() -> None:
    """Headers, logs and metrics labels see the plain string, with a ``+cache-key`` form of each routing reason."""
    reason = RouteReason.PREFIX_HIT.by_cache_key()
    assert reason is RouteReason.PREFIX_HIT_BY_CACHE_KEY
    assert (str(reason), f"{reason}", orjson.dumps({"reason": reason})) == (
        "prefix-hit+cache-key",
        "prefix-hit+cache-key",
        b'{"reason":"prefix-hit+cache-key"}',
    )
    routing = [reason for reason in RouteReason if "+" not in reason and reason is not RouteReason.RETRY]
    assert len(routing) == 7 and all(reason.by_cache_key().endswith("+cache-key") for reason in routing)
