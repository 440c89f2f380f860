"""cache_aware spreads new conversations: a session's first turn that matches a cached prefix goes
where its estimated TTFT plus one prefill of its own size per conversation already active there is
lowest, because all its later turns will run where it lands and take turns with theirs; whatever it
matches, other sessions put there, so no owner holds it."""

import pytest

from gateway.routing.config import RoutingConfig
from gateway.routing.router import ReplicaSpec, Router
from gateway.routing.session_footprint import SessionFootprints
from tests.routing.helpers import BLOCK, MODEL, Clock, request, route_and_send, state, warm

PROMPT = 1600
"""The 960-token system prompt (prefix 1) and 640 tokens of the conversation's own: at the default
650 tokens/s, 0.98 s of prefill where the system prompt is cached, 2.46 s where it is not."""
IDLE = [state("a"), state("b")]


def fleet(clock: Clock | None = None, **config: object) -> Router:
    """Two replicas with room for every conversation; only a holds the system prompt, which counts
    as shared from its first request on."""
    specs = [ReplicaSpec(name, MODEL, None, 100_000) for name in ("a", "b")]
    r = Router(RoutingConfig(**{"shared_prefix_requests": 1.0, **config}), BLOCK, specs, clock or Clock())
    warm(r, "a", prefix=1)
    return r


def open_conversations(r: Router, count: int, first: int = 0) -> list[str]:
    return [
        route_and_send(r, request(1, PROMPT, f"user-{n}", session_key=f"user-{n}"), IDLE).backend
        for n in range(first, first + count)
    ]


def test_the_third_conversation_copies_the_system_prompt_rather_than_join_two() -> None:
    """On a the third pays 0.98 s for itself and 1.97 s for the two conversations there (2.95 s);
    on b, 2.46 s for the system prompt and its own part. Then both hold the system prompt and the
    fewer conversations decide."""
    assert open_conversations(fleet(), 6) == ["a", "a", "b", "b", "a", "b"]


def test_a_prefix_not_yet_counted_shared_does_not_hold_a_new_conversation() -> None:
    """Eight requests must end their match on a prefix before it counts as shared; until then the
    system prompt looks like a's private history, which the owner rule would keep every follow-up on."""
    assert open_conversations(fleet(shared_prefix_requests=8.0), 3) == ["a", "a", "b"]


@pytest.mark.parametrize("off", ["spread_conversations", "session_footprints"])
def test_turned_off_every_conversation_stays_with_the_system_prompt(off: str) -> None:
    assert open_conversations(fleet(**{off: False}), 6) == ["a"] * 6


def test_a_session_already_active_is_not_a_new_conversation() -> None:
    """user-0 and user-1 live on a; user-1's next question (its own key, a new 640 tokens) goes where
    the system prompt is cached, as a third conversation would not."""
    r = fleet()
    assert open_conversations(r, 2) == ["a", "a"]
    follow_up = request(1, PROMPT, "user-1-second", session_key="user-1")
    assert route_and_send(r, follow_up, IDLE).backend == "a"
    assert open_conversations(r, 1, first=2) == ["b"]


def test_requests_without_a_session_key_are_not_spread() -> None:
    r = fleet()
    assert open_conversations(r, 2) == ["a", "a"]
    one_shots = [route_and_send(r, request(1, PROMPT, f"one-shot-{n}"), IDLE).backend for n in range(4)]
    assert one_shots == ["a"] * 4


def test_a_conversation_gone_quiet_for_the_ttl_no_longer_counts() -> None:
    clock = Clock()
    r = fleet(clock, session_ttl_s=60.0, shared_prefix_window_s=1000.0)
    assert open_conversations(r, 2) == ["a", "a"]
    clock.now = 61.0
    assert open_conversations(r, 1, first=2) == ["a"], "a minute earlier it went to b"


@pytest.mark.parametrize(("now", "active"), [(0.0, True), (9.9, True), (10.0, False)])
def test_a_session_is_active_until_its_last_turn_is_a_ttl_old(now: float, active: bool) -> None:
    footprints = SessionFootprints(ttl_s=10.0)
    footprints.add("b", "s1", prompt_blocks=4, held_blocks=0, now=0.0)
    assert footprints.is_active("s1", now) is active
    assert not footprints.is_active("s2", 0.0)
