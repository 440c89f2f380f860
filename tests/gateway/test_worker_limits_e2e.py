"""`kvgate gateway --workers 2` without `shared_state`: every tenant limit holds for the two workers
together, counted by their parent, and a killed worker's slots come back at once (issue 28,
finding 8). Real processes on loopback; each request on a new connection, so the kernel spreads
them over both workers (the answering worker is in ``x-kvgate-worker``)."""

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.gateway.test_workers import _children, _start_workers, _wait_workers
from tests.gateway_cluster import SLOW_SIM, chat, gateway_config, running, start_engines
from tests.procs import ManagedProcess, free_port

TENANTS = [
    {"name": "conc", "api_keys": ["sk-conc"], "max_concurrency": 2},
    {"name": "rpm", "api_keys": ["sk-rpm"], "requests_per_minute": 5},
    {"name": "tpm", "api_keys": ["sk-tpm"], "tokens_per_minute": 1000},
    {"name": "open", "api_keys": ["sk-open"]},
]
LONG = "Tell me everything about the sea, the ships that sail it and the fish that live in it. " * 6
"""About 130 prompt tokens: a request of ``LONG`` with max_tokens 1 is charged ~140 tokens."""
STREAM_TOKENS = 1500
"""A stream of 30 s at the simulated 50 tokens a second."""
FREED_WITHIN_S = 15.0
"""Well before the surviving stream ends, so a leaked slot (2 held with one stream) fails the test."""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    tmp_path: Path = tmp_path_factory.mktemp("worker-limits")
    with running(start_engines(tmp_path, 1, *SLOW_SIM)) as engines:
        config = gateway_config(free_port(), engines, tenants=TENANTS, observability={"request_log": False})
        with running([_start_workers(tmp_path, config, "--workers", "2")]) as (gateway,):
            asyncio.run(_wait_workers(gateway.url))
            asyncio.run(_wait_serving(gateway.url))
            yield gateway


async def _wait_serving(url: str, timeout_s: float = 60.0) -> None:
    """Until both workers serve (each has seen the engine healthy)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        replies = [await send(url, "sk-open", chat(f"warm{index}", 1)) for index in range(10)]
        if {status for status, _, _ in replies} == {200} and {worker for _, worker, _ in replies} == {"0", "1"}:
            return
        await asyncio.sleep(0.2)
    raise TimeoutError("the workers did not both serve")


async def send(url: str, key: str, body: dict[str, Any]) -> tuple[int, str, dict[str, Any]]:
    """One chat on a new connection: (status, answering worker, body)."""
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        headers = {"Authorization": f"Bearer {key}"}
        async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as reply:
            return reply.status, reply.headers["x-kvgate-worker"], await reply.json(content_type=None)


async def test_a_concurrency_cap_of_two_admits_two_over_both_workers(gateway: ManagedProcess) -> None:
    replies = await asyncio.gather(*(send(gateway.url, "sk-conc", chat(f"c{index}", 150)) for index in range(12)))
    statuses = Counter(status for status, _, _ in replies)
    assert statuses == {200: 2, 429: 10}, statuses
    assert {body["error"]["code"] for status, _, body in replies if status == 429} == {"concurrency_limit_exceeded"}
    assert {worker for _, worker, _ in replies} == {"0", "1"}


async def test_requests_per_minute_hold_over_both_workers(gateway: ManagedProcess) -> None:
    started = time.monotonic()
    replies = [await send(gateway.url, "sk-rpm", chat(f"r{index}", 1)) for index in range(16)]
    refilled = int((time.monotonic() - started) * 5 / 60)
    admitted = sum(status == 200 for status, _, _ in replies)
    assert 5 <= admitted <= 5 + refilled, (admitted, refilled)
    assert {body["error"]["code"] for status, _, body in replies if status != 200} == {"requests_per_minute_exceeded"}
    assert {worker for _, worker, _ in replies} == {"0", "1"}


async def test_tokens_per_minute_hold_over_both_workers(gateway: ManagedProcess) -> None:
    started = time.monotonic()
    replies = [await send(gateway.url, "sk-tpm", chat(f"{index} {LONG}", 1)) for index in range(16)]
    refilled = (time.monotonic() - started) * 1000 / 60
    used = [body["usage"]["total_tokens"] for status, _, body in replies if status == 200]
    assert used and sum(used) <= 1000 + refilled, (used, refilled)
    assert {body["error"]["code"] for status, _, body in replies if status != 200} == {"tokens_per_minute_exceeded"}
    assert {worker for _, worker, _ in replies} == {"0", "1"}


async def status_of(url: str, key: str, body: dict[str, Any]) -> int:
    """The status of one chat; 0 for a connection the kernel had queued at a worker just killed."""
    try:
        return (await send(url, key, body))[0]
    except aiohttp.ClientError:
        return 0


def worker_pid(parent: int, index: int) -> int:
    for child in _children(parent):
        environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        if f"KVGATE_WORKER={index}/2".encode() in environ:
            return child
    raise LookupError(f"no worker {index}")


async def test_a_killed_workers_slots_come_back_at_once(gateway: ManagedProcess) -> None:
    """Both of the tenant's slots held by long streams; SIGKILL the worker of one: a new request is
    admitted long before the other stream ends (a leaked slot would refuse it until then)."""
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        headers = {"Authorization": "Bearer sk-conc"}
        body = {**chat("a long story", STREAM_TOKENS), "stream": True}
        streams = [await session.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers)]
        streams.append(await session.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers))
        try:
            assert [stream.status for stream in streams] == [200, 200]
            started = time.monotonic()
            assert (await send(gateway.url, "sk-conc", chat("third", 1)))[0] == 429
            os.kill(worker_pid(gateway.proc.pid, int(streams[0].headers["x-kvgate-worker"])), signal.SIGKILL)
            while await status_of(gateway.url, "sk-conc", chat("after", 1)) != 200:
                assert time.monotonic() - started < FREED_WITHIN_S, "the dead worker's slot was not freed"
                await asyncio.sleep(0.2)
        finally:
            for stream in streams:
                stream.close()
