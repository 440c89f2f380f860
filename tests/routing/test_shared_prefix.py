"""cache_aware's shared-prefix rule: a prefix many recent requests ended their cached match on
(a system prompt, a hot document) goes where its estimated TTFT is lowest, cache credited, so it
is copied to a replica with room; a private one (a conversation's earlier turns) stays with its
owner until the owner breaks the target by more than the recompute."""

from gateway.routing.config import RoutingConfig
from gateway.routing.router import ReplicaSpec, Router
from tests.routing.helpers import BLOCK, MODEL, Clock, request, route_and_send, state, warm

IDLE = [state("a"), state("b"), state("c")]
BUSY_OWNER = [state("a"), state("b", in_flight=2, prefill_tokens=3000), state("c")]
"""b, which holds prefix 1, has ~4.6 s of prefill queued at 650 tokens/s: under the 5 s target."""


def router_with_clock(clock: Clock, **config: object) -> Router:
    specs = [ReplicaSpec(name, MODEL, None, None) for name in ("a", "b", "c")]
    return Router(RoutingConfig(**config), BLOCK, specs, clock=clock)


def send(router_: Router, count: int, prefix: int = 1, tag: str = "") -> None:
    """Route and dispatch ``count`` requests on ``prefix`` to idle replicas (they go to its owner)."""
    for i in range(count):
        req = request(prefix, request_id=f"sent-{prefix}-{tag}{i}")
        route_and_send(router_, req, IDLE)


def test_a_private_follow_up_waits_for_its_busy_owner_a_shared_prefix_moves() -> None:
    clock = Clock()
    r = router_with_clock(clock)
    warm(r, "b", prefix=1)
    assert r.route(request(1, request_id="turn-2"), BUSY_OWNER).decision.backend == "b"
    send(r, 8)
    decision = r.route(request(1, request_id="ninth"), BUSY_OWNER).decision
    assert (decision.backend, decision.reason) == ("a", "load-spill"), "a ~1.6 s against b's ~4.7 s"


def test_a_shared_prefix_still_goes_to_its_holder_when_that_is_fastest() -> None:
    clock = Clock()
    r = router_with_clock(clock)
    warm(r, "b", prefix=1)
    send(r, 8)
    slightly_busy = [state("a"), state("b", in_flight=1, prefill_tokens=500), state("c")]
    assert r.route(request(1, request_id="ninth"), slightly_busy).decision.backend == "b", "b ~0.87 s, cache credited"


def test_the_count_fades_and_the_prefix_is_private_again() -> None:
    clock = Clock()
    r = router_with_clock(clock)
    warm(r, "b", prefix=1)
    send(r, 8)
    clock.now = 30.0
    assert r.route(request(1, request_id="later"), BUSY_OWNER).decision.backend == "b", "8/e^3 < 8 requests"


def test_only_dispatched_requests_count() -> None:
    """A request routed again (a retry, a held request re-routed) is not counted each time."""
    clock = Clock()
    r = router_with_clock(clock)
    warm(r, "b", prefix=1)
    for _ in range(20):
        r.route(request(1, request_id="same"), IDLE)
    assert r.route(request(1, request_id="same"), BUSY_OWNER).decision.backend == "b"


def test_other_prefixes_do_not_make_a_prefix_shared() -> None:
    clock = Clock()
    r = router_with_clock(clock)
    warm(r, "b", prefix=1)
    for prefix in range(2, 12):
        warm(r, "c", prefix=prefix)
        send(r, 1, prefix=prefix)
    assert r.route(request(1, request_id="turn-2"), BUSY_OWNER).decision.backend == "b"


def test_the_threshold_is_configurable() -> None:
    clock = Clock()
    r = router_with_clock(clock, shared_prefix_requests=2)
    warm(r, "b", prefix=1)
    send(r, 1)
    assert r.route(request(1, request_id="second"), BUSY_OWNER).decision.backend == "b"
    send(r, 1, tag="again")
    assert r.route(request(1, request_id="third"), BUSY_OWNER).decision.backend == "a"
