"""The P/D decider (gateway/routing/pd_decider.py): split a request or prefill it where it decodes."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gateway.routing.config import DisaggregationConfig, RoutingConfig
from gateway.routing.pd_decider import decide_disaggregation, transfer_s_per_token
from gateway.routing.types import ReplicaState, RouteRequest
from protocol.replica_stats import DecodeProgress
from tests.routing.helpers import PD_RATE as RATE
from tests.routing.helpers import pd_replica as replica

TRANSFER_S = 1e-5
"""Seconds per token moved: 100x faster than prefilling it, as on any real link."""


def request(prompt_tokens: int) -> RouteRequest:
    return RouteRequest("r", "m", [], prompt_tokens, 64)


def decide(
    prompt: int,
    decode: ReplicaState,
    decode_cached: int,
    prefill: ReplicaState | None,
    prefill_cached: int = 0,
    **disaggregation: object,
) -> tuple[bool, str]:
    config = RoutingConfig.model_validate({"disaggregation": disaggregation})
    choice = decide_disaggregation(
        request(prompt), decode, decode_cached, prefill, prefill_cached, config, config.disaggregation, TRANSFER_S
    )
    return choice.disaggregate, choice.reason


def test_long_uncached_prompt_splits_and_says_so() -> None:
    split, reason = decide(8000, replica("d", running=8), 0, replica("p"))
    assert split
    assert reason.startswith("pd-split")


def test_long_uncached_prompt_on_an_idle_decode_replica_still_splits() -> None:
    """The next request sent to the decode replica would wait out the prefill."""
    split, _ = decide(8000, replica("d"), 0, replica("p"))
    assert split


def test_warm_follow_up_stays_local_and_says_how_much_was_cached() -> None:
    split, reason = decide(8000, replica("d", running=8), 7936, replica("p"), prefill_cached=7936)
    assert not split
    assert reason.startswith("pd-local") and "99% cached" in reason


def test_short_prompt_stays_local() -> None:
    assert not decide(200, replica("d", running=8), 0, replica("p"))[0]


def test_a_queue_at_the_prefill_replica_keeps_the_prefill_local() -> None:
    assert decide(4000, replica("d", running=1), 0, replica("p"))[0]
    assert not decide(4000, replica("d", running=1), 0, replica("p", queued=200_000))[0]


def test_a_slow_link_keeps_the_prefill_local() -> None:
    config = RoutingConfig()
    args = (request(4000), replica("d", running=1), 0, replica("p"), 0, config, config.disaggregation)
    assert decide_disaggregation(*args, transfer_s=TRANSFER_S).disaggregate
    assert not decide_disaggregation(*args, transfer_s=10 / RATE).disaggregate


def test_a_prefill_replica_that_decodes_more_is_no_better_place() -> None:
    config = RoutingConfig()
    settings_ = config.disaggregation
    busy_prefill = replica("p", running=16)
    decode = replica("d", running=4)
    assert decide_disaggregation(request(4000), decode, 0, busy_prefill, 0, config, settings_, TRANSFER_S).disaggregate
    assert not decide_disaggregation(
        request(4000), decode, 0, busy_prefill, 0, config, settings_, TRANSFER_S, prefill_decodes=True
    ).disaggregate


@pytest.mark.parametrize(
    ("prefill", "reason"),
    [(None, "pd-local: no prefill replica"), (replica("d"), "pd-local: no prefill replica")],
)
def test_no_other_prefill_replica_means_local(prefill: ReplicaState | None, reason: str) -> None:
    assert decide(8000, replica("d", running=8), 0, prefill) == (False, reason)


def test_an_unhealthy_prefill_replica_means_local() -> None:
    sick = ReplicaState("p", "m", False, 0, 0)
    assert not decide(8000, replica("d", running=8), 0, sick)[0]


def test_modes_always_and_never() -> None:
    assert decide(8000, replica("d"), 7936, replica("p"), mode="always") == (True, "pd-always")
    assert decide(8000, replica("d", running=8), 0, replica("p"), mode="never") == (False, "pd-never")


def test_transfer_cost_is_bytes_over_bandwidth() -> None:
    settings_ = DisaggregationConfig(kv_bytes_per_token=131_072, kv_bandwidth_bytes_per_s=25e9)
    assert transfer_s_per_token(settings_) == pytest.approx(131_072 / 25e9)


def test_settings_reject_unknown_modes() -> None:
    with pytest.raises(ValidationError):
        RoutingConfig.model_validate({"disaggregation": {"mode": "sometimes"}})


prompts = st.integers(min_value=1, max_value=16_000)
loads = st.integers(min_value=0, max_value=64)


@settings(max_examples=200, deadline=None)
@given(prompt=prompts, running=loads, queued=st.integers(0, 50_000), held=st.integers(0, 255))
def test_property_warm_follow_up_stays_local(prompt: int, running: int, queued: int, held: int) -> None:
    """The decode replica holds all but a stall-free tail, and is no busier than the prefill one."""
    cached = max(prompt - held, 0)
    decode = replica("d", running=running, queued=queued)
    prefill = replica("p", running=running, queued=queued)
    assert not decide(prompt, decode, cached, prefill, prefill_cached=cached)[0]


@settings(max_examples=200, deadline=None)
@given(prompt=st.integers(2_000, 16_000), running=loads)
def test_property_long_uncached_prompt_with_an_idle_prefill_replica_splits(prompt: int, running: int) -> None:
    assert decide(prompt, replica("d", running=running), 0, replica("p"))[0]


@settings(max_examples=300, deadline=None)
@given(
    prompt=prompts,
    cached=st.integers(0, 16_000),
    more=st.integers(1, 16_000),
    running=loads,
    queued_decode=st.integers(0, 50_000),
    queued_prefill=st.integers(0, 50_000),
    prefill_cached=st.integers(0, 16_000),
)
def test_property_monotonic_in_uncached_tokens(
    prompt: int, cached: int, more: int, running: int, queued_decode: int, queued_prefill: int, prefill_cached: int
) -> None:
    """Once a request splits, one whose decode replica lacks more of the same prompt splits too."""
    cached = min(cached, prompt)
    fewer_cached = max(cached - more, 0)
    decode = replica("d", running=running, queued=queued_decode)
    prefill = replica("p", queued=queued_prefill)
    prefill_cached = min(prefill_cached, prompt)
    if decide(prompt, decode, cached, prefill, prefill_cached)[0]:
        assert decide(prompt, decode, fewer_cached, prefill, prefill_cached)[0]


ROOMY = DecodeProgress(200, 2.0, 500)
"""10 ms a token for 200 tokens: seconds of slack under a 50 ms mean ITL."""
TIGHT = DecodeProgress(20, 0.9, 500)
"""47 ms a token: a tenth of a second of slack."""


def with_decodes(name: str, decodes: list[DecodeProgress]) -> ReplicaState:
    return dataclasses.replace(replica(name, running=len(decodes)), decodes=tuple(decodes))


def decide_both(decode: ReplicaState, prefill: ReplicaState, decode_prefills: bool = True) -> tuple[bool, str]:
    """A 4,000-token uncached prompt between two replicas that both decode."""
    config = RoutingConfig()
    choice = decide_disaggregation(
        request(4000), decode, 0, prefill, 0, config, config.disaggregation, TRANSFER_S, True, decode_prefills
    )
    return choice.disaggregate, choice.reason


def test_a_replica_serving_both_whose_decodes_have_room_prefills_locally() -> None:
    """Its 8 decodes absorb the 3.7 s stall within 50 ms a token: the split would only add the transfer."""
    split, reason = decide_both(with_decodes("d", [ROOMY] * 8), with_decodes("p", []))
    assert not split and reason.startswith("pd-local")


def test_a_replica_serving_both_whose_decodes_a_stall_would_break_splits() -> None:
    split, reason = decide_both(with_decodes("d", [TIGHT] * 8), with_decodes("p", [ROOMY] * 8))
    assert split and reason.startswith("pd-split")


def test_a_decode_replica_prices_every_decode_it_delays_whatever_their_room() -> None:
    """Keeping a ``decode`` replica's steps free of prefills is what it is for."""
    split, _ = decide_both(with_decodes("d", [ROOMY] * 8), with_decodes("p", []), decode_prefills=False)
    assert split


def test_without_reported_decodes_a_replica_serving_both_prices_every_decode() -> None:
    """vLLM reports no decodes: the per-decode price, as before."""
    split, _ = decide_both(replica("d", running=8), replica("p"))
    assert split
