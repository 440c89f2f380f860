"""A replica's 5xx answer caused by the request's content never ejects a replica (issue 28, finding 2).

The reported attack: a request every engine answers 500 (then ``logit_bias: {"²": 1}``) was retried
on each replica and counted a breaker failure on each, so three such requests ejected every replica.
Now a 5xx answer counts against a replica only once another replica served the same request.
"""

from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from gateway.backends.circuit_breaker import BreakerState
from tests.gateway.fake_replica import FakeReplica, chat, gateway, gateway_config, replicas, state

POISON = "[poison]"
EJECT_AFTER = 3


@dataclass
class ChokingReplica(FakeReplica):
    """Answers 500 to any request whose body holds ``POISON`` (an engine bug triggered by content);
    serves every other request."""

    choked: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.choke_or_complete)
        return app

    async def choke_or_complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if POISON.encode() in body:
            self.choked.append(orjson.loads(body))
            error = {"error": {"message": "int() failed on a logit_bias key", "type": "internal_error"}}
            return web.json_response(error, status=500)
        return await self.complete(request)  # request.json() reads the cached body again


def _config(urls: list[str]) -> dict[str, Any]:
    return gateway_config(urls, health={"eject_after_failures": EJECT_AFTER, "eject_s": 60, "interval_s": 60})


async def test_thirty_requests_every_replica_chokes_on_eject_no_replica_and_others_are_served() -> None:
    fakes = [ChokingReplica() for _ in range(3)]
    async with replicas(*fakes) as urls, gateway(_config(urls), None) as client:
        pool = state(client).pool
        for count in (3, 30):
            for index in range(count):
                async with client.post("/v1/chat/completions", json=chat(f"{POISON} {count} {index}")) as reply:
                    status, error = reply.status, (await reply.json())["error"]
                assert status == 502 and error["code"] == "upstream_error", error
                assert "both answered 500" in error["message"] and "int() failed" in error["message"]
            assert {name: backend.breaker._failures for name, backend in pool.backends.items()} == dict.fromkeys(
                "abc", 0
            )
            assert all(backend.breaker.state is BreakerState.CLOSED for backend in pool.backends.values())
            for index in range(6):
                async with client.post("/v1/chat/completions", json=chat(f"innocent {index}")) as reply:
                    assert reply.status == 200, await reply.text()
    assert sum(len(fake.choked) for fake in fakes) == 2 * 33, "each poisoned request tried on two replicas, no more"


async def test_a_replica_that_fails_what_another_serves_is_still_ejected() -> None:
    """The breaker keeps its job: a replica that answers 500 to requests another replica serves is
    at fault, and ejected after ``eject_after_failures`` of them."""
    broken, healthy = FakeReplica(), FakeReplica()
    async with replicas(broken, healthy) as urls, gateway(_config(urls), None) as client:
        broken.behaviour = broken.behaviour.FAIL_500
        served_by = []
        for index in range(8):
            async with client.post("/v1/chat/completions", json=chat(f"question {index}")) as reply:
                assert reply.status == 200
                served_by.append(reply.headers["x-kvgate-backend"])
        breaker = state(client).pool.backends["a"].breaker
    assert served_by == ["b"] * 8
    assert breaker.state is BreakerState.OPEN and len(broken.bodies) == EJECT_AFTER


async def test_a_lone_replica_answering_500_is_not_ejected_and_the_client_hears_why() -> None:
    lone = ChokingReplica()
    async with replicas(lone) as urls, gateway(_config(urls), None) as client:
        for index in range(2 * EJECT_AFTER):
            async with client.post("/v1/chat/completions", json=chat(f"{POISON} {index}")) as reply:
                status, error = reply.status, (await reply.json())["error"]
            assert status == 502 and "Replica 'a' answered 500" in error["message"], error
        breaker = state(client).pool.backends["a"].breaker
        async with client.post("/v1/chat/completions", json=chat("innocent")) as reply:
            assert reply.status == 200
    assert breaker.state is BreakerState.CLOSED and len(lone.choked) == 2 * EJECT_AFTER


async def test_a_streamed_request_is_judged_the_same_way() -> None:
    fakes = [ChokingReplica() for _ in range(2)]
    async with replicas(*fakes) as urls, gateway(_config(urls), None) as client:
        for index in range(2 * EJECT_AFTER):
            body = chat(f"{POISON} {index}", stream=True)
            async with client.post("/v1/chat/completions", json=body) as reply:
                assert reply.status == 502
        pool = state(client).pool
        assert all(backend.breaker._failures == 0 for backend in pool.backends.values())
        async with client.post("/v1/chat/completions", json=chat("innocent", stream=True)) as reply:
            assert reply.status == 200 and b"[DONE]" in await reply.read()
