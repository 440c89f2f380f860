"""The Redis limiter and its Lua scripts against a real redis-server: two limiters act as two gateways."""

import asyncio
import itertools
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as redis

from gateway.admission.config import SharedStateConfig, TenantConfig
from gateway.admission.local_limiter import LocalLimiter
from gateway.admission.redis_limiter import PROBE_FIRST_S, PROBE_MAX_S, RedisLimiter, TenantKeys, probe_delays, redacted
from gateway.admission.redis_scripts import FREE_SLOT, GIVE_BACK, RENEW, TAKE_SLOT, TAKE_TOKENS
from gateway.admission.tenants import Tenant, TenantRegistry
from gateway.config import ConfigError, parse_config
from gateway.errors import OpenAIError
from gateway.wiring.state import tenant_limiter
from tests.admission.limiter_contract import TENANTS as SHARED_TENANTS
from tests.admission.limiter_contract import (
    check_budgets_are_shared_and_unused_tokens_go_back,
    check_concurrency_cap_is_shared,
    refused,
)
from tests.procs import free_port
from tests.redis_server import RedisServer, redis_server

TENANTS = [
    *SHARED_TENANTS,
    TenantConfig(name="both", api_keys=["k5"], max_concurrency=1, tokens_per_minute=100),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis")) as running:
        yield running


class Gateways:
    """Limiters with one key prefix, each with its own tenants, as separate gateways have."""

    def __init__(self, url: str, **config: object) -> None:
        self.config = SharedStateConfig(redis_url=url, key_prefix=f"test-{uuid.uuid4().hex[:8]}", **config)
        self.limiters: list[RedisLimiter] = []

    async def start(self) -> dict[str, Tenant]:
        limiter = RedisLimiter(self.config)
        await limiter.start()
        self.limiters.append(limiter)
        return TenantRegistry(TENANTS, limiter=limiter).by_name

    async def stop(self) -> None:
        for limiter in self.limiters:
            await limiter.stop()


@pytest.fixture
async def gateways(server: RedisServer) -> AsyncIterator[Gateways]:
    # Redis is up throughout: no call slowed by a loaded machine may read as an outage.
    fleet = Gateways(server.url, lease_s=0.5, timeout_s=2.0)
    yield fleet
    await fleet.stop()


async def test_a_concurrency_cap_holds_across_gateways(gateways: Gateways) -> None:
    a, b = await gateways.start(), await gateways.start()
    await check_concurrency_cap_is_shared(a, b, lambda: gateways.limiters[0].leases == 1)
    assert gateways.limiters[0].leases == 0 and await gateways.limiters[1].in_flight("capped") == 0


async def test_token_and_request_budgets_are_global_and_unused_tokens_go_back(gateways: Gateways) -> None:
    a, b = await gateways.start(), await gateways.start()
    await check_budgets_are_shared_and_unused_tokens_go_back(a, b)


async def test_tokens_used_past_the_charge_are_taken_too(gateways: Gateways) -> None:
    a, b = await gateways.start(), await gateways.start()
    async with a["metered"].admit(10) as charge:
        charge.used = 250
    error = await refused(b["metered"], 10)
    assert error.code == "tokens_per_minute_exceeded" and int(error.headers["Retry-After"]) > 60, "150 in debt"


async def test_a_slot_is_taken_before_the_charge_and_freed_whatever_the_charge_does(gateways: Gateways) -> None:
    a, b = await gateways.start(), await gateways.start()
    async with a["both"].hold_slot():
        assert (await refused(b["both"])).code == "concurrency_limit_exceeded"
        async with a["both"].charge(80) as charge:
            charge.used = 80
        with pytest.raises(OpenAIError) as error:
            async with a["both"].charge(60):
                pass
        assert error.value.code == "tokens_per_minute_exceeded"
    async with b["both"].hold_slot():
        assert await gateways.limiters[1].in_flight("both") == 1


async def test_a_crashed_gateways_slots_expire_while_live_leases_are_renewed(gateways: Gateways) -> None:
    live, crashed, other = await gateways.start(), await gateways.start(), await gateways.start()
    async with live["capped"].admit(1):
        await crashed["capped"].limiter.take_slot(crashed["capped"])
        await gateways.limiters[1].stop()  # no renewal and no settle: as after SIGKILL
        assert (await refused(other["capped"])).code == "concurrency_limit_exceeded"
        deadline = time.monotonic() + 10
        while True:
            try:
                async with other["capped"].admit(1):
                    break
            except OpenAIError:
                assert time.monotonic() < deadline, "the crashed gateway's lease never expired"
                await asyncio.sleep(0.05)
        await asyncio.sleep(3 * gateways.config.lease_s)
        assert await gateways.limiters[2].in_flight("capped") == 1, "the live lease was renewed"


async def test_scripts_take_atomically_and_never_renew_a_freed_lease(server: RedisServer) -> None:
    client = redis.Redis.from_url(server.url)
    keys = TenantKeys.of(f"test-{uuid.uuid4().hex[:8]}", "t")
    take_slot, free_slot, take_tokens, give_back, renew = (
        client.register_script(source) for source in (TAKE_SLOT, FREE_SLOT, TAKE_TOKENS, GIVE_BACK, RENEW)
    )
    slot_keys = [keys.leases, keys.requests]
    try:
        assert await take_slot(keys=slot_keys, args=["x", 5000, 1, 2]) == [0, 0]
        assert await take_slot(keys=slot_keys, args=["y", 5000, 1, 2]) == [1, 1], "one slot, taken"
        assert await client.zcard(keys.leases) == 1 and await client.exists(keys.requests) == 1
        assert await take_slot(keys=slot_keys, args=["y", 5000, 0, 2]) == [0, 0]
        verdict, wait_ms = await take_slot(keys=slot_keys, args=["z", 5000, 0, 2])
        assert verdict == 3 and 29_000 <= wait_ms <= 30_000, "two requests per minute: the next in 30 s"
        assert await client.zcard(keys.leases) == 2, "a refused request took no slot"
        assert await free_slot(keys=[keys.leases], args=["x"]) == 1
        assert await free_slot(keys=[keys.leases], args=["x"]) == 0, "freed once only"
        assert await renew(keys=[keys.leases], args=[5000, "x"]) == 0 and await client.zcard(keys.leases) == 1

        assert await take_tokens(keys=[keys.tokens], args=[90, 100]) == [0, 0]
        assert 0 < await client.pttl(keys.tokens) <= 61_000, "a bucket key expires once it would be full again"
        verdict, wait_ms = await take_tokens(keys=[keys.tokens], args=[50, 100])
        assert verdict == 2 and 23_000 <= wait_ms <= 25_000, "40 tokens missing at 100 per minute"
        await give_back(keys=[keys.tokens], args=[500, 100])
        assert await take_tokens(keys=[keys.tokens], args=[100, 100]) == [0, 0], "unused tokens came back, capped"
        assert (await take_tokens(keys=[keys.tokens], args=[1, 100]))[0] == 2, "never more than a minute's worth"
    finally:
        await client.aclose()


async def test_unreachable_redis_at_start_neither_hangs_nor_fails() -> None:
    config = SharedStateConfig(redis_url=f"redis://127.0.0.1:{free_port()}/0", on_unavailable="reject")
    limiter = RedisLimiter(config)
    async with asyncio.timeout(5):
        await limiter.start()
        tenants = TenantRegistry(TENANTS, limiter=limiter).by_name
        error = await refused(tenants["capped"])
        async with tenants["open"].admit(1):
            pass
    await limiter.stop()
    assert not limiter.up and error.status == 503 and error.code == "shared_state_unavailable"
    assert limiter.unavailable_admissions == {"local": 0, "reject": 1}


async def test_redis_going_away_falls_back_to_local_counts_and_recovers(tmp_path: Path) -> None:
    server = RedisServer(tmp_path).start()
    fleet = Gateways(server.url, lease_s=1.0, on_unavailable="local")
    try:
        tenants = await fleet.start()
        limiter = fleet.limiters[0]
        async with tenants["capped"].admit(1):
            server.stop()
            async with asyncio.timeout(5):
                async with tenants["capped"].admit(1):
                    assert not limiter.up, "Redis is seen gone"
                    error = await refused(tenants["capped"])
        assert error.code == "concurrency_limit_exceeded", "the local fallback still counts this gateway's requests"
        assert limiter.unavailable_admissions["local"] == 2
        server.start()
        deadline = time.monotonic() + 10
        while not limiter.up:
            assert time.monotonic() < deadline, "the limiter never saw Redis come back"
            await asyncio.sleep(0.05)
        async with tenants["capped"].admit(1):
            assert limiter.leases == 1 and await limiter.in_flight("capped") == 1
    finally:
        await fleet.stop()
        server.stop()


async def test_a_burst_larger_than_the_connection_pool_waits_for_connections(server: RedisServer) -> None:
    """redis-py's default pool raised "Too many connections" past 100 calls at once, taken for Redis down.
    (A generous timeout_s: the burst is about connections, not about a loaded machine's latency.)"""
    gateways = Gateways(server.url, timeout_s=5.0)
    await gateways.start()
    limiter = gateways.limiters[0]
    crowd = TenantRegistry([TenantConfig(name="crowd", api_keys=["kc"], max_concurrency=1000)], limiter=limiter)
    release = asyncio.Event()
    admitted = 0

    async def request() -> None:
        nonlocal admitted
        async with crowd.by_name["crowd"].admit(1):
            admitted += 1
            await release.wait()

    holders = [asyncio.create_task(request()) for _ in range(300)]
    async with asyncio.timeout(30):
        while admitted < 300 and not any(task.done() for task in holders):
            await asyncio.sleep(0.01)
    release.set()
    await asyncio.gather(*holders)
    await gateways.stop()
    assert limiter.up and limiter.errors == 0, limiter.last_error
    assert admitted == 300 and limiter.unavailable_admissions == {"local": 0, "reject": 0}


def test_a_gone_redis_is_probed_soon_then_once_a_second() -> None:
    delays = list(itertools.islice(probe_delays(), 10))
    assert delays[0] == PROBE_FIRST_S and delays == sorted(delays) and delays[-1] == PROBE_MAX_S == 1.0


async def test_recovery_frees_the_outage_leases_in_batches(tmp_path: Path) -> None:
    """Leases of requests that ended during an outage are freed once Redis is back, a round trip per
    batch rather than per lease (600 calls, each a task, before: the limiter was back only after).
    (A generous timeout_s: 600 admissions are about batching, not about a loaded machine's latency;
    a call past the default 0.25 s beside another test worker took the limiter local mid-crowd.)"""
    server = RedisServer(tmp_path).start()
    fleet = Gateways(server.url, lease_s=2.0, timeout_s=5.0)
    try:
        await fleet.start()
        limiter = fleet.limiters[0]
        crowd = TenantRegistry([TenantConfig(name="crowd", api_keys=["kc"], max_concurrency=1000)], limiter=limiter)
        tenant = crowd.by_name["crowd"]
        release = asyncio.Event()
        admitted = 0

        async def request() -> None:
            nonlocal admitted
            async with tenant.admit(1):
                admitted += 1
                await release.wait()

        holders = []
        for _ in range(12):
            holders += [asyncio.create_task(request()) for _ in range(50)]
            async with asyncio.timeout(30):
                while admitted < len(holders):
                    await asyncio.sleep(0.01)
        assert limiter.leases == 600
        server.stop()
        release.set()
        await asyncio.gather(*holders)
        async with tenant.admit(1):
            assert not limiter.up, "the admission saw Redis gone"
        async with asyncio.timeout(30):
            while limiter.store.calls_running:
                await asyncio.sleep(0.01)  # calls of the outage that outlived their callers: none reach the new Redis
        server.start()
        back = time.monotonic()
        async with asyncio.timeout(20):
            while not limiter.up:
                await asyncio.sleep(0.01)
        print(f"shared limits global again {time.monotonic() - back:.3f} s after Redis answered")
        assert limiter.unsettled == 0, "every lease of the outage was freed"
        client = redis.Redis.from_url(server.url)
        try:
            stats = await client.info("commandstats")
        finally:
            await client.aclose()
        script_calls = stats.get("cmdstat_evalsha", {}).get("calls", 0) + stats.get("cmdstat_eval", {}).get("calls", 0)
        assert script_calls < 60, stats  # about 4 (3 batches and a script load); 600 and more when freed one by one
    finally:
        await fleet.stop()
        server.stop()


def test_shared_state_config_is_checked_and_optional(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_config({}, "default").shared_state is None, "no Redis unless configured"
    assert isinstance(tenant_limiter(parse_config({}, "default")), LocalLimiter)
    monkeypatch.setenv("KVGATE_TEST_REDIS", "redis://:secret@10.0.0.5:6379/2")
    config = parse_config({"shared_state": {"redis_url": "${ENV:KVGATE_TEST_REDIS}"}}, "env")
    assert config.shared_state is not None and config.shared_state.on_unavailable == "local"
    assert redacted(config.shared_state.redis_url) == "redis://10.0.0.5:6379/2"
    with pytest.raises(ConfigError, match=r"shared_state.redis_url: .*redis://"):
        parse_config({"shared_state": {"redis_url": "http://10.0.0.5:6379"}}, "bad")
    with pytest.raises(ConfigError, match=r"shared_state.on_unavailable"):
        parse_config({"shared_state": {"redis_url": "redis://h:1/0", "on_unavailable": "ignore"}}, "bad")


async def test_a_frozen_redis_never_holds_a_request(tmp_path: Path) -> None:
    server = RedisServer(tmp_path).start()
    fleet = Gateways(server.url, lease_s=1.0, timeout_s=0.1, on_unavailable="reject")
    assert server.proc is not None
    try:
        tenants = await fleet.start()
        limiter = fleet.limiters[0]
        async with tenants["capped"].admit(1):
            os.kill(server.proc.pid, signal.SIGSTOP)  # accepts connections, answers nothing
            try:
                async with asyncio.timeout(5):
                    error = await refused(tenants["capped"])
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
        assert error.code == "shared_state_unavailable" and not limiter.up
        assert "TimeoutError" in limiter.last_error
        deadline = time.monotonic() + 10
        while not limiter.up:
            assert time.monotonic() < deadline, "the limiter never saw Redis thaw"
            await asyncio.sleep(0.05)
        async with tenants["capped"].admit(1):
            assert limiter.leases == 1
    finally:
        await fleet.stop()
        server.stop()
