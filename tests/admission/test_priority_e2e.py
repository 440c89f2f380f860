"""Priority classes through a real gateway: under overload the lowest class is shed with 429 first."""

import asyncio
from pathlib import Path

import aiohttp

from tests.gateway_cluster import (
    SLOW_SIM,
    chat,
    gateway_config,
    gateway_for,
    post,
    running,
    start_engines,
    wait_for_status,
)
from tests.procs import free_port

TENANTS = [
    {"name": "batch", "api_keys": ["batch-key"], "priority": 0},
    {"name": "app", "api_keys": ["app-key"], "priority": 1, "max_header_priority": 2},
]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_a_higher_class_sheds_the_lowest_from_a_full_queue(tmp_path: Path) -> None:
    limits = {"max_queue": 1, "queue_timeout_s": 60}
    with running(start_engines(tmp_path, 1, *SLOW_SIM)) as engines:
        config = gateway_config(free_port(), engines, limits=limits, tenants=TENANTS)
        config["backends"][0]["max_concurrency"] = 1
        with gateway_for(tmp_path, config) as gateway:
            url = f"{gateway.url}/v1/chat/completions"
            async with aiohttp.ClientSession() as session:
                busy = asyncio.create_task(post(session, url, chat("occupy", 500, ignore_eos=True), auth("batch-key")))
                await wait_for_status(session, gateway.url, lambda status: status["backends"][0]["in_flight"] == 1)
                waiting = asyncio.create_task(post(session, url, chat("batch job"), auth("batch-key")))
                await wait_for_status(session, gateway.url, lambda status: status["queued"] == {"batch": 1})
                urgent = asyncio.create_task(post(session, url, chat("urgent"), auth("app-key")))
                status, headers, body = await waiting
                assert status == 429 and headers["Retry-After"] and body["error"]["code"] == "shed_for_priority"
                busy.cancel()
                assert (await urgent)[0] == 200, "the client that went away freed the slot for the urgent request"
                refused = await post(session, url, chat("hi"), {**auth("batch-key"), "x-kvgate-priority": "1"})
                assert refused[0] == 400 and refused[2]["error"]["code"] == "priority_not_allowed"
