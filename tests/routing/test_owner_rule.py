"""cache_aware's owner rule: a replica holding the longest useful match keeps its follow-ups
unless its estimated TTFT breaks the target by more than a move would spend recomputing the
owner's cached prefix, and another replica's meets the target."""

from tests.routing.helpers import request, router, state, warm

FAST = 10_000.0
"""Prefill tokens/s for these tests: an idle replica computes the 1,024-token prompt in 0.1 s."""


def test_owner_keeps_a_follow_up_while_it_meets_the_target_even_if_another_is_faster() -> None:
    r = router(prefill_tokens_per_s=FAST, ttft_target_s=0.5)
    warm(r, "b", prefix=1)
    busy_owner = [state("a"), state("b", in_flight=1, prefill_tokens=4000), state("c")]
    decision = r.route(request(1), busy_owner).decision
    assert (decision.backend, decision.reason) == ("b", "prefix-hit"), "b's ~0.41 s meets 0.5 s; c's 0.1 s is no reason"
    assert decision.predicted_cached_tokens == 960


def test_owner_breaking_the_target_loses_the_request_to_one_that_meets_it() -> None:
    r = router(prefill_tokens_per_s=FAST, ttft_target_s=0.5)
    warm(r, "b", prefix=1)
    swamped_owner = [
        state("a", in_flight=1, prefill_tokens=500),
        state("b", in_flight=1, prefill_tokens=6000),
        state("c"),
    ]
    decision = r.route(request(1), swamped_owner).decision
    assert (decision.backend, decision.reason) == ("c", "load-spill")
    assert decision.predicted_cached_tokens == 0
    assert decision.ranked == ["c", "a", "b"], "movers by their own estimate, the owner last"


def test_an_owner_late_by_less_than_the_prefix_recompute_keeps_the_request() -> None:
    """A move to c recomputes b's 960 cached tokens: 0.096 s at 10,000 tokens/s."""
    r = router(prefill_tokens_per_s=FAST, ttft_target_s=0.5)
    warm(r, "b", prefix=1)
    slightly_late = [state("a"), state("b", in_flight=1, prefill_tokens=5500), state("c")]
    decision = r.route(request(1), slightly_late).decision
    assert (decision.backend, decision.reason) == ("b", "prefix-hit"), "b ~0.56 s is 0.06 s late, less than 0.096 s"
    late = [state("a"), state("b", in_flight=1, prefill_tokens=6000), state("c")]
    decision = r.route(request(1), late).decision
    assert (decision.backend, decision.reason) == ("a", "load-spill"), "b ~0.61 s is 0.11 s late, more than 0.096 s"


def test_the_recompute_is_timed_at_the_movers_prefill_rate() -> None:
    """The same 0.06 s of lateness outweighs the recompute on a replica ten times as fast."""
    r = router(prefill_tokens_per_s=FAST, ttft_target_s=0.5)
    warm(r, "b", prefix=1)
    replicas = [
        state("a", prefill_tokens_per_s=FAST),
        state("b", in_flight=1, prefill_tokens=5500, prefill_tokens_per_s=FAST),
        state("c", prefill_tokens_per_s=10 * FAST),
    ]
    decision = r.route(request(1), replicas).decision
    assert (decision.backend, decision.reason) == ("c", "load-spill")


def test_a_raised_target_keeps_the_follow_up_on_the_owner() -> None:
    r = router(prefill_tokens_per_s=FAST, ttft_target_s=1.0)
    warm(r, "b", prefix=1)
    swamped_owner = [state("a"), state("b", in_flight=1, prefill_tokens=6000), state("c")]
    assert r.route(request(1), swamped_owner).decision.backend == "b"


def test_when_every_replica_breaks_the_target_only_a_clearly_faster_one_wins() -> None:
    """At 650 tokens/s an idle replica needs 1.58 s for the prompt: everyone breaks 0.5 s."""
    r = router(ttft_target_s=0.5)
    warm(r, "b", prefix=1)
    slower_owner = [state("a"), state("b", in_flight=1, prefill_tokens=600), state("c")]
    assert r.route(request(1), slower_owner).decision.backend == "b", "b ~1.03 s against a + target = 2.08 s"
    hot_owner = [state("a"), state("b", in_flight=1, prefill_tokens=2000), state("c")]
    decision = r.route(request(1), hot_owner).decision
    assert (decision.backend, decision.reason) == ("a", "load-spill"), "b ~3.18 s: a hot prefix still spreads"


def test_a_second_holder_of_the_whole_prefix_is_an_owner_too() -> None:
    r = router(prefill_tokens_per_s=FAST, ttft_target_s=0.5)
    warm(r, "a", prefix=1)
    warm(r, "b", prefix=1)
    replicas = [state("a", in_flight=1, prefill_tokens=4000), state("b", in_flight=1, prefill_tokens=1000), state("c")]
    assert r.route(request(1), replicas).decision.backend == "b", "both own the prefix: the faster owner wins, c never"
