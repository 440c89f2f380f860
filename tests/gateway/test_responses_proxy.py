"""The gateway relays a Responses stream in process: usage read from its closing event, and a
stream cut before that event ends with a Responses `error` event and counts against the replica."""

from dataclasses import dataclass
from pathlib import Path

import orjson
from aiohttp import web

from tests.gateway.fake_replica import FakeReplica, gateway, gateway_config, replicas, sse_payloads, state

USAGE = {"input_tokens": 9, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 2, "total_tokens": 11}


def named_event(data: dict) -> bytes:
    return b"event: " + data["type"].encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


@dataclass
class ResponsesReplica(FakeReplica):
    """Streams `response.created`, then (once ``release`` is set) two deltas and `response.completed`,
    unless told to stop early."""

    complete_stream: bool = True

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_post("/v1/responses", self.respond)
        return app

    async def respond(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(named_event({"type": "response.created", "response": {"status": "in_progress"}}))
        await self.release.wait()
        for delta in ("Hel", "lo"):
            await response.write(named_event({"type": "response.output_text.delta", "delta": delta}))
        if self.complete_stream:
            done = {"type": "response.completed", "response": {"status": "completed", "usage": USAGE}}
            await response.write(named_event(done))
        await response.write_eof()
        return response


def responses_body() -> dict:
    return {"model": "smollm2-135m", "input": "Say hello.", "stream": True, "max_output_tokens": 8}


async def test_a_whole_responses_stream_is_relayed_with_its_usage(tmp_path: Path) -> None:
    replica = ResponsesReplica()
    log = tmp_path / "requests.log"
    async with (
        replicas(replica) as urls,
        gateway(gateway_config(urls, observability={"request_log_path": str(log)}), None) as client,
        client.post("/v1/responses", json=responses_body()) as reply,
    ):
        assert (await reply.content.readline()).startswith(b"event: response.created")
        prefilling = state(client).pool.backends["a"].in_flight_prefill_tokens
        replica.release.set()
        events = await sse_payloads(reply)
    assert [event["type"] for event in events] == [
        "response.created",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.completed",
    ]
    assert "stream_options" not in replica.bodies[0], "chat's usage option is not added to a Responses body"
    line = orjson.loads(log.read_text().splitlines()[-1])
    assert line["status"] == "200" and line["completion_tokens"] == 2 and line["cached_tokens"] == 4
    assert prefilling > 0, "response.created is not the first token: the prefill still counts as pending"
    assert line["ttft_s"] is not None


async def test_a_responses_stream_cut_before_its_closing_event_ends_with_an_error_event() -> None:
    replica = ResponsesReplica(complete_stream=False)
    replica.release.set()
    async with replicas(replica) as urls, gateway(gateway_config(urls), None) as client:
        async with client.post("/v1/responses", json=responses_body()) as reply:
            raw = await reply.read()
        backend = state(client).pool.backends["a"]
    assert raw.rstrip().endswith(b"}") and b"event: error\n" in raw
    last = orjson.loads(raw.rstrip().rsplit(b"data: ", 1)[1])
    assert last["type"] == "error" and last["code"] == "upstream_error"
    assert backend.breaker._failures == 1 and backend.in_flight == 0
