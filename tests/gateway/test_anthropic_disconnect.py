"""Clients that hang up mid-way through an Anthropic stream leave the gateway and the engine idle."""

import asyncio
from pathlib import Path

import aiohttp
import pytest

from tests.faults.test_client_disconnect import LONG_SIM, wait_until_idle
from tests.gateway_cluster import MODEL, gateway_config, gateway_for, running, start_engines
from tests.procs import free_port

CLIENTS = 40
STREAM_TOKENS = 200
CANCEL_BOUND_S = 5.0
"""200 tokens of 0.1 s decode steps keep an engine that ignored the hang-ups busy for 20 s."""


async def hang_up_after_first_deltas(session: aiohttp.ClientSession, url: str, index: int) -> list[str]:
    """Start a long Messages stream, read up to its third text delta, then drop the connection."""
    body = {
        "model": MODEL,
        "max_tokens": STREAM_TOKENS,
        "stream": True,
        "messages": [{"role": "user", "content": f"client {index} asks a long question"}],
    }
    reply = await session.post(url, json=body)
    names: list[str] = []
    async for line in reply.content:
        if line.startswith(b"event: "):
            names.append(line.removeprefix(b"event: ").strip().decode())
            if names.count("content_block_delta") == 3:
                break
    reply.close()
    return names


@pytest.mark.slow
async def test_clients_that_leave_an_anthropic_stream_free_everything(tmp_path: Path) -> None:
    with (
        running(start_engines(tmp_path, 1, *LONG_SIM)) as engines,
        gateway_for(tmp_path, gateway_config(free_port(), engines)) as gateway,
    ):
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
            url = f"{gateway.url}/v1/messages"
            read = await asyncio.gather(*(hang_up_after_first_deltas(session, url, i) for i in range(CLIENTS)))
            opening = ["message_start", "ping", "content_block_start", *["content_block_delta"] * 3]
            assert all(names == opening for names in read), read[0]
            status, stats = await wait_until_idle(session, gateway.url, engines[0].url, deadline_s=CANCEL_BOUND_S)
        assert [backend["in_flight"] for backend in status["backends"]] == [0]
        assert [backend["kv_reserved_blocks"] for backend in status["backends"]] == [0]
        assert status["tenants_in_flight"] == {"anonymous": 0} and status["queued"] == {}
        assert stats["running"] == 0 and stats["waiting"] == 0
        assert stats["free_blocks"] == stats["num_blocks"]
