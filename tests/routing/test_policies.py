"""Each policy on synthetic replica snapshots: who is chosen, and the reason given."""

from collections import Counter

import pytest

from gateway.routing.config import POLICIES
from tests.routing.helpers import insert, request, route_and_send, router, state, warm

IDLE = [state("a"), state("b"), state("c")]


def test_cache_aware_prefers_the_replica_holding_the_prefix() -> None:
    r = router()
    warm(r, "b", prefix=1)
    decision = r.route(request(1), IDLE).decision
    assert (decision.backend, decision.reason) == ("b", "prefix-hit")
    assert decision.predicted_cached_tokens == 960
    assert decision.ranked[0] == "b" and sorted(decision.ranked) == ["a", "b", "c"]


def test_cache_aware_spills_a_follow_up_only_when_its_owner_cannot_keep_up() -> None:
    """At 650 tokens/s the 5 s target is about 3,250 queued tokens; the move recomputes 960 more."""
    r = router()
    warm(r, "b", prefix=1)
    busy = [state("a"), state("b", in_flight=2, prefill_tokens=3000), state("c")]
    assert r.route(request(1), busy).decision.backend == "b", "b ~4.7 s: slow, but moving costs the prefix"
    swamped = [state("a", in_flight=1, prefill_tokens=64), state("b", in_flight=8, prefill_tokens=4000), state("c")]
    assert r.route(request(1), swamped).decision.backend == "b", "b ~6.3 s breaks 5 s by less than the 1.5 s recompute"
    drowning = [state("a", in_flight=1, prefill_tokens=64), state("b", in_flight=8, prefill_tokens=5000), state("c")]
    decision = r.route(request(1), drowning).decision
    assert (decision.backend, decision.reason) == ("c", "load-spill")
    assert decision.predicted_cached_tokens == 0


def test_cache_aware_counts_replica_reported_queue() -> None:
    r = router(decode_wait_s_per_request=0.5)
    warm(r, "a", prefix=1)
    decision = r.route(request(1), [state("a", num_running=10, num_waiting=5), state("b")]).decision
    assert (decision.backend, decision.reason) == ("b", "load-spill")


def test_no_useful_match_goes_to_least_loaded_then_slowest_turnover_then_name() -> None:
    r = router(min_match_tokens=2000, short_prompt_match_share=0.0)
    warm(r, "a", prefix=1)
    decision = r.route(request(1), [state("a"), state("b", in_flight=1, prefill_tokens=100), state("c")]).decision
    assert (decision.backend, decision.reason) == ("c", "no-match"), "b is 0.15 s behind, beyond the 0.1 s slack"
    assert r.route(request(2), IDLE).decision.backend == "b", "a has taken new blocks, b and c none: name decides"
    fresh = router()
    assert [fresh.route(request(9), IDLE).decision.backend for _ in range(3)] == ["a", "a", "a"], "deterministic"


def test_a_new_prefix_goes_to_the_slowest_turning_cache_within_the_slack() -> None:
    """b is 0.08 s slower than a (within the 0.1 s slack) but has taken fewer new blocks lately,
    so its least recently used blocks are older: a new prefix evicts less there."""
    r = router()
    for prefix in (1, 2):
        insert(r, request(prefix, request_id=f"old-{prefix}"), "a")
    insert(r, request(3, request_id="old-3"), "c")
    replicas = [state("a"), state("b", in_flight=1, prefill_tokens=50), state("c")]
    assert r.route(request(9), replicas).decision.backend == "b"
    assert router(placement_slack_s=0.0).route(request(9), replicas).decision.backend == "a", "no slack: the fastest"


def test_on_fast_replicas_the_slack_is_a_share_of_the_fastest_estimate() -> None:
    """At 10,000 tokens/s the new prompt's fastest TTFT is ~0.10 s: b's extra 0.05 s is within the
    0.1 s slack but half the request's TTFT, past the 10 % share, so the fastest wins; with a share
    of 1 the slack is 0.1 s again and b's older cache wins."""
    tight = router(prefill_tokens_per_s=10_000.0)
    loose = router(prefill_tokens_per_s=10_000.0, placement_slack_share=1.0)
    for r in (tight, loose):
        for prefix in (1, 2):
            insert(r, request(prefix, request_id=f"old-{prefix}"), "a")
        insert(r, request(3, request_id="old-3"), "c")
    replicas = [state("a"), state("b", in_flight=1, prefill_tokens=500), state("c", in_flight=1, prefill_tokens=5000)]
    assert tight.route(request(9), replicas).decision.backend == "a"
    assert loose.route(request(9), replicas).decision.backend == "b"


def test_new_prefixes_spread_over_idle_replicas() -> None:
    r = router()
    placed = []
    for prefix in range(6):
        decision = route_and_send(r, request(prefix, request_id=str(prefix)), IDLE)
        placed.append(decision.backend)
    assert Counter(placed) == {"a": 2, "b": 2, "c": 2}


def test_prefix_affinity_ignores_load() -> None:
    r = router("prefix_affinity")
    warm(r, "b", prefix=1)
    swamped = [state("a"), state("b", in_flight=50, prefill_tokens=100_000), state("c")]
    assert (r.route(request(1), swamped).decision.backend, r.route(request(1), swamped).decision.reason) == (
        "b",
        "prefix-hit",
    )
    assert (
        r.route(request(2), [state("a", in_flight=1, prefill_tokens=5), state("b"), state("c")]).decision.reason
        == "no-match"
    )


def test_least_loaded() -> None:
    r = router("least_loaded")
    warm(r, "a", prefix=1)
    replicas = [
        state("a", in_flight=1, prefill_tokens=500),
        state("b", in_flight=3, prefill_tokens=100),
        state("c", in_flight=2, prefill_tokens=900),
    ]
    decision = r.route(request(1), replicas).decision
    assert (decision.backend, decision.reason) == ("b", "least-loaded")
    assert decision.ranked == ["b", "a", "c"]
    assert decision.predicted_cached_tokens == 0


def test_round_robin_cycles_in_name_order() -> None:
    r = router("round_robin")
    decisions = [r.route(request(1), IDLE).decision for _ in range(6)]
    assert [d.backend for d in decisions] == ["a", "b", "c", "a", "b", "c"]
    assert {d.reason for d in decisions} == {"round-robin"}
    assert decisions[1].ranked == ["b", "c", "a"]


def test_random_is_seedable_and_uses_every_replica() -> None:
    picks = [
        [router("random", random_seed=7).route(request(1), IDLE).decision.backend for _ in range(1)] for _ in range(2)
    ]
    assert picks[0] == picks[1]
    r = router("random", random_seed=7)
    chosen = [r.route(request(1), IDLE).decision for _ in range(60)]
    assert {d.backend for d in chosen} == {"a", "b", "c"} and {d.reason for d in chosen} == {"random"}


def test_session_is_sticky_and_survives_other_replicas_leaving() -> None:
    r = router("session", names=("a", "b", "c", "d"))
    replicas = [state(name) for name in "abcd"]
    owners = {key: r.route(request(1, session_key=key), replicas).decision.backend for key in map(str, range(40))}
    assert set(owners.values()) == {"a", "b", "c", "d"}
    for key, owner in owners.items():
        decision = r.route(request(1, session_key=key), replicas).decision
        assert (decision.backend, decision.reason) == (owner, "session")
        without_fallback = [replica for replica in replicas if replica.name != decision.ranked[1]]
        assert r.route(request(1, session_key=key), without_fallback).decision.backend == owner


def test_session_without_key_routes_cache_aware() -> None:
    r = router("session")
    warm(r, "c", prefix=4)
    assert (r.route(request(4), IDLE).decision.backend, r.route(request(4), IDLE).decision.reason) == (
        "c",
        "prefix-hit",
    )


def test_scorer_weights_compose_policies() -> None:
    r = router("cache_aware", scorers={"session_affinity": 10.0})
    warm(r, "a", prefix=1)
    sticky = r.route(request(1, session_key="user-42"), IDLE).decision
    assert sticky.backend == r.route(request(5, session_key="user-42"), IDLE).decision.backend


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_ranks_every_eligible_replica(policy: str) -> None:
    decision = router(policy).route(request(1, session_key="s"), IDLE).decision
    assert sorted(decision.ranked) == ["a", "b", "c"] and decision.ranked[0] == decision.backend


def test_replicas_without_a_measured_rate_are_assumed_as_fast_as_those_with_one() -> None:
    r = router()
    warm(r, "a", prefix=1)
    measured_a = [state("a", prefill_tokens_per_s=1e6), state("b"), state("c")]
    assert r.route(request(2), measured_a).decision.backend == "b", "a's speed is no reason to pile new prefixes on it"
    assert r.route(request(1), measured_a).decision.backend == "a"
