"""backends/proxy.py in process: a 5xx before the first byte is retried; a stream that stops
without [DONE] (cleanly or not) ends with an SSE error event and counts against the replica."""

import asyncio
from pathlib import Path

import orjson
import pytest

from tests.gateway.fake_replica import (
    HOLD,
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


async def test_a_client_that_hangs_up_once_it_has_done_was_answered(tmp_path: Path) -> None:
    """SDKs close a stream's connection as soon as they read [DONE], often before the gateway's
    handler has returned (here the replica holds its stream open after [DONE]); that client was
    served: the record says 200, not client_gone, and the router settles the ticket as answered."""
    lingering = FakeReplica(Behaviour.LINGER, cached_tokens=16)
    log = tmp_path / "requests.log"
    config = gateway_config([], observability={"request_log_path": str(log)})
    async with replicas(lingering) as urls:
        config["backends"] = gateway_config(urls)["backends"]
        async with gateway(config, None) as client:
            body = chat(stream=True, stream_options={"include_usage": True})
            async with client.post("/v1/chat/completions", json=body) as reply:
                async for line in reply.content:
                    if line.strip() == b"data: [DONE]":
                        break
                reply.close()
            records = await _request_log_lines(log)
            calibration = state(client).router.stats().calibration
            lingering.release.set()
    [record] = records
    assert (record["status"], record["cached_tokens"], record["completion_tokens"]) == ("200", 16, 3)
    assert calibration.count == 1, "the ticket was settled as answered, so the reported hit calibrates"


async def _request_log_lines(log: Path) -> list[dict]:
    """The request log's lines once one is written (records land a loop turn after the handler ends)."""
    for _ in range(200):
        if log.exists() and log.read_text().strip():
            return [orjson.loads(line) for line in log.read_text().splitlines()]
        await asyncio.sleep(0.01)
    raise AssertionError("no request was recorded")


async def test_a_client_that_leaves_mid_stream_leaves_the_prompt_cached_where_it_went() -> None:
    """A client that hangs up after its first chunk was prefilled on its replica (a replica keeps a
    cancelled request's prompt blocks): the router keeps them in its index, so the same prompt
    again goes to that replica with its blocks predicted, rather than being forgotten as a failure."""
    prompt = f"{HOLD} " + " ".join(f"clause {index} of the contract" for index in range(60))
    first, second = FakeReplica(), FakeReplica()
    async with replicas(first, second) as urls, gateway(gateway_config(urls, routing={}), None) as client:
        async with client.post("/v1/chat/completions", json=chat(prompt, stream=True)) as reply:
            await reply.content.readline()
            went_to = reply.headers["x-kvgate-backend"]
            reply.close()
        backend = state(client).pool.backends[went_to]
        for _ in range(200):
            if backend.in_flight == 0:
                break
            await asyncio.sleep(0.01)
        assert backend.in_flight == 0, "the gateway let go of the request the client left"
        async with client.post("/v1/chat/completions", json=chat(prompt)) as again:
            assert again.status == 200
            headers = again.headers
        first.release.set()
        second.release.set()
    assert headers["x-kvgate-backend"] == went_to
    assert int(headers["x-kvgate-predicted-cached-tokens"]) > 0
