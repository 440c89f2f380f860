"""Only the part of a match that tells replicas apart counts: a prefix every candidate holds
(a shared system prompt, the traces' common 64-token root) is no reason to go anywhere."""

from gateway.routing.router import Router
from gateway.routing.types import RouteRequest
from radix.hashing import block_hashes
from tests.routing.helpers import BLOCK, MODEL, insert, router, state

ROOT = list(range(1000, 1128))
"""128 tokens (8 blocks) that every request below starts with."""


def prompt_request(
    tail_seed: int, tail_tokens: int, shared_tail: int = 0, request_id: str = "r", root: tuple[int, ...] = tuple(ROOT)
) -> RouteRequest:
    """``root``, then ``shared_tail`` tokens of conversation ``tail_seed``, then tokens unique to ``request_id``."""
    conversation = [tail_seed * 100_003 + i for i in range(shared_tail)]
    unique = [hash((request_id, i)) % 50_000 + 60_000 for i in range(tail_tokens)]
    tokens = [*root, *conversation, *unique]
    return RouteRequest(request_id, MODEL, block_hashes(tokens, BLOCK, MODEL), len(tokens), 16, token_ids=tokens)


def hold(r: Router, replica: str, req: RouteRequest) -> None:
    insert(r, req, replica)


def test_a_root_every_replica_holds_is_no_match() -> None:
    r = router(min_match_tokens=64)
    for name in "abc":
        hold(r, name, prompt_request(0, 64, request_id=f"seed-{name}"))
    one_shot = prompt_request(0, 400, request_id="one-shot")
    replicas = [state("a", in_flight=1, prefill_tokens=300), state("b"), state("c", in_flight=1, prefill_tokens=10)]
    decision = r.route(one_shot, replicas).decision
    assert (decision.backend, decision.reason) == ("b", "no-match"), "placed by load alone"
    assert decision.predicted_cached_tokens == 128, "the root is still cached there, and predicted so"


def test_a_root_only_some_replicas_hold_still_counts_as_a_match() -> None:
    r = router(min_match_tokens=64)
    hold(r, "a", prompt_request(0, 64, request_id="seed-a"))
    decision = r.route(prompt_request(0, 400, request_id="one-shot"), [state("a"), state("b"), state("c")]).decision
    assert (decision.backend, decision.reason) == ("a", "prefix-hit")


def test_the_conversation_beyond_the_shared_root_decides() -> None:
    r = router(min_match_tokens=64)
    for name in "abc":
        hold(r, name, prompt_request(0, 64, request_id=f"seed-{name}"))
    hold(r, "c", prompt_request(7, 16, shared_tail=320, request_id="turn-1"))
    decision = r.route(
        prompt_request(7, 64, shared_tail=320, request_id="turn-2"), [state("a"), state("b"), state("c")]
    ).decision
    assert (decision.backend, decision.reason, decision.predicted_cached_tokens) == ("c", "prefix-hit", 448)


def test_a_distinct_part_shorter_than_min_match_tokens_is_no_match() -> None:
    r = router(min_match_tokens=64)
    for name in "abc":
        hold(r, name, prompt_request(0, 64, request_id=f"seed-{name}"))
    hold(r, "c", prompt_request(7, 0, shared_tail=48, request_id="turn-1"))
    decision = r.route(
        prompt_request(7, 64, shared_tail=48, request_id="turn-2"), [state("a"), state("b"), state("c")]
    ).decision
    assert decision.reason == "no-match"


def test_prefix_affinity_scores_the_distinct_part_normalised_across_candidates() -> None:
    r = router("prefix_affinity", min_match_tokens=16)
    for name in "abc":
        hold(r, name, prompt_request(0, 64, request_id=f"seed-{name}"))
    hold(r, "b", prompt_request(7, 0, shared_tail=160, request_id="half"))
    hold(r, "c", prompt_request(7, 0, shared_tail=320, request_id="whole"))
    ctx_request = prompt_request(7, 64, shared_tail=320, request_id="next")
    decision = r.route(ctx_request, [state("a"), state("b"), state("c", in_flight=9, prefill_tokens=9000)]).decision
    assert decision.ranked == ["c", "b", "a"], "320 beyond the root scores 1, 160 scores 0.5, the root alone 0"


FLEET = tuple(f"r{index:02d}" for index in range(32))


def root_held_by_few(min_match_fraction: float = 0.0) -> Router:
    """32 replicas; only the three that served the first requests hold ROOT (as in a large fleet)."""
    r = router(names=FLEET, min_match_tokens=64, min_match_fraction=min_match_fraction)
    for name in FLEET[:3]:
        hold(r, name, prompt_request(0, 64, request_id=f"seed-{name}"))
    return r


def fleet_state() -> list:
    """The root holders each run a request; the others are idle. One-shots: 128 root + 1,400 tokens."""
    return [state(name, in_flight=1, prefill_tokens=20) if name in FLEET[:3] else state(name) for name in FLEET]


def test_in_a_large_fleet_a_root_few_replicas_hold_pulls_one_shots_onto_them_by_tokens_alone() -> None:
    decision = (
        root_held_by_few(min_match_fraction=0.0)
        .route(prompt_request(0, 1400, request_id="one-shot"), fleet_state())
        .decision
    )
    assert decision.backend in FLEET[:3] and decision.reason == "prefix-hit", "the behaviour min_match_fraction fixes"


def test_with_min_match_fraction_a_root_that_is_a_sliver_of_the_prompt_is_no_match() -> None:
    decision = (
        root_held_by_few(min_match_fraction=0.1)
        .route(prompt_request(0, 1400, request_id="one-shot"), fleet_state())
        .decision
    )
    assert decision.reason == "no-match" and decision.backend not in FLEET[:3], "placed by load: the root spreads"


def test_with_min_match_fraction_a_conversation_still_goes_to_its_owner() -> None:
    r = root_held_by_few(min_match_fraction=0.1)
    hold(r, "r17", prompt_request(7, 16, shared_tail=320, request_id="turn-1"))
    decision = r.route(prompt_request(7, 64, shared_tail=320, request_id="turn-2"), fleet_state()).decision
    assert (decision.backend, decision.reason) == ("r17", "prefix-hit"), "448 of 512 tokens cached there"


def test_a_short_prompt_goes_where_half_of_it_is_cached() -> None:
    """A 44-token prompt can never match 64 tokens: the 32 of it that replica c holds count."""
    r = router(min_match_tokens=64)
    hold(r, "c", prompt_request(7, 0, shared_tail=32, request_id="turn-1", root=()))
    replicas = [state("a"), state("b"), state("c", in_flight=1, prefill_tokens=10)]
    decision = r.route(prompt_request(7, 12, shared_tail=32, request_id="turn-2", root=()), replicas).decision
    assert (decision.backend, decision.reason, decision.predicted_cached_tokens) == ("c", "prefix-hit", 32)


def test_a_short_prompt_matched_under_half_is_placed_by_load() -> None:
    r = router(min_match_tokens=64)
    hold(r, "c", prompt_request(7, 0, shared_tail=16, request_id="turn-1", root=()))
    replicas = [state("a"), state("b"), state("c", in_flight=1, prefill_tokens=10)]
    decision = r.route(prompt_request(7, 30, shared_tail=16, request_id="turn-2", root=()), replicas).decision
    assert decision.reason == "no-match" and decision.backend != "c", "16 of 46 tokens: placed by load"


def test_a_short_prompt_leaves_its_owner_when_the_owner_is_slower_than_the_slack() -> None:
    """32 cached tokens save a few milliseconds: not worth 0.8 s of queue (500 tokens at 650/s)."""
    r = router(min_match_tokens=64)
    hold(r, "c", prompt_request(7, 0, shared_tail=32, request_id="turn-1", root=()))
    replicas = [state("a"), state("b"), state("c", in_flight=1, prefill_tokens=500)]
    decision = r.route(prompt_request(7, 12, shared_tail=32, request_id="turn-2", root=()), replicas).decision
    assert decision.backend in ("a", "b") and decision.reason == "load-spill"
