"""Workers' limits counted by their parent (issue 28, finding 8): a real LimitServer on a unix
socket in this process, and limiters that act as the workers of one host."""

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.admission.parent_limiter import ParentLimiter
from gateway.admission.parent_wire import frame
from gateway.admission.tenants import Tenant, TenantRegistry
from gateway.process.workers.limit_server import LimitServer
from gateway.process.workers.shared_counts import SharedCounts
from tests.admission.limiter_contract import (
    TENANTS,
    check_budgets_are_shared_and_unused_tokens_go_back,
    check_concurrency_cap_is_shared,
    refused,
)


class Host:
    """A parent's limit server and the limiters of its workers, each with its own tenants."""

    def __init__(self, path: Path) -> None:
        self.server = LimitServer(path)
        self.limiters: list[ParentLimiter] = []

    async def worker(self) -> dict[str, Tenant]:
        limiter = ParentLimiter(self.server.path, 2)
        await limiter.start()
        self.limiters.append(limiter)
        return TenantRegistry(TENANTS, limiter=limiter).by_name

    async def stop(self) -> None:
        for limiter in self.limiters:
            await limiter.stop()
        await self.server.stop()


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[Host]:
    running = Host(tmp_path / "limits.sock")
    await running.server.start()
    yield running
    await running.stop()


async def until(condition: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.01)


async def test_a_concurrency_cap_holds_across_workers(host: Host) -> None:
    a, b = await host.worker(), await host.worker()
    await check_concurrency_cap_is_shared(a, b, lambda: host.server.counts.in_flight == {"capped": 2})
    await until(lambda: host.server.counts.leases == 0)


async def test_token_and_request_budgets_are_shared_and_unused_tokens_go_back(host: Host) -> None:
    a, b = await host.worker(), await host.worker()
    await check_budgets_are_shared_and_unused_tokens_go_back(a, b)
    assert host.server.counts.in_flight == {}


async def test_a_dead_workers_slots_are_freed_at_once(host: Host) -> None:
    """A worker's connection closing (SIGKILL closes it too) frees its leases: no expiry to wait for."""
    a, b = await host.worker(), await host.worker()
    holding = a["capped"].hold_slot()
    await holding.__aenter__()
    await a["capped"].hold_slot().__aenter__()
    assert (await refused(b["capped"])).code == "concurrency_limit_exceeded"
    await host.limiters[0].stop()
    await until(lambda: host.server.counts.leases == 0)
    async with b["capped"].admit(1), b["capped"].admit(1):
        pass


async def test_without_the_parent_a_worker_counts_on_its_own_then_shares_again(host: Host) -> None:
    a, b = await host.worker(), await host.worker()
    for tenants in (a, b):
        async with tenants["capped"].admit(1):
            pass
    await host.server.stop()
    await until(lambda: not host.limiters[0].up and not host.limiters[1].up)
    async with a["capped"].admit(1), a["capped"].admit(1):
        assert (await refused(a["capped"])).code == "concurrency_limit_exceeded", "its own count still caps"
        async with b["capped"].admit(1):
            pass
    await host.server.start()
    await until(lambda: host.limiters[0].up and host.limiters[1].up)
    async with a["capped"].admit(1), b["capped"].admit(1):
        assert (await refused(a["capped"])).code == "concurrency_limit_exceeded"


async def test_a_parent_that_stops_answering_is_left_and_counted_without(host: Host, tmp_path: Path) -> None:
    """A socket that accepts but never answers: the call gives up after timeout_s, the worker counts
    on its own instead of waiting for ever."""
    silent_path = tmp_path / "silent.sock"
    silent = await asyncio.start_unix_server(lambda reader, writer: None, path=str(silent_path))
    limiter = ParentLimiter(silent_path, 2, timeout_s=0.2)
    await limiter.start()
    try:
        tenants = TenantRegistry(TENANTS, limiter=limiter).by_name
        assert limiter.up
        async with tenants["capped"].admit(1):
            assert not limiter.up
    finally:
        await limiter.stop()
        silent.close()


async def test_a_broken_message_closes_only_that_connection(host: Host) -> None:
    a = await host.worker()
    async with a["capped"].admit(1):
        reader, writer = await asyncio.open_unix_connection(str(host.server.path))
        writer.write(b"\x00\x00\x00\x02\xc1\xc1")
        assert await reader.read() == b""
        writer.close()
        writer2 = (await asyncio.open_unix_connection(str(host.server.path)))[1]
        writer2.write(frame([99, 1]))
        writer2.close()
        assert host.server.counts.in_flight == {"capped": 1}


def test_counts_free_a_lease_once() -> None:
    counts = SharedCounts()
    assert counts.take_slot(1, 7, "t", 1, 0) == (0, 0)
    assert counts.take_slot(2, 7, "t", 1, 0)[0] == 1
    counts.free_slot(1, 7)
    counts.free_slot(1, 7)
    assert counts.in_flight == {} and counts.take_slot(2, 7, "t", 1, 0) == (0, 0)
    assert counts.drop(2) == 1 and counts.drop(2) == 0 and counts.in_flight == {}
