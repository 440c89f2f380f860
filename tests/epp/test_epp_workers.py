"""`kvgate epp --workers 2`: Envoy's connections spread over two picker processes on one port,
one tenant cap for both, one set of operator views, and a killed worker replaced. Real processes
on loopback: simulated engines, the real picker, Envoy's message sequences from a gRPC client."""

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.bodies import chat
from tests.epp.envoy_flows import (
    CAPPED_KEY,
    OPEN_KEY,
    buffered_pick,
    endpoints_of,
    finish_whole,
    forwarded_body,
    nothing_held,
)
from tests.epp.picker_process import Picker, picker_for, wait_until

CONNECTIONS = 24
"""Fresh connections per check: the kernel hashes each to one worker, so all 24 on one of two
workers is a 2-in-16-million chance."""


@pytest.fixture(scope="module")
def picker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Picker]:
    tenants = [
        {"name": "capped", "api_keys": [CAPPED_KEY], "max_concurrency": 1},
        {"name": "open", "api_keys": [OPEN_KEY]},
    ]
    with picker_for(tmp_path_factory.mktemp("epp-workers"), 2, ("--workers", "2"), tenants=tenants) as started:
        wait_until(lambda: started.admin()["workers"] == 2)
        yield started


@asynccontextmanager
async def own_connection(picker: Picker) -> AsyncIterator[grpc.aio.Channel]:
    """A channel on a TCP connection of its own (channels of one process share them by default)."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    async with grpc.aio.insecure_channel(picker.grpc_target, options=options) as channel:
        yield channel


def workers_of(picker: Picker) -> list[int]:
    parent = picker.process.proc.pid
    return [int(child) for child in Path(f"/proc/{parent}/task/{parent}/children").read_text().split()]


async def requests_by_worker(picker: Picker) -> list[float]:
    """Each worker's own ``kvgate_requests_total``, from its private socket (the parent's folder)."""
    counts = []
    for pid in workers_of(picker):
        environ = dict(
            entry.split("=", 1) for entry in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in entry
        )
        index = environ["KVGATE_WORKER"].split("/")[0]
        socket = Path(environ["KVGATE_WORKER_DIR"]) / f"worker-{index}.sock"
        async with (
            aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(socket))) as session,
            session.get("http://worker/metrics") as reply,
        ):
            text = await reply.text()
        counts.append(
            sum(
                sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.name == "kvgate_requests_total"
            )
        )
    return counts


async def pick_and_finish(picker: Picker, question: str) -> None:
    async with own_connection(picker) as channel:
        body = chat(question, max_tokens=2)
        envoy, answer = await buffered_pick(channel, body)
        completion, _ = await finish_whole(envoy, endpoints_of(answer)[0], forwarded_body(answer, body))
        assert completion["choices"][0]["message"]["content"]


async def test_connections_spread_over_both_workers_and_are_counted_once(picker: Picker) -> None:
    before = picker.metric("kvgate_requests_total")
    for index in range(CONNECTIONS):
        await pick_and_finish(picker, f"question {index}")
    wait_until(lambda: picker.metric("kvgate_requests_total") == before + CONNECTIONS)
    per_worker = await requests_by_worker(picker)
    assert len(per_worker) == 2 and all(count > 0 for count in per_worker), per_worker
    assert sum(per_worker) == before + CONNECTIONS


async def test_a_tenant_cap_holds_across_workers(picker: Picker) -> None:
    """A capped tenant cannot get a second slot by opening connections that land on the other worker."""
    async with own_connection(picker) as holding:
        holder, answer = await buffered_pick(holding, chat("hold my slot", max_tokens=2), CAPPED_KEY)
        assert endpoints_of(answer)
        codes = []
        for index in range(CONNECTIONS):
            async with own_connection(picker) as channel:
                refused, immediate = await buffered_pick(channel, chat(f"one too many {index}"), CAPPED_KEY)
                codes.append(immediate.immediate_response.status.code)
                refused.cancel()
        assert set(codes) == {429}
        holder.cancel()
    wait_until(lambda: nothing_held(picker))
    async with own_connection(picker) as channel:
        again, answer = await buffered_pick(channel, chat("my slot is free again", max_tokens=2), CAPPED_KEY)
        assert endpoints_of(answer)
        again.cancel()
    wait_until(lambda: nothing_held(picker))


async def test_a_killed_worker_is_replaced_and_picks_go_on_meanwhile(picker: Picker) -> None:
    """Once the dead worker's socket is gone, its sibling takes every connection until the
    parent has started a new one. (A connection the kernel had queued on the dead socket is
    reset, as with any picker process that dies: Envoy's next stream reconnects.)"""
    first, second = workers_of(picker)
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while first in workers_of(picker):
        assert time.monotonic() < deadline, picker.process.log()
        await asyncio.sleep(0.05)
    for index in range(CONNECTIONS // 2):
        await pick_and_finish(picker, f"while a worker restarts {index}")
    while len(workers_of(picker)) < 2:
        assert time.monotonic() < deadline, picker.process.log()
        await asyncio.sleep(0.1)
    assert second in workers_of(picker)
    wait_until(lambda: picker.admin()["workers"] == 2)
    counts_before = await requests_by_worker(picker)
    for index in range(CONNECTIONS):
        await pick_and_finish(picker, f"after the restart {index}")
    counts_after = await requests_by_worker(picker)
    assert all(after > before for before, after in zip(counts_before, counts_after, strict=True))
