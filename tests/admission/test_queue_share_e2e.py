"""A tenant that fills the admission queue does not lock another tenant out of it (real processes)."""

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
    stream,
    wait_for_status,
)
from tests.procs import free_port

MAX_QUEUE = 4
FLOOD = {"Authorization": "Bearer flood-key"}
OTHER = {"Authorization": "Bearer other-key"}


async def test_another_tenant_gets_a_place_in_a_queue_one_tenant_filled(tmp_path: Path) -> None:
    with running(start_engines(tmp_path, 1, *SLOW_SIM)) as engines:
        config = gateway_config(
            free_port(),
            engines,
            limits={"max_queue": MAX_QUEUE, "queue_timeout_s": 60},
            tenants=[
                {"name": "flood", "api_keys": ["flood-key"]},
                {"name": "other", "api_keys": ["other-key"]},
            ],
        )
        config["backends"][0]["max_concurrency"] = 1
        with gateway_for(tmp_path, config) as gateway:
            url = f"{gateway.url}/v1/chat/completions"
            async with aiohttp.ClientSession() as session:
                holder = asyncio.create_task(stream(session, url, chat("hold the replica", 60, ignore_eos=True), FLOOD))
                await wait_for_status(session, gateway.url, lambda status: status["backends"][0]["in_flight"] == 1)
                flood = [
                    asyncio.create_task(post(session, url, chat(f"flood {index}", 2), FLOOD)) for index in range(8)
                ]
                await wait_for_status(session, gateway.url, lambda status: status["queued"] == {"flood": MAX_QUEUE})
                other_status, _, other_reply = await post(session, url, chat("my turn?", 2), OTHER)
                flood_replies = await asyncio.gather(*flood)
                holder_status, _ = await holder
    assert other_status == 200, other_reply
    codes = sorted(reply["error"]["code"] if status != 200 else "ok" for status, _, reply in flood_replies)
    assert codes == ["ok"] * 3 + ["queue_full"] * 4 + ["shed_for_fairness"], codes
    assert holder_status == 200
