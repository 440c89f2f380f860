"""The model of llm-d's precise prefix-cache scheduling: its three scorers and max-score picker."""

from typing import Literal

from bench.sim.llmd_model import LlmdPrecisePrefix
from bench.sim.peer_kv_index import PeerKVIndex
from bench.sim.peer_models import LLMD_MODELLED
from bench.sim.simulate import SimFleet, VirtualFleet
from tests.bench.test_simulate import COSTS, REQUESTS

PODS = ["a", "b", "c"]


def chain(prefix: int, blocks: int) -> list[int]:
    return [prefix * 1000 + position for position in range(blocks)]


def scheduler(seed: int = 0, normalization: Literal["absolute", "min-max"] = "absolute") -> LlmdPrecisePrefix:
    return LlmdPrecisePrefix(PODS, PeerKVIndex(PODS), seed, normalization=normalization)


def test_prefix_score_is_the_matched_share_of_the_prompt() -> None:
    model = scheduler()
    model.index.add("a", chain(1, 4))
    model.index.add("b", chain(1, 2))
    model.index.add("c", chain(1, 8)[1:])
    assert model.prefix_scores(chain(1, 8)) == {"a": 0.5, "b": 0.25, "c": 0.0}


def test_min_max_prefix_score_spans_the_pods_that_hold_block_zero() -> None:
    model = scheduler(normalization="min-max")
    model.index.add("a", chain(1, 6))
    model.index.add("b", chain(1, 2))
    assert model.prefix_scores(chain(1, 8)) == {"a": 1.0, "b": 0.0, "c": 0.0}
    model.index.add("b", chain(1, 6))
    assert model.prefix_scores(chain(1, 8)) == {"a": 1.0, "b": 1.0, "c": 0.0}, "equal holders all score 1"


def test_queue_score_is_min_max_over_waiting_requests_and_one_when_equal() -> None:
    model = scheduler()
    assert model.queue_scores() == {"a": 1.0, "b": 1.0, "c": 1.0}
    for pod, waiting in zip(PODS, (0, 2, 4), strict=True):
        model.observe(pod, waiting, 0.0)
    assert model.queue_scores() == {"a": 1.0, "b": 0.5, "c": 0.0}


def test_weighted_sum_prefers_the_cache_until_queue_and_usage_outweigh_it() -> None:
    model = scheduler()
    model.index.add("a", chain(1, 8))
    model.observe("a", 3, 0.9)
    model.observe("b", 0, 0.1)
    model.observe("c", 0, 0.2)
    # a: 2 x 1.0 + 0.1 + 0.0 = 2.1; b: 0 + 0.9 + 1.0 = 1.9; c: 0 + 0.8 + 1.0 = 1.8.
    assert model.route("r1", chain(1, 8), 128) == ("a", "max-score")
    model.observe("a", 3, 1.0)
    model.index.add("b", chain(1, 1))
    # a: 2.0 + 0 + 0 = 2.0; b: 2 x 0.125 + 0.9 + 1.0 = 2.15.
    assert model.route("r2", chain(1, 8), 128) == ("b", "max-score")


def test_a_burst_between_two_scrapes_is_scored_on_the_same_numbers() -> None:
    """No per-request state: a new prefix arriving all at once ties everywhere; random picks."""
    picks = [scheduler(seed).route(f"r{seed}", chain(9, 8), 128) for seed in range(12)]
    assert {pod for pod, _ in picks} == set(PODS)
    assert {reason for _, reason in picks} == {"max-score-tie"}


def test_the_modelled_scheduler_runs_in_virtual_time() -> None:
    fleet = VirtualFleet(LLMD_MODELLED, SimFleet(replicas=3, num_blocks=256, costs=COSTS))
    results = fleet.run(REQUESTS).load.results
    assert len(results) == len(REQUESTS) and all(r.ok for r in results)
    assert isinstance(fleet.peer, LlmdPrecisePrefix)
    assert sum(r.cached_tokens for r in results) > 0
    assert {r.route_reason for r in results} <= {"max-score", "max-score-tie"}
