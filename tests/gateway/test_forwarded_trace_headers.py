"""Client header bytes never break the request head sent to a backend (issue 28, finding 12).

A ``tracestate`` that is not UTF-8, beside a valid ``traceparent``, was forwarded as it came and
failed to encode: 500, no request-log line. Now a valid W3C ``tracestate`` is forwarded, any other
is dropped, and a header that cannot be sent at all is refused by the gateway without blaming the
replica.
"""

import asyncio
from dataclasses import dataclass, field

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

from tests.faults.hostile import raw_post
from tests.gateway.fake_replica import FakeReplica, chat, gateway, gateway_config, replicas, state

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"traceparent: 00-{TRACE_ID}-b7ad6b7169203331-01".encode()


@dataclass
class HeaderRecorder(FakeReplica):
    """Records the trace headers of every completion request it answers."""

    seen: list[dict[str, str | None]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = super().app()
        app.middlewares.append(self.record)
        return app

    @web.middleware
    async def record(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/v1/chat"):
            self.seen.append({name: request.headers.get(name) for name in ("traceparent", "tracestate", "baggage")})
        return await handler(request)


async def _send(header: bytes) -> tuple[int, dict[str, str | None]]:
    recorder = HeaderRecorder()
    async with replicas(recorder) as urls, gateway(gateway_config(urls), None) as client:
        assert client.port is not None
        status, _, _ = await asyncio.to_thread(
            raw_post, client.port, "/v1/chat/completions", orjson.dumps(chat()), TRACEPARENT, header
        )
    return status, recorder.seen[-1] if recorder.seen else {}


async def test_a_valid_tracestate_is_forwarded_and_any_other_dropped() -> None:
    status, seen = await _send(b"tracestate: congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
    assert status == 200 and seen["tracestate"] == "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
    assert seen["traceparent"] is not None and TRACE_ID in seen["traceparent"]
    for header in (
        b"tracestate: \xff\xfe=\xfd",
        b"tracestate: vendor=\xc3\xa9",
        b"tracestate: k=" + b"v" * 600,
        b"tracestate: no equals sign",
    ):
        status, seen = await _send(header)
        assert status == 200 and seen["tracestate"] is None, header
        assert seen["traceparent"] is not None and TRACE_ID in seen["traceparent"], "the trace still continues"


async def test_a_configured_header_that_cannot_be_sent_is_a_clear_error_and_no_breaker_failure() -> None:
    async with replicas(FakeReplica()) as urls:
        config = gateway_config(urls)
        config["backends"][0]["headers"] = {"x-team": "équipe"}
        async with gateway(config, None) as client:
            async with client.post("/v1/chat/completions", json=chat()) as reply:
                status, error = reply.status, (await reply.json())["error"]
            breaker = state(client).pool.backends["a"].breaker
    assert status == 500 and "x-team" in error["message"] and "équipe" not in error["message"]
    assert breaker._failures == 0
