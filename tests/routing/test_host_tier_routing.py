"""Precise mode prices a host-tier hit between a device hit and a recompute."""

from gateway.routing.config import RoutingConfig
from gateway.routing.router import ReplicaSpec, Router
from tests.routing.helpers import BLOCK, MODEL, request, state


def precise_router(**config: object) -> Router:
    specs = [ReplicaSpec(name, MODEL, f"tcp://127.0.0.1:{5550 + i}", None) for i, name in enumerate("abc")]
    return Router(RoutingConfig(**config), BLOCK, specs)


def hold(router: Router, replica: str, prefix: int, on_host: bool) -> None:
    """What the replica's KV events would record: the prefix's 60 blocks, on device or on host."""
    router.tracker.index.insert(replica, request(prefix).block_hashes[:60], 1.0, on_host=on_host)


def test_a_device_hit_beats_the_same_hit_in_host_memory() -> None:
    router = precise_router()
    hold(router, "a", 1, on_host=True)
    hold(router, "b", 1, on_host=False)
    decision = router.route(request(1), [state("a"), state("b"), state("c")]).decision
    assert decision.backend == "b" and decision.predicted_cached_tokens == 960
    assert decision.ranked[-1] == "c"


def test_a_host_hit_beats_a_recompute_and_reports_its_tokens_as_cached() -> None:
    router = precise_router()
    hold(router, "a", 1, on_host=True)
    matched = router.tracker.match(request(1).block_hashes)
    assert router.tracker.host_blocks(request(1).block_hashes, matched) == {"a": 60}
    decision = router.route(request(1), [state("a"), state("c")]).decision
    assert decision.backend == "a" and decision.reason == "prefix-hit"
    assert decision.predicted_cached_tokens == 960, "cached_tokens counts host hits, as the engine reports them"


def test_the_price_of_a_host_token_is_configurable() -> None:
    hashes = request(1).block_hashes
    for cost, priced in ((0.0, 960), (0.15, 816), (1.0, 0)):
        router = precise_router(host_hit_cost=cost)
        hold(router, "a", 1, on_host=True)
        matched = router.tracker.match(hashes)
        assert router.tracker.priced_cached(hashes, matched, {"a": 960}) == {"a": priced}
    expensive = precise_router(host_hit_cost=1.0)
    hold(expensive, "a", 1, on_host=True)
    assert expensive.route(request(1), [state("a"), state("c")]).decision.reason == "no-match"
