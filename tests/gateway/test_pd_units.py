"""The pieces of disaggregated prefill/decode that need no replica: roles in the config and the pool,
the NixlConnector-shaped bodies, which requests may disaggregate, and how a verdict is labelled."""

from typing import Literal

import orjson
import pytest

from gateway.backends.circuit_breaker import CircuitBreaker
from gateway.backends.pool import Backend, BackendPool
from gateway.backends.prefill_leg import decode_body, prefill_body, read_prefill_answer, refuses_transfer
from gateway.config import BackendSpec, ConfigError, HealthConfig, parse_config
from gateway.pd_dispatch import PdChoice, PdOutcome, disaggregable, local_choice
from gateway.routing.config import DisaggregationConfig
from gateway.routing.pd_decider import PdDecision
from gateway.routing.prefill_overflow import prefill_replicas_serve, queued_prefill_s
from gateway.routing.types import ReplicaState, RouteDecision, RouteReason


def backend(name: str, role: Literal["prefill", "decode", "both"]) -> Backend:
    health = HealthConfig()
    spec = BackendSpec(name=name, url=f"http://{name}:8000", role=role)
    replica = Backend(spec, "m", CircuitBreaker(name, health))
    replica.healthy = True
    return replica


def test_role_defaults_to_both_and_an_unknown_role_is_refused_naming_the_key() -> None:
    config = parse_config({"backends": [{"name": "a", "url": "http://a:1"}]}, "test")
    assert config.backends[0].role == "both"
    with pytest.raises(ConfigError, match=r"backends\.0\.role"):
        parse_config({"backends": [{"name": "a", "url": "http://a:1", "role": "prefil"}]}, "test")


def test_the_pool_keeps_prefill_replicas_from_client_requests_and_decode_replicas_from_legs() -> None:
    pool = BackendPool([backend("p", "prefill"), backend("d", "decode"), backend("b", "both")], HealthConfig())
    assert [replica.name for replica in pool.usable("m")] == ["d", "b"]
    assert [replica.name for replica in pool.prefill_usable("m")] == ["p", "b"]
    settings = DisaggregationConfig()
    assert pool.disaggregates("m", settings)
    all_both = BackendPool([backend("x", "both"), backend("y", "both")], HealthConfig())
    assert not all_both.disaggregates("m", settings)
    assert all_both.disaggregates("m", DisaggregationConfig(among_both=True))


def test_a_prefill_replica_takes_client_requests_only_while_every_serving_replica_is_past_the_overflow_limit() -> None:
    """``prefill_overflow_s``: 1,000 queued tokens at 1,000 tokens a second is one second of prefill."""
    pool = BackendPool([backend("p", "prefill"), backend("b1", "both"), backend("b2", "both")], HealthConfig())
    b1, b2 = pool.backends["b1"], pool.backends["b2"]
    overflow = DisaggregationConfig(prefill_overflow_s=0.5)

    def takers(settings: DisaggregationConfig) -> list[str]:
        return [replica.name for replica in pool.usable("m", settings, assumed_tokens_per_s=1000.0)]

    with b1.occupy(1000, 0, 1000):
        assert takers(overflow) == ["b1", "b2"], "one serving replica still has room"
        with b2.occupy(400, 0, 400):
            assert takers(overflow) == ["b1", "b2"], "0.4 s queued is under the limit"
            with b2.occupy(200, 0, 200):
                assert takers(overflow) == ["p", "b1", "b2"], "both past 0.5 s: the prefill replica serves too"
                assert takers(DisaggregationConfig()) == ["b1", "b2"], "off by default"
                assert takers(DisaggregationConfig(prefill_overflow_s=2.0)) == ["b1", "b2"]
    assert takers(overflow) == ["b1", "b2"], "the queues drained: back to prefill legs only"


def test_overflow_reads_the_replicas_reported_queue_and_rate_first() -> None:
    settings = DisaggregationConfig(prefill_overflow_s=1.0)
    reported = ReplicaState("r", "m", True, 1, 0, queued_prefill_tokens=3000, prefill_tokens_per_s=2000.0)
    own_count = ReplicaState("o", "m", True, 1, 1500)
    assert queued_prefill_s(reported, 100.0) == 1.5
    assert queued_prefill_s(own_count, 1000.0) == 1.5
    assert prefill_replicas_serve([reported, own_count], settings, 1000.0)
    assert not prefill_replicas_serve([reported, own_count], DisaggregationConfig(prefill_overflow_s=1.5), 1000.0)
    assert not prefill_replicas_serve([], settings, 1000.0), "no serving replica: nothing is past capacity"


def test_the_prefill_leg_is_one_unstreamed_token_that_asks_for_a_remote_decode() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 50,
        "max_completion_tokens": 50,
        "min_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
    }
    leg = prefill_body(body)
    assert leg == {
        "model": "m",
        "messages": body["messages"],
        "max_tokens": 1,
        "max_completion_tokens": 1,
        "stream": False,
        "n": 1,
        "temperature": 0,
        "kv_transfer_params": {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        },
    }
    assert body["max_tokens"] == 50 and "kv_transfer_params" not in body, "the client's body is left as it was"
    assert "max_completion_tokens" not in prefill_body({"max_tokens": 9})
    params = {"do_remote_prefill": True, "remote_block_ids": [4, 5]}
    assert decode_body(body, params) == {**body, "kv_transfer_params": params}


def test_the_prefill_answer_gives_its_params_only_when_they_point_at_kv_to_pull() -> None:
    usage = {"prompt_tokens": 40, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 32}}
    params = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_block_ids": [1], "remote_port": 9}
    read = read_prefill_answer(orjson.dumps({"choices": [], "usage": usage, "kv_transfer_params": params}))
    assert read.params == params and read.usage is not None and read.usage.cached_tokens == 32
    assert read_prefill_answer(orjson.dumps({"usage": usage, "kv_transfer_params": None})).params is None
    assert read_prefill_answer(orjson.dumps({"kv_transfer_params": {"do_remote_prefill": False}})).params is None
    assert read_prefill_answer(b"not json").params is None
    assert read_prefill_answer(b"[1]").usage is None


def test_a_4xx_naming_kv_transfer_params_is_a_replica_without_a_connector() -> None:
    named = {"error": {"message": "unsupported", "param": "kv_transfer_params", "type": "invalid_request_error"}}
    said = {"error": {"message": "kv_transfer_params needs --kv-transfer-config", "type": "invalid_request_error"}}
    other = {"error": {"message": "max_tokens too large", "param": "max_tokens"}}
    assert refuses_transfer(orjson.dumps(named)) and refuses_transfer(orjson.dumps(said))
    assert not refuses_transfer(orjson.dumps(other)) and not refuses_transfer(b"oops")


@pytest.mark.parametrize(
    ("path", "body", "native", "expected"),
    [
        ("/v1/chat/completions", {"messages": []}, False, True),
        ("/v1/completions", {"prompt": "one"}, False, True),
        ("/v1/completions", {"prompt": [1, 2, 3]}, False, True),
        ("/v1/completions", {"prompt": ["one"]}, False, True),
        ("/v1/completions", {"prompt": ["one", "two"]}, False, False),
        ("/v1/completions", {"prompt": [[1], [2]]}, False, False),
        ("/v1/chat/completions", {"messages": [], "n": 2}, False, False),
        ("/v1/completions", {"prompt": "one", "best_of": 3}, False, False),
        ("/v1/embeddings", {"input": "one"}, False, False),
        ("/v1/responses", {"input": "one"}, False, False),
        ("/v1/chat/completions", {"messages": []}, True, False),
    ],
)
def test_only_one_sequence_on_chat_or_text_completions_disaggregates(
    path: str, body: dict, native: bool, expected: bool
) -> None:
    assert disaggregable(path, body, native) is expected


def test_a_verdict_is_labelled_by_why_the_prefill_stayed_local() -> None:
    def verdict(split: bool, reason: str = "pd-local: est") -> PdDecision:
        return PdDecision(split, reason, 1.0, 2.0)

    assert local_choice(verdict(True, "pd-split"), 1000, 0, 256) is PdChoice.DISAGGREGATED
    assert local_choice(verdict(False, "pd-never"), 1000, 0, 256) is PdChoice.LOCAL_NEVER
    assert local_choice(verdict(False), 1000, 900, 256) is PdChoice.LOCAL_WARM
    assert local_choice(verdict(False), 200, 0, 256) is PdChoice.LOCAL_SHORT
    assert local_choice(verdict(False), 1000, 100, 256) is PdChoice.LOCAL_CHEAPER


def test_the_route_reason_names_the_decision_and_both_replicas_when_a_leg_was_sent() -> None:
    decode = RouteDecision("d0", RouteReason.PREFIX_HIT, 0, ["d0"])
    assert PdOutcome(PdChoice.DISAGGREGATED, "p0").route_reason(decode) == (
        "prefix-hit; pd=disaggregated; prefill=p0; decode=d0"
    )
    assert PdOutcome(PdChoice.PREFILL_FAILED, "p0").route_reason(decode).endswith("prefill=p0; decode=d0")
    assert PdOutcome(PdChoice.LOCAL_WARM, "p0").route_reason(decode) == "prefix-hit; pd=local-prefill-warm"
