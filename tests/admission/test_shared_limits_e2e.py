"""Tenant limits shared by three real gateway processes through a real Redis, with simulated engines.

Gateways g0 and g1 fall back to local counts when Redis is away, g2 refuses capped tenants (503).
"""

import asyncio
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.gateway_cluster import (
    SLOW_SIM,
    chat,
    gateway_config,
    get_json,
    post,
    precise_backends,
    running,
    start_publishing_engines,
    write_config,
)
from tests.procs import ManagedProcess, free_port, start_gateway
from tests.redis_server import RedisServer

LEASE_S = 3.0
TENANTS = [
    {"name": "capped", "api_keys": ["key-capped"], "max_concurrency": 4},
    {"name": "metered", "api_keys": ["key-metered"], "tokens_per_minute": 300},
    {"name": "paced", "api_keys": ["key-paced"], "requests_per_minute": 5},
    {"name": "free", "api_keys": ["key-free"]},
]
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=60)
"""Every call in these tests is bounded: a hang fails the test instead of stalling the suite."""


class Fleet:
    def __init__(self, redis: RedisServer, gateways: list[ManagedProcess]) -> None:
        self.redis = redis
        self.gateways = gateways


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp_path = tmp_path_factory.mktemp("shared-limits")
    redis = RedisServer(tmp_path).start()
    try:
        engines, kv_events = start_publishing_engines(tmp_path, 2, *SLOW_SIM)
        with (
            running(engines),
            running(start_gateways(tmp_path, precise_backends(engines, kv_events), redis.url)) as gateways,
        ):
            yield Fleet(redis, gateways)
    finally:
        redis.stop()


def start_gateways(tmp_path: Path, backends: list[dict[str, str]], redis_url: str) -> list[ManagedProcess]:
    def start(index: int) -> ManagedProcess:
        on_unavailable = "reject" if index == 2 else "local"
        shared_state = {"redis_url": redis_url, "lease_s": LEASE_S, "on_unavailable": on_unavailable}
        config = gateway_config(free_port(), [], backends=backends, tenants=TENANTS, shared_state=shared_state)
        folder = tmp_path / f"g{index}"
        folder.mkdir()
        return start_gateway(folder, write_config(folder / "gateway.yaml", config), config["listen"]["port"])

    with ThreadPoolExecutor(3) as pool:
        return list(pool.map(start, range(3)))


async def call(gateway: ManagedProcess, tenant: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
        status, _, reply = await post(
            session, f"{gateway.url}/v1/chat/completions", body, {"Authorization": f"Bearer key-{tenant}"}
        )
        return status, reply


def code(reply: Any) -> str | None:
    return reply["error"]["code"] if isinstance(reply, dict) and "error" in reply else None


async def shared_in_flight(gateway: ManagedProcess, tenant: str) -> int | None:
    async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
        status = await get_json(session, f"{gateway.url}/admin/backends")
        return status["shared_state"]["tenants_in_flight"].get(tenant)


async def shared_state_up(gateway: ManagedProcess) -> float:
    async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session, session.get(f"{gateway.url}/metrics") as reply:
        text = await reply.text()
    match = re.search(r"^kvgate_shared_state_up (\S+)$", text, re.MULTILINE)
    assert match, "the gateway exports kvgate_shared_state_up"
    return float(match[1])


async def eventually(check: Any, what: str, timeout_s: float = 20.0) -> None:
    """Poll the async ``check`` until it is true; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        await asyncio.sleep(0.1)


async def test_a_tenant_cap_of_4_admits_4_of_18_requests_spread_over_3_gateways(fleet: Fleet) -> None:
    long_chat = chat("hold a slot", 200, ignore_eos=True)
    replies = await asyncio.gather(*(call(fleet.gateways[index % 3], "capped", long_chat) for index in range(18)))
    admitted = [status for status, _ in replies if status == 200]
    refused = {code(reply) for status, reply in replies if status != 200}
    assert len(admitted) == 4, [status for status, _ in replies]
    assert refused == {"concurrency_limit_exceeded"}


async def test_requests_and_tokens_per_minute_are_global(fleet: Fleet) -> None:
    paced = [await call(fleet.gateways[index % 3], "paced", chat(f"paced {index}", 1)) for index in range(6)]
    assert [status for status, _ in paced] == [200] * 5 + [429], "five per minute over all gateways"
    assert code(paced[-1][1]) == "requests_per_minute_exceeded"
    metered = [
        await call(fleet.gateways[index % 3], "metered", chat(f"metered {index}", 40, ignore_eos=True))
        for index in range(6)
    ]
    statuses = [status for status, _ in metered]
    assert statuses[0] == 200 and 429 in statuses, statuses
    assert {code(reply) for status, reply in metered if status == 429} == {"tokens_per_minute_exceeded"}


async def test_stopping_redis_mid_run_gives_no_500_and_no_hang(fleet: Fleet) -> None:
    g0, _, g2 = fleet.gateways
    holders = [asyncio.create_task(call(g0, "capped", chat("in flight", 100, ignore_eos=True))) for _ in range(2)]
    await eventually(lambda: _equals(shared_in_flight(g0, "capped"), 2), "both requests hold a lease")
    fleet.redis.stop()
    during = await asyncio.gather(
        call(g0, "capped", chat("local fallback")),
        call(g2, "capped", chat("reject")),
        call(g2, "free", chat("uncapped")),
        call(g0, "metered", chat("local budget")),
    )
    assert [status for status, _ in during] == [200, 503, 200, 200], during
    assert code(during[1][1]) == "shared_state_unavailable"
    assert await shared_state_up(g0) == 0.0 and await shared_state_up(g2) == 0.0
    assert [status for status, _ in await asyncio.gather(*holders)] == [200, 200]
    fleet.redis.start()
    await eventually(lambda: _equals(call_status(g2, "capped"), 200), "the reject gateway admits once Redis is back")
    await eventually(lambda: _equals(shared_state_up(g0), 1.0), "the local gateway sees Redis back")
    assert "shared state at redis://127.0.0.1" in g2.log() and "answers again" in g2.log()


async def test_after_kill_9_of_a_gateway_the_others_serve_and_its_leases_expire(fleet: Fleet) -> None:
    g0, g1, g2 = fleet.gateways
    for gateway in fleet.gateways:
        await eventually(lambda gateway=gateway: _equals(shared_state_up(gateway), 1.0), "every gateway uses Redis")
    await eventually(lambda: _equals(shared_in_flight(g0, "capped"), 0), "no lease left from the earlier tests")
    holders = [asyncio.create_task(call(g1, "capped", chat("doomed", 500, ignore_eos=True))) for _ in range(4)]
    await eventually(lambda: _equals(shared_in_flight(g0, "capped"), 4), "g1 holds all four slots")
    g1.kill()
    assert (await call(g0, "capped", chat("too early")))[0] == 429, "the dead gateway's leases still count"
    serving = await asyncio.gather(*(call(gateway, "free", chat("still serving")) for gateway in (g0, g2, g0, g2)))
    assert [status for status, _ in serving] == [200] * 4
    await eventually(
        lambda: _equals(call_status(g2, "capped"), 200), "the killed gateway's leases expire", timeout_s=20 * LEASE_S
    )
    # A lease taken after the dead gateway's last renewal expires up to a renewal period after the
    # others: the first free slot lets the probe in before the last lease is gone.
    await eventually(lambda: _equals(shared_in_flight(g0, "capped"), 0), "every lease of the killed gateway expires")
    for outcome in await asyncio.gather(*holders, return_exceptions=True):
        assert isinstance(outcome, aiohttp.ClientError | asyncio.TimeoutError), outcome


async def call_status(gateway: ManagedProcess, tenant: str) -> int:
    return (await call(gateway, tenant, chat("probe", 1)))[0]


async def _equals(value: Any, expected: object) -> bool:
    return await value == expected
