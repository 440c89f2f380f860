"""200 clients that hang up mid-stream leave the gateway and the engine as idle as before."""

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from tests.gateway_cluster import (
    SLOW_SIM,
    chat,
    gateway_config,
    gateway_for,
    get_json,
    running,
    start_engines,
    stream,
    wait_for_status,
)
from tests.procs import free_port

CLIENTS = 200
STREAM_TOKENS = 200
LONG_SIM = (
    "--sim", "--sim-preset", "instant", "--sim-decode-base-s", "0.1",
    "--max-num-seqs", "256", "--num-blocks", "4000",
)  # fmt: skip
"""All 200 streams run in one batch of 0.1 s decode steps: an engine that kept decoding after the
hang-ups would stay busy for at least STREAM_TOKENS x 0.1 s = 20 s however busy the machine (the
simulator's steps never take less), twice CANCEL_BOUND_S."""
CANCEL_BOUND_S = STREAM_TOKENS * 0.1 / 2
"""Real cancellation leaves everything idle within about 0.1 s of the last hang-up."""


async def hang_up_after_first_events(session: aiohttp.ClientSession, url: str, index: int) -> int:
    """Start a long stream, read a few events, then drop the connection; returns events read."""
    body = {**chat(f"client {index} asks a long question", STREAM_TOKENS, ignore_eos=True), "stream": True}
    reply = await session.post(url, json=body)
    events = 0
    async for line in reply.content:
        if line.startswith(b"data: "):
            events += 1
            if events == 3:
                break
    reply.close()
    return events


async def wait_until_idle(
    session: aiohttp.ClientSession, gateway_url: str, engine_url: str, deadline_s: float
) -> tuple:
    deadline = time.monotonic() + deadline_s
    while True:
        status = await get_json(session, f"{gateway_url}/admin/backends")
        stats = await get_json(session, f"{engine_url}/stats")
        in_flight = sum(backend["in_flight"] + backend["kv_reserved_blocks"] for backend in status["backends"])
        idle = not in_flight and not status["queued"] and not stats["running"] and not stats["waiting"]
        if idle and stats["free_blocks"] == stats["num_blocks"] or time.monotonic() > deadline:
            return status, stats
        await asyncio.sleep(0.1)


@pytest.mark.slow
async def test_disconnecting_clients_free_everything(tmp_path: Path) -> None:
    with (
        running(start_engines(tmp_path, 1, *LONG_SIM)) as engines,
        gateway_for(tmp_path, gateway_config(free_port(), engines)) as gateway,
    ):
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
            url = f"{gateway.url}/v1/chat/completions"
            read = await asyncio.gather(*(hang_up_after_first_events(session, url, i) for i in range(CLIENTS)))
            assert all(events == 3 for events in read)
            status, stats = await wait_until_idle(session, gateway.url, engines[0].url, deadline_s=CANCEL_BOUND_S)
        assert [backend["in_flight"] for backend in status["backends"]] == [0]
        assert [backend["kv_reserved_blocks"] for backend in status["backends"]] == [0]
        assert status["tenants_in_flight"] == {"anonymous": 0} and status["queued"] == {}
        assert stats["running"] == 0 and stats["waiting"] == 0
        assert stats["free_blocks"] == stats["num_blocks"]


async def test_queued_clients_that_hang_up_leave_the_queue_at_once(tmp_path: Path) -> None:
    with running(start_engines(tmp_path, 1, *SLOW_SIM)) as engines:
        config = gateway_config(free_port(), engines)
        config["backends"][0]["max_concurrency"] = 2
        with gateway_for(tmp_path, config) as gateway:
            url = f"{gateway.url}/v1/chat/completions"
            async with aiohttp.ClientSession() as session:
                holders = [
                    asyncio.create_task(stream(session, url, chat(f"hold {i}", 200, ignore_eos=True))) for i in range(2)
                ]
                await wait_for_status(session, gateway.url, lambda status: status["backends"][0]["in_flight"] == 2)
                # the holders decode for 4 s, so they still hold both slots when the queued clients give up
                patience = aiohttp.ClientTimeout(total=1.5)
                queued = [
                    asyncio.create_task(session.post(url, json=chat(f"queued {i}"), timeout=patience))
                    for i in range(20)
                ]
                await wait_for_status(session, gateway.url, lambda status: status["queued"] == {"anonymous": 20})
                gone = await asyncio.gather(*queued, return_exceptions=True)
                assert all(isinstance(outcome, asyncio.TimeoutError) for outcome in gone)
                status = await wait_for_status(session, gateway.url, lambda status: status["queued"] == {})
                assert status["backends"][0]["in_flight"] == 2
                assert [result[0] for result in await asyncio.gather(*holders)] == [200, 200]
