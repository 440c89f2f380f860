"""Late binding end to end: two simulated engines and a gateway, real processes on loopback.

A long prompt keeps the owner of a prefix busy in prefill for several seconds. Follow-ups of that
prefix would spill to the idle replica; with ``routing.late_binding`` they wait at the gateway
instead, one leaves while held (nothing of it stays behind), and the other goes to the owner,
with its prefix cached, once the owner frees capacity.
"""

import asyncio
import re
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import pytest

from tests.gateway_cluster import MODEL, gateway_config, gateway_for, running
from tests.procs import ManagedProcess, free_port, start_engine

PREFIX = [1000 + i for i in range(800)]
"""50 blocks the owner caches on the first request (over a tenth of every prompt below: a useful match)."""
PREFILL_S_PER_TOKEN = 0.001
SIM = (
    "--sim", "--sim-preset", "instant", "--sim-prefill-per-token-s", str(PREFILL_S_PER_TOKEN),
    "--num-blocks", "1024", "--max-model-len", "8192",
)  # fmt: skip
BUSY_TOKENS = 6000
"""The owner's long prompt: about 6 s of prefill, during which the follow-ups arrive."""


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ManagedProcess]]:
    tmp_path = tmp_path_factory.mktemp("late-binding-engines")
    with ThreadPoolExecutor(2) as pool:
        processes = list(pool.map(lambda index: start_engine(tmp_path, *SIM, name=f"e{index}"), range(2)))
    with running(processes):
        yield processes


@pytest.fixture
def gateway(engines: list[ManagedProcess], tmp_path: Path) -> Iterator[ManagedProcess]:
    routing = {
        "policy": "cache_aware",
        "ttft_target_s": 0.5,
        "prefill_tokens_per_s": 1 / PREFILL_S_PER_TOKEN,
        "late_binding": {"enabled": True, "max_wait_s": 60},
    }
    config = gateway_config(free_port(), engines, every_backend={"kv_capacity_blocks": 1024}, routing=routing)
    with gateway_for(tmp_path, config) as process:
        yield process


async def complete(session: aiohttp.ClientSession, url: str, prompt: list[int]) -> tuple[str, str, int]:
    """(backend, route reason, cached tokens) of one completion."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
    async with session.post(f"{url}/v1/completions", json=body) as reply:
        assert reply.status == 200, await reply.text()
        payload = await reply.json()
        details = payload["usage"].get("prompt_tokens_details") or {}
        return (
            reply.headers["x-kvgate-backend"],
            reply.headers["x-kvgate-route-reason"],
            details.get("cached_tokens", 0),
        )


async def metric(session: aiohttp.ClientSession, url: str, name: str, labels: str = "") -> float:
    """A sample of the gateway's /metrics (0 when absent)."""
    async with session.get(f"{url}/metrics") as reply:
        text = await reply.text()
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not await check():
            await asyncio.sleep(0.02)


async def _equals(sample: Awaitable[float], expected: float) -> bool:
    return await sample == expected


async def test_follow_ups_wait_for_their_busy_owner_and_a_client_that_leaves_leaves_nothing(
    gateway: ManagedProcess,
) -> None:
    url = gateway.url
    async with aiohttp.ClientSession() as session:
        owner, _, _ = await complete(session, url, [*PREFIX, 1, 2, 3])
        held = f'{{backend="{owner}"}}'
        busy = asyncio.create_task(complete(session, url, [*PREFIX, *range(5000, 5000 + BUSY_TOKENS)]))
        await until(lambda: _equals(metric(session, url, "kvgate_backend_in_flight", held), 1))

        follow_up = asyncio.create_task(complete(session, url, [*PREFIX, *range(20, 40)]))
        await until(lambda: _equals(metric(session, url, "kvgate_late_binding_held", held), 1))
        async with aiohttp.ClientSession() as leaving_session:
            leaving = asyncio.create_task(complete(leaving_session, url, [*PREFIX, *range(40, 70)]))
            await until(lambda: _equals(metric(session, url, "kvgate_late_binding_held", held), 2))
            leaving.cancel()
            await asyncio.gather(leaving, return_exceptions=True)
        await until(
            lambda: _equals(metric(session, url, "kvgate_late_binding_left_total", '{outcome="client_gone"}'), 1)
        )
        assert await metric(session, url, "kvgate_late_binding_held", held) == 1

        assert not busy.done(), "the owner was still busy while both follow-ups were held"
        backend, reason, cached = await follow_up
        busy_backend, _, _ = await busy
        released = await metric(session, url, "kvgate_late_binding_left_total", '{outcome="released"}')
        waits = await metric(session, url, "kvgate_late_binding_wait_seconds_count")
        still_held = await metric(session, url, "kvgate_late_binding_held", held)
    assert busy_backend == owner
    assert (backend, reason) == (owner, "prefix-hit"), "held, then sent to the owner rather than spilled"
    assert cached >= len(PREFIX), "the owner's cached prefix was reused"
    assert (released, waits, still_held) == (1, 2, 0)
