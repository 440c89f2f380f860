"""backends/proxy.py in process: a 5xx before the first byte is retried; a stream that stops
without [DONE] (cleanly or not) ends with an SSE error event and counts against the replica."""

import pytest

from tests.gateway.fake_replica import (
    Behaviour,
    FakeReplica,
    chat,
    gateway,
    gateway_config,
    replicas,
    sse_payloads,
    state,
)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_backend_5xx_is_retried_on_another_replica(stream: bool) -> None:
    failing, healthy = FakeReplica(Behaviour.FAIL_500), FakeReplica()
    async with replicas(failing, healthy) as urls, gateway(gateway_config(urls), None) as client:
        for index in range(2):
            async with client.post("/v1/chat/completions", json=chat(f"question {index}", stream=stream)) as reply:
                assert reply.status == 200 and reply.headers["x-kvgate-backend"] == "b"
                if stream:
                    assert (await sse_payloads(reply))[-1] == b"[DONE]"
                else:
                    assert (await reply.json())["choices"][0]["message"]["content"] == "Hello there!"
        failures = state(client).pool.backends["a"].breaker._failures
    assert len(failing.bodies) >= 1 and failures == len(failing.bodies)


@pytest.mark.parametrize("behaviour", [Behaviour.END_EARLY, Behaviour.BREAK])
async def test_a_stream_cut_before_done_ends_with_an_error_event(behaviour: Behaviour) -> None:
    cut = FakeReplica(behaviour)
    async with replicas(cut) as urls, gateway(gateway_config(urls), None) as client:
        async with client.post("/v1/chat/completions", json=chat(stream=True)) as reply:
            status, first_two = reply.status, [await reply.content.readline() for _ in range(4)]
            cut.release.set()
            events = await sse_payloads(reply)
        backend = state(client).pool.backends["a"]
    assert status == 200, "the client already had its first chunk"
    assert [line for line in first_two if line.strip()] == [
        b'data: {"id":"fake","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hello"}}]}\n',
        b'data: {"id":"fake","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" there"}}]}\n',
    ]
    assert len(events) == 1 and events[0]["error"]["type"] == "upstream_error"
    assert "backend stream ended" in events[0]["error"]["message"]
    assert backend.breaker._failures == 1 and backend.in_flight == 0
