"""dispatch.py in process: retries before the first byte, the 503 when they run out, the KV-fit
fallback, circuit-breaker accounting, and the usage the gateway keeps for itself."""

from pathlib import Path

from gateway.backends.circuit_breaker import BreakerState
from tests.gateway.fake_replica import (
    HOLD,
    PROMPT_TOKENS,
    Behaviour,
    FakeReplica,
    chat,
    gateway,
    gateway_config,
    replicas,
    sse_payloads,
    state,
)


async def test_a_replica_that_drops_the_connection_is_retried_on_another() -> None:
    failing, healthy = FakeReplica(Behaviour.DROP), FakeReplica()
    async with replicas(failing, healthy) as urls, gateway(gateway_config(urls), None) as client:
        replies = []
        for index in range(2):
            async with client.post("/v1/chat/completions", json=chat(f"question {index}")) as reply:
                replies.append(
                    (reply.status, reply.headers["x-kvgate-backend"], reply.headers["x-kvgate-route-reason"])
                )
                assert (await reply.json())["choices"][0]["message"]["content"] == "Hello there!"
        breaker = state(client).pool.backends["a"].breaker
    assert len(failing.bodies) >= 1, "round robin sent one of the two requests to a first"
    assert [(status, backend) for status, backend, _ in replies] == [(200, "b"), (200, "b")]
    assert sum(reason == "retry" for _, _, reason in replies) == len(failing.bodies)
    assert len(healthy.bodies) == 2
    assert breaker._failures == len(failing.bodies) and breaker.state is BreakerState.CLOSED


async def test_after_three_unreachable_replicas_the_client_gets_a_503() -> None:
    """(Replicas that answer 5xx are tests/gateway/test_answered_errors.py's.)"""
    fakes = [FakeReplica(Behaviour.DROP) for _ in range(4)]
    async with (
        replicas(*fakes) as urls,
        gateway(gateway_config(urls), None) as client,
        client.post("/v1/chat/completions", json=chat()) as reply,
    ):
        status, headers, body = reply.status, reply.headers, await reply.json()
    assert status == 503 and headers["Retry-After"] == "1"
    assert body["error"]["code"] == "service_unavailable" and "3 replicas in a row" in body["error"]["message"]
    assert sorted(len(fake.bodies) for fake in fakes) == [0, 1, 1, 1], "three attempts, each on a new replica"


async def test_a_request_that_does_not_fit_its_first_choice_goes_where_it_fits() -> None:
    """Each request needs 2 KV blocks (22 prompt + 8 new tokens); a holds 3 and one held stream reserves 2."""
    small, large = FakeReplica(), FakeReplica()
    async with replicas(small, large) as urls:
        config = gateway_config(urls)
        config["backends"][0]["kv_capacity_blocks"] = 3
        config["backends"][1]["kv_capacity_blocks"] = 1000
        async with gateway(config, None) as client:
            holder = chat(f"{HOLD} " + "a longer question " * 4, stream=True)
            async with client.post("/v1/chat/completions", json=holder) as held:
                assert held.headers["x-kvgate-backend"] == "a"
                await held.content.readline()
                assert state(client).pool.backends["a"].kv_reserved_blocks == 2
                served_by = []
                for index in range(4):
                    async with client.post(
                        "/v1/chat/completions", json=chat(f"a longer question {index} " * 4)
                    ) as reply:
                        assert reply.status == 200 and reply.headers["x-kvgate-route-reason"] != "retry"
                        served_by.append(reply.headers["x-kvgate-backend"])
                small.release.set()
                assert (await sse_payloads(held))[-1] == b"[DONE]"
    assert served_by == ["b"] * 4, "round robin alone would have sent two of them to a"
    assert len(small.bodies) == 1


async def test_the_breaker_opens_after_repeated_failures_and_traffic_skips_that_replica() -> None:
    failing, healthy = FakeReplica(Behaviour.FAIL_500), FakeReplica()
    config = gateway_config([], health={"eject_after_failures": 2, "eject_s": 60})
    async with replicas(failing, healthy) as urls:
        config["backends"] = gateway_config(urls)["backends"]
        async with gateway(config, None) as client:
            for index in range(8):
                async with client.post("/v1/chat/completions", json=chat(f"question {index}")) as reply:
                    assert reply.status == 200 and reply.headers["x-kvgate-backend"] == "b"
            pool = state(client).pool
            assert pool.backends["a"].breaker.state is BreakerState.OPEN
            assert pool.backends["b"].breaker.state is BreakerState.CLOSED
            status = await (await client.get("/admin/backends")).json()
    assert len(failing.bodies) == 2, "after two failures in a row a takes no more requests"
    assert len(healthy.bodies) == 8
    assert {backend["name"]: backend["in_flight"] for backend in status["backends"]} == {"a": 0, "b": 0}


async def test_a_backend_4xx_passes_through_without_a_retry_or_a_breaker_failure() -> None:
    rejecting = FakeReplica(Behaviour.REJECT_400)
    async with replicas(rejecting) as urls, gateway(gateway_config(urls), None) as client:
        async with client.post("/v1/chat/completions", json=chat()) as reply:
            status, body = reply.status, await reply.json()
        breaker = state(client).pool.backends["a"].breaker
    assert status == 400 and body["error"]["message"] == "bad"
    assert len(rejecting.bodies) == 1 and breaker._failures == 0


async def test_streams_always_ask_for_usage_and_hide_it_unless_the_client_asked(tmp_path: Path) -> None:
    replica = FakeReplica(cached_tokens=32)
    async with replicas(replica) as urls, gateway(gateway_config(urls), None) as client:
        async with client.post("/v1/chat/completions", json=chat(stream=True)) as reply:
            plain = await sse_payloads(reply)
        options = {"include_usage": True}
        async with client.post("/v1/chat/completions", json=chat(stream=True, stream_options=options)) as reply:
            with_usage = await sse_payloads(reply)
        async with client.post("/v1/chat/completions", json=chat()) as reply:
            whole = await reply.json()
        calibration = state(client).router.stats()
    assert [body["stream_options"]["include_usage"] for body in replica.bodies[:2]] == [True, True]
    assert plain[-1] == b"[DONE]" and all(chunk.get("usage") is None for chunk in plain[:-1])
    assert with_usage[-1] == b"[DONE]" and with_usage[-2]["choices"] == []
    assert with_usage[-2]["usage"]["prompt_tokens_details"]["cached_tokens"] == 32
    assert whole["usage"]["prompt_tokens"] == PROMPT_TOKENS
    assert whole["usage"]["prompt_tokens_details"]["cached_tokens"] == 32
    assert calibration, "the router saw the reported cached tokens"
