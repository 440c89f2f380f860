"""`kvgate gateway --workers 2`: one port, requests spread over both workers, one set of metrics,
reloads that reach every worker, and a dead worker restarted. Real processes on loopback."""

import asyncio
import os
import re
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.gateway_cluster import chat, gateway_config, running, start_engines, write_config
from tests.procs import ManagedProcess, free_port, kvgate_cmd, start

INSTANT_SIM = ("--sim", "--sim-preset", "instant")
REQUESTS = 40
ROTATED = {"Authorization": "Bearer sk-rotated"}


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


async def _send(url: str, count: int, headers: dict[str, str] | None = None) -> list[tuple[int, str]]:
    """``count`` chats, each on a new connection (the kernel spreads connections, not requests):
    (status, answering worker) for each."""
    replies = []
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        for index in range(count):
            async with session.post(f"{url}/v1/chat/completions", json=chat(f"q{index}"), headers=headers) as reply:
                await reply.read()
                replies.append((reply.status, reply.headers["x-kvgate-worker"]))
    return replies


async def _get(url: str, path: str) -> Any:
    async with aiohttp.ClientSession() as session, session.get(f"{url}{path}") as reply:
        assert reply.status == 200, await reply.text()
        return await reply.json(content_type=None) if path != "/metrics" else await reply.text()


async def _wait_workers(url: str, count: int = 2, timeout_s: float = 60.0) -> None:
    """Until /admin/backends sums ``count`` workers (each serves its private socket once started)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if (await _get(url, "/admin/backends"))["workers"] == count:
                return
        except (aiohttp.ClientError, AssertionError):
            pass
        await asyncio.sleep(0.2)
    raise TimeoutError(f"{count} workers not answering after {timeout_s}s")


def _requests_total(exposition: str) -> float:
    return sum(float(value) for value in re.findall(r"^kvgate_requests_total\{.*\} (\S+)$", exposition, re.M))


def _start_workers(tmp_path: Path, config: dict[str, Any], *flags: str) -> ManagedProcess:
    config_path = write_config(tmp_path / "gateway.yaml", config)
    port = config["listen"]["port"]
    return start(kvgate_cmd("gateway", "-c", str(config_path), *flags), port, tmp_path / "gateway.log")


async def test_two_workers_act_as_one_gateway(tmp_path: Path) -> None:
    """Served, counted and reloaded as one gateway; a killed worker is replaced."""
    with running(start_engines(tmp_path, 1, *INSTANT_SIM)) as engines:
        config = gateway_config(free_port(), engines, observability={"request_log": False})
        with running([_start_workers(tmp_path, config, "--workers", "2")]) as (gateway,):
            await _wait_workers(gateway.url)
            replies = await _send(gateway.url, REQUESTS)
            assert {status for status, _ in replies} == {200}
            by_worker = Counter(worker for _, worker in replies)
            assert set(by_worker) == {"0", "1"}, by_worker

            assert _requests_total(await _get(gateway.url, "/metrics")) == REQUESTS
            stats = await _get(gateway.url, "/dashboard/stats.json")
            assert (stats["workers"], stats["totals"]["requests"]) == (2, REQUESTS)
            assert sum(stats["series"]["requests_per_s"]) * stats["bucket_s"] == REQUESTS

            locked = {**config, "tenants": [{"name": "team", "api_keys": ["sk-team"]}]}
            write_config(tmp_path / "gateway.yaml", locked)
            async with aiohttp.ClientSession() as session, session.post(f"{gateway.url}/admin/reload") as reply:
                assert reply.status == 200
                assert (await reply.json())["workers"] == {"0": "reloaded", "1": "reloaded"}
            replies = await _send(gateway.url, REQUESTS)
            assert {status for status, _ in replies} == {401}
            assert {worker for _, worker in replies} == {"0", "1"}

            write_config(tmp_path / "gateway.yaml", config)
            async with aiohttp.ClientSession() as session:
                async with session.post(f"{gateway.url}/admin/reload") as reply:
                    assert reply.status == 400, "dropping every tenant needs allow=no_auth"
                async with session.post(f"{gateway.url}/admin/reload?allow=no_auth") as reply:
                    assert (await reply.json())["workers"] == {"0": "reloaded", "1": "reloaded"}
            assert {status for status, _ in await _send(gateway.url, REQUESTS)} == {200}, "every worker was allowed"

            rotated = {**config, "tenants": [{"name": "team", "api_keys": ["sk-rotated"]}]}
            write_config(tmp_path / "gateway.yaml", rotated)
            os.kill(gateway.proc.pid, signal.SIGHUP)
            await _wait_until_open(gateway.url, ROTATED)

            first, second = _children(gateway.proc.pid)
            os.kill(first, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while first in _children(gateway.proc.pid) or len(_children(gateway.proc.pid)) < 2:
                assert time.monotonic() < deadline, gateway.log()
                await asyncio.sleep(0.1)
            assert second in _children(gateway.proc.pid)
            await _wait_workers(gateway.url)
            replies = await _send(gateway.url, REQUESTS, ROTATED)
            assert {status for status, _ in replies} == {200}
            assert {worker for _, worker in replies} == {"0", "1"}


def test_workers_config_key_starts_that_many_workers(tmp_path: Path) -> None:
    """`workers:` in the config, without the flag, makes a parent of that many workers."""
    config = {
        "listen": {"port": free_port()},
        "workers": 2,
        "backends": [{"name": "none", "url": "http://127.0.0.1:9"}],
    }
    with running([_start_workers(tmp_path, config)]) as (gateway,):
        asyncio.run(_wait_workers(gateway.url))
        assert len(_children(gateway.proc.pid)) == 2


async def _wait_until_open(url: str, headers: dict[str, str], timeout_s: float = 30.0) -> None:
    """Until both workers serve requests with ``headers`` (the SIGHUP reload applied everywhere)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        replies = await _send(url, 20, headers)
        if {status for status, _ in replies} == {200} and {worker for _, worker in replies} == {"0", "1"}:
            return
        await asyncio.sleep(0.2)
    pytest.fail(f"the SIGHUP reload did not reach both workers within {timeout_s}s")
