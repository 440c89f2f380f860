"""Session footprints: a replica whose active sessions have filled its KV cache stops drawing new
conversations that its cache would make it evict, even when it alone holds their system prompt.
The fleets here do not spread new conversations by count (``spread_conversations``,
tests/routing/test_conversation_spread.py), which would move them sooner: the price of an
overflow is what these tests measure."""

import pytest

from gateway.routing import session_footprint
from gateway.routing.config import RoutingConfig
from gateway.routing.router import ReplicaSpec, Router
from gateway.routing.session_footprint import SessionFootprints
from gateway.routing.types import RouteRequest
from radix.hashing import block_hashes
from tests.routing.helpers import BLOCK, MODEL, Clock, request, route_and_send, state, warm

CAPACITY = 200
"""KV blocks per replica. Each conversation below is 100 blocks: the 60-block system prompt and 40
of its own."""
PROMPT = 1600
IDLE = [state("a"), state("b")]


def fleet(capacity: int | None = CAPACITY, clock: Clock | None = None, **config: object) -> Router:
    """Two replicas; the system prompt (prefix 1) counts as shared from its first request on."""
    specs = [ReplicaSpec(name, MODEL, None, capacity) for name in ("a", "b")]
    routing = RoutingConfig(shared_prefix_requests=1.0, spread_conversations=False, **config)
    r = Router(routing, BLOCK, specs, clock or Clock())
    warm(r, "a", prefix=1)
    return r


def open_conversations(r: Router, count: int, first: int = 0, keyed: bool = True) -> list[str]:
    """Each conversation's first turn: the system prompt and 640 tokens of its own."""
    backends = []
    for number in range(first, first + count):
        turn = request(1, PROMPT, f"user-{number}", session_key=f"user-{number}" if keyed else None)
        decision = route_and_send(r, turn, IDLE)
        backends.append(decision.backend)
    return backends


def test_new_conversations_go_elsewhere_once_the_holder_s_sessions_would_overflow_its_cache() -> None:
    """The sixth conversation makes a's sessions exceed its 200 blocks by 40 (640 tokens to recompute
    later), less than the 960-token system prompt b lacks; the seventh by 80 (1,280 tokens), more."""
    r = fleet()
    assert open_conversations(r, 7) == ["a"] * 6 + ["b"]


@pytest.mark.parametrize(
    ("capacity", "config", "keyed"),
    [
        (CAPACITY, {"session_footprints": False}, True),
        (CAPACITY, {}, False),
        (None, {}, True),
    ],
    ids=["turned-off", "no-session-key", "capacity-unknown"],
)
def test_without_footprints_every_conversation_stays_with_the_system_prompt(
    capacity: int | None, config: dict[str, object], keyed: bool
) -> None:
    r = fleet(capacity, **config)
    assert open_conversations(r, 8, keyed=keyed) == ["a"] * 8


def test_the_configured_default_capacity_stands_in_for_an_unknown_one() -> None:
    r = fleet(None, default_capacity_blocks=CAPACITY)
    assert open_conversations(r, 7) == ["a"] * 6 + ["b"]


def test_a_conversation_s_next_turn_adds_only_its_new_blocks() -> None:
    """Four conversations hold 160 blocks of a; a second turn of the last, 40 blocks longer, makes 200
    (not 300, as its whole prompt would), so a fifth conversation still fits a by 640 tokens' worth
    less than the system prompt b lacks."""
    r = fleet()
    assert open_conversations(r, 4) == ["a"] * 4
    tokens = request(1, PROMPT, "user-3").token_ids + list(range(640))
    second = RouteRequest("user-3-t2", MODEL, block_hashes(tokens, BLOCK, MODEL), len(tokens), 32, "user-3")
    ticket = r.route(second, IDLE)
    assert (ticket.decision.backend, ticket.decision.predicted_cached_tokens) == ("a", PROMPT)
    r.on_routed(ticket, "a")
    assert open_conversations(r, 1, first=4) == ["a"]


def test_footprints_of_sessions_gone_quiet_for_the_ttl_no_longer_count() -> None:
    clock = Clock()
    r = fleet(clock=clock, session_ttl_s=60.0, shared_prefix_window_s=1000.0)
    assert open_conversations(r, 6) == ["a"] * 6
    clock.now = 61.0
    assert open_conversations(r, 1, first=6) == ["a"], "a seventh conversation a minute earlier went to b"


def test_footprints_add_up_per_session_and_replica() -> None:
    footprints = SessionFootprints(ttl_s=10.0)
    footprints.add("a", "s1", prompt_blocks=7, held_blocks=2, now=0.0)
    footprints.add("a", "s1", prompt_blocks=10, held_blocks=7, now=1.0)
    footprints.add("a", "s2", prompt_blocks=6, held_blocks=2, now=2.0)
    footprints.add("b", "s1", prompt_blocks=7, held_blocks=0, now=2.0)
    assert (footprints.blocks("a", 2.0), footprints.blocks("b", 2.0)) == (12, 7)
    assert footprints.blocks("a", 11.5) == 4, "s1 was last seen at 1.0 on a"
    assert footprints.blocks("a", 12.0) == 0
    footprints.remove_replica("b")
    assert footprints.blocks("b", 2.0) == 0


def test_a_turn_that_does_not_continue_the_last_replaces_it() -> None:
    """Independent questions under one ``user``: the engine retains only the latest turn."""
    footprints = SessionFootprints(ttl_s=10.0)
    footprints.add("a", "user", prompt_blocks=70, held_blocks=60, now=0.0)
    footprints.add("a", "user", prompt_blocks=65, held_blocks=60, now=1.0)
    assert footprints.blocks("a", 1.0) == 5
    footprints.add("a", "user", prompt_blocks=80, held_blocks=65, now=2.0)
    assert footprints.blocks("a", 2.0) == 20, "this turn continues the last: its history stays"


def test_a_flood_of_sessions_forgets_the_least_recently_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_footprint, "MAX_SESSIONS", 3)
    footprints = SessionFootprints(ttl_s=100.0)
    for number in range(5):
        footprints.add("a", f"s{number}", prompt_blocks=number + 1, held_blocks=0, now=float(number))
    assert footprints.blocks("a", 5.0) == 3 + 4 + 5


@pytest.mark.parametrize(("footprints", "expected"), [(True, "a"), (False, "b")])
def test_among_tied_replicas_a_new_conversation_goes_where_fewest_sessions_are(footprints: bool, expected: str) -> None:
    """Both replicas hold the system prompt, so a new conversation ties on estimate. b serves three
    conversations; a took one long one-shot prompt, so a's cache turns over faster: without
    footprints the turnover decides (b), with them the session count does (a)."""
    r = fleet(capacity=10_000, session_footprints=footprints)
    warm(r, "b", prefix=1)
    for number in range(3):
        turn = request(1, PROMPT, f"user-{number}", session_key=f"user-{number}")
        route_and_send(r, turn, IDLE, backend="b")
    one_shot = request(2, 4 * PROMPT, "one-shot")
    route_and_send(r, one_shot, IDLE, backend="a")
    decision = r.route(request(1, PROMPT, "user-9", session_key="user-9"), IDLE).decision
    assert (decision.backend, decision.reason) == (expected, "no-match")
