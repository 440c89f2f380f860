"""The router keeps nothing per request: however a request ends (answered, its client gone while
it was queued or mid-stream), no route ticket outlives it (the real app in process, a fake replica)."""

import asyncio
import gc
from collections.abc import Callable

from gateway.routing.router import RouteTicket
from tests.gateway.fake_replica import HOLD, FakeReplica, chat, gateway, gateway_config, replicas, state

CHAT = "/v1/chat/completions"


def live_tickets() -> int:
    gc.collect()
    return sum(type(thing) is RouteTicket for thing in gc.get_objects())


async def wait_for(condition: Callable[[], bool], deadline_s: float = 30.0) -> bool:
    """Poll ``condition`` until it holds; False if it still does not after ``deadline_s``."""
    loop = asyncio.get_running_loop()
    until = loop.time() + deadline_s
    while not condition():
        if loop.time() > until:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_no_route_ticket_outlives_its_request() -> None:
    fake = FakeReplica()
    async with replicas(fake) as urls:
        config = gateway_config(urls)
        config["backends"][0]["max_concurrency"] = 1
        async with gateway(config, None) as client:
            for index in range(50):
                async with client.post(CHAT, json=chat(f"question {index}")) as reply:
                    assert reply.status == 200
            assert live_tickets() == 0, "answered requests leave none"
            held = await client.post(CHAT, json=chat(f"{HOLD} a held stream", stream=True))
            await held.content.readline()
            assert live_tickets() == 1, "the stream in flight holds its own"
            queue = state(client).dispatcher.queue
            queued = asyncio.create_task(client.post(CHAT, json=chat("a queued question")))
            assert await wait_for(lambda: len(queue) == 1)
            queued.cancel()
            held.close()
            backend = state(client).pool.backends["a"]
            assert await wait_for(lambda: len(queue) == 0 and backend.in_flight == 0)
            assert live_tickets() == 0, "clients gone in the queue and mid-stream leave none"
            fake.release.set()
