"""KV admission: a replica gets no more requests than its KV blocks hold; the rest wait their turn."""

import asyncio
from pathlib import Path

import aiohttp

from tests.gateway_cluster import (
    SLOW_SIM,
    chat,
    gateway_config,
    gateway_for,
    running,
    start_engines,
    stream,
    wait_for_status,
)
from tests.procs import free_port

NUM_BLOCKS = 64
MAX_TOKENS = 100


def all_eight_admitted_or_queued(status: dict) -> bool:
    return status["backends"][0]["in_flight"] + status["queued"].get("anonymous", 0) == 8


async def test_requests_beyond_the_kv_budget_queue_then_complete(tmp_path: Path) -> None:
    flags = (*SLOW_SIM, "--num-blocks", str(NUM_BLOCKS), "--max-model-len", "512")
    with (
        running(start_engines(tmp_path, 1, *flags)) as engines,
        gateway_for(tmp_path, gateway_config(free_port(), engines)) as gateway,
    ):
        url = f"{gateway.url}/v1/chat/completions"
        async with aiohttp.ClientSession() as session:
            requests = [stream(session, url, chat(f"request {i}", MAX_TOKENS, ignore_eos=True)) for i in range(8)]
            running_requests = [asyncio.create_task(request) for request in requests]
            status = await wait_for_status(session, gateway.url, all_eight_admitted_or_queued)
            results = await asyncio.gather(*running_requests)
        backend = status["backends"][0]
        assert backend["kv_capacity_blocks"] == NUM_BLOCKS
        assert 0 < backend["kv_reserved_blocks"] <= NUM_BLOCKS and backend["in_flight"] < 8
        assert status["queued"] == {"anonymous": 8 - backend["in_flight"]}
        assert all(code == 200 and events[-1] == b"[DONE]" for code, events in results)
