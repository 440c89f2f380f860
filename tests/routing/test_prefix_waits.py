"""Prompts a replica holds behind a prefix it is computing (``ReplicaState.prefix_waits``): a
request that shares that prefix waits with them, one that does not is admitted ahead of them and
delays each by its own prefill."""

from gateway.routing.router import Router
from gateway.routing.types import ReplicaState
from tests.routing.helpers import BLOCK, request, router, state, warm

FAST = 10_000.0
"""Prefill tokens/s: an idle replica computes a 1,024-token prompt in 0.1 s."""
BURST = request(2, request_id="burst-leader")
"""A burst on prefix 2: its first request is computing the prefix, the rest wait for it."""
HELD = {BURST.block_hashes[0]: (39_000, 30)}
"""30 burst requests (1,300 tokens each) held behind the leader's first block."""


def estimating_router(precise: bool = True) -> Router:
    return router(prefill_tokens_per_s=FAST, ttft_target_s=0.5, precise=precise)


def fleet(held: dict[int, tuple[int, int]], others: int = 3_000) -> list[ReplicaState]:
    """b has the burst queued (its held part ``held``); a and c ``others`` tokens of ordinary work."""
    return [
        state("a", queued_prefill_tokens=others),
        state("b", queued_prefill_tokens=40_000, prefix_waits=held),
        state("c", queued_prefill_tokens=others),
    ]


def test_a_cached_follow_up_passes_the_held_burst_and_stays_on_its_owner() -> None:
    r = estimating_router()
    warm(r, "b", prefix=1)
    decision = r.route(request(1), fleet(HELD)).decision
    assert (decision.backend, decision.reason) == ("b", "prefix-hit"), (
        "64 tokens to compute, admitted ahead of the burst"
    )
    counted_whole = r.route(request(1), fleet({})).decision
    assert counted_whole.reason == "load-spill", "without the report, b's 4 s queue sends it away"


def test_a_request_on_the_awaited_prefix_waits_with_the_held_prompts() -> None:
    """Another burst request: subtracting the held prompts would make b look idle and draw the
    whole burst there (three long held prompts: passing them would cost little)."""
    r = estimating_router()
    few_long = {BURST.block_hashes[0]: (39_000, 3)}
    decision = r.route(request(2, request_id="burst-follower"), fleet(few_long, others=6_000)).decision
    assert decision.backend != "b"
    assert decision.ranked[-1] == "b"
    unrelated = r.route(request(3, request_id="unrelated"), fleet(few_long, others=6_000)).decision
    assert unrelated.backend == "b", "a prompt that does not share the burst's prefix passes it"


def test_a_new_prompt_is_charged_the_delay_it_would_cause_the_prompts_it_passes() -> None:
    """1,024 tokens to compute ahead of 30 held prompts delays them 30 x 1,024 tokens' worth: b
    is no cheaper than its whole queue for it."""
    r = estimating_router()
    decision = r.route(request(3, request_id="new"), fleet(HELD)).decision
    assert decision.backend != "b"


def test_held_prompts_count_whole_in_predicted_mode() -> None:
    """Without KV events the replica's block size and hashes are unknown: every request would
    look unrelated to the burst."""
    predicted = estimating_router(precise=False)
    warm(predicted, "b", prefix=1)
    assert predicted.route(request(1), fleet(HELD)).decision.reason == "load-spill"


async def test_held_prompts_count_whole_where_the_engine_blocks_are_another_size() -> None:
    """An engine caching 32-token blocks names prefixes by hashes the gateway's 16-token ones never equal."""
    r = estimating_router()
    await r.start()
    try:
        warm(r, "b", prefix=1)
        assert r.route(request(1), fleet(HELD)).decision.reason == "prefix-hit"
        r.tracker.subscribers["b"].applier.engine_block_size = 2 * BLOCK
        assert r.route(request(1), fleet(HELD)).decision.reason == "load-spill"
    finally:
        await r.stop()
