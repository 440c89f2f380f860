"""Per-session TTLs: a session may ask to be retained longer (or shorter) than ``--session-ttl-s``
(issue 29: ``prompt_cache_retention: 24h``, Anthropic ``cache_control.ttl``), and sessions of
different TTLs expire by their own deadlines while the bound stays shared fairly."""

import orjson
import pytest

from engine.core.block_manager import BlockManager
from engine.core.session_hint import SessionHint, session_hint
from engine.core.session_retention import SessionRetention
from engine.server.openai_checks import parse_request
from protocol.openai import ChatCompletionRequest
from protocol.openai_errors import OpenAIError
from tests.engine.test_session_retention import BLOCK, MODEL, Clock, cached, serve

FIVE_MINUTES, DAY = 300.0, 86400.0


def hashes(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


def test_a_24h_session_seen_first_outlives_5m_ones_seen_after_it() -> None:
    clock = Clock()
    retention = SessionRetention(100, ttl_s=FIVE_MINUTES, clock=clock)
    retention.record_turn("t:long", hashes(0, 4), ttl_s=DAY)
    for index in range(3):
        clock.now += 10
        retention.record_turn(f"t:short{index}", hashes(100 + 10 * index, 4))
    clock.now += FIVE_MINUTES + 1
    released = retention.expire()
    assert sorted(released) == sorted(hashes(100, 4) + hashes(110, 4) + hashes(120, 4))
    assert all(retention.is_retained(block_hash) for block_hash in hashes(0, 4))
    assert retention.num_sessions == 1
    clock.now = DAY + 1
    assert sorted(retention.expire()) == hashes(0, 4)
    retention.assert_invariants()


def test_a_session_seen_again_takes_its_new_turns_ttl() -> None:
    clock = Clock()
    retention = SessionRetention(100, ttl_s=FIVE_MINUTES, clock=clock)
    retention.record_turn("s", hashes(0, 2), ttl_s=DAY)
    clock.now += 1
    retention.record_turn("s", hashes(0, 2))
    assert retention.expires_at("s") == 1 + FIVE_MINUTES
    clock.now += FIVE_MINUTES + 1
    assert sorted(retention.expire()) == hashes(0, 2), "the stale 24 h deadline is skipped, not honoured"
    retention.assert_invariants()


def test_a_requested_ttl_is_capped_at_the_maximum() -> None:
    retention = SessionRetention(10, ttl_s=FIVE_MINUTES, clock=Clock(), max_ttl_s=3600)
    assert retention.ttl_for(None) == FIVE_MINUTES
    assert retention.ttl_for(DAY) == 3600
    assert retention.ttl_for(60) == 60
    retention.record_turn("s", hashes(0, 1), ttl_s=DAY)
    assert retention.expires_at("s") == 3600


def test_the_deadline_heap_stays_bounded_by_the_live_sessions() -> None:
    clock = Clock()
    retention = SessionRetention(100, ttl_s=FIVE_MINUTES, clock=clock)
    for turn in range(1000):
        clock.now += 0.1
        retention.record_turn(f"s{turn % 3}", hashes(10 * (turn % 3), 2), ttl_s=DAY if turn % 2 else None)
    assert len(retention._deadlines) <= 2 * retention.num_sessions + 64
    retention.assert_invariants()


def test_long_ttls_buy_time_not_a_larger_share_of_the_bound() -> None:
    """A tenant flooding 24 h sessions pushes out its own, never another tenant's 5 min session
    that holds no more than its share."""
    clock = Clock()
    retention = SessionRetention(100, ttl_s=FIVE_MINUTES, clock=clock)
    retention.record_turn("victim:chat", hashes(0, 30))
    for index in range(20):
        clock.now += 1
        _, pushed_out, _ = retention.record_turn(f"flood:s{index}", hashes(1000 + 40 * index, 40), ttl_s=DAY)
        assert not set(pushed_out) & set(range(30))
        retention.assert_invariants()
    assert retention.retained_by("victim") == 30 and retention.num_retained <= 100


@pytest.mark.parametrize("long_ttl_s", [DAY, None])
def test_after_5m_one_shots_evict_the_expired_turn_and_keep_the_24h_one(long_ttl_s: float | None) -> None:
    clock = Clock()
    manager = BlockManager(12, BLOCK, MODEL, retention=SessionRetention(8, ttl_s=FIVE_MINUTES, clock=clock))
    long_turn, short_turn = list(range(100, 108)), list(range(200, 208))
    serve(manager, 0, long_turn + [0], session="t:long", session_ttl_s=long_ttl_s)
    clock.now += 1
    serve(manager, 1, short_turn + [0], session="t:short")
    clock.now += FIVE_MINUTES + 1
    serve(manager, 2, list(range(300, 336)) + [0])  # 10 blocks: the 8 empty, then 2 evicted
    if long_ttl_s is None:
        assert manager.num_retained_free_blocks == 0, "both turns expired: the 24 h TTL is what keeps one"
    else:
        assert (cached(manager, long_turn), cached(manager, short_turn)) == (2, 0)
        assert manager.num_retained_free_blocks == 2


def chat(**fields: object) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_request(orjson.dumps(body), ChatCompletionRequest)


def test_the_engine_reads_the_ttl_from_the_gateways_field_else_the_openai_retention() -> None:
    assert session_hint(chat(prompt_cache_key="k")) == SessionHint("k", None)
    assert session_hint(chat(prompt_cache_key="k", prompt_cache_retention="in_memory")) == SessionHint("k", None)
    assert session_hint(chat(prompt_cache_key="k", prompt_cache_retention="24h")) == SessionHint("k", DAY)
    gateways = chat(kvgate_session="ns:d", kvgate_session_ttl_s=3600, prompt_cache_retention="24h")
    assert session_hint(gateways) == SessionHint("ns:d", 3600)
    assert session_hint(chat(prompt_cache_retention="24h")) is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt_cache_retention": "forever"}, "prompt_cache_retention"),
        ({"prompt_cache_retention": 24}, "prompt_cache_retention"),
        ({"kvgate_session_ttl_s": 0}, "kvgate_session_ttl_s"),
        ({"kvgate_session_ttl_s": "1h"}, "kvgate_session_ttl_s"),
    ],
)
def test_a_bad_retention_field_is_a_400_naming_it(fields: dict[str, object], param: str) -> None:
    with pytest.raises(OpenAIError) as refused:
        chat(**fields)
    assert refused.value.status == 400 and refused.value.param == param
