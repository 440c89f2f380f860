"""kill -9 of one of three engines under steady load: nothing lost, streams end cleanly, it comes back."""

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.gateway_cluster import (
    SLOW_SIM,
    chat,
    gateway_config,
    gateway_for,
    post,
    running,
    start_engines,
    wait_for_status,
)
from tests.procs import ManagedProcess, free_port, kvgate_cmd, start

HEALTH_INTERVAL_S = 0.5
LOAD_S = 4.0


async def steady_load(
    gateway: ManagedProcess, until: float, streaming: bool, worker: int, streaming_on: dict[str, int]
) -> list[tuple[int, list]]:
    """One client sending requests back to back until ``until``; each result is (status, events or body).

    Streams are long (about 2 s) so that every replica has some in flight when one is killed;
    ``streaming_on`` counts, per backend, the streams that have sent an event and not yet ended.
    """
    url = f"{gateway.url}/v1/chat/completions"
    results = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        index = 0
        while time.monotonic() < until:
            body = chat(f"worker {worker} request {index}", 100 if streaming else 25, ignore_eos=True)
            if streaming:
                results.append(await counted_stream(session, url, body, streaming_on))
            else:
                status, _, reply = await post(session, url, body)
                results.append((status, [reply]))
            index += 1
    return results


async def counted_stream(
    session: aiohttp.ClientSession, url: str, body: dict, streaming_on: dict[str, int]
) -> tuple[int, list]:
    """``stream`` that counts itself in ``streaming_on`` between its first event and its end."""
    async with session.post(url, json={**body, "stream": True}) as reply:
        backend = reply.headers.get("x-kvgate-backend", "")
        events: list = []
        try:
            async for line in reply.content:
                if line.startswith(b"data: "):
                    payload = line[6:].strip()
                    events.append(payload if payload == b"[DONE]" else orjson.loads(payload))
                    if len(events) == 1:
                        streaming_on[backend] = streaming_on.get(backend, 0) + 1
        finally:
            if events:
                streaming_on[backend] -= 1
        return reply.status, events


async def wait_until(condition: Callable[[], bool], timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.01)


@pytest.mark.slow
async def test_kill_one_of_three_engines_under_load(tmp_path: Path) -> None:
    with running(start_engines(tmp_path, 3, *SLOW_SIM)) as engines:
        config = gateway_config(free_port(), engines, health={"interval_s": HEALTH_INTERVAL_S, "timeout_s": 0.5})
        with gateway_for(tmp_path, config) as gateway:
            until = time.monotonic() + LOAD_S
            streaming_on: dict[str, int] = {}
            load = [asyncio.create_task(steady_load(gateway, until, i % 2 == 1, i, streaming_on)) for i in range(12)]
            await wait_until(lambda: streaming_on.get("e1", 0) >= 1)
            engines[1].kill()
            results = await asyncio.wait_for(asyncio.gather(*load), LOAD_S + 30)

            whole = [result for worker, outcome in enumerate(results) if worker % 2 == 0 for result in outcome]
            streams = [result for worker, outcome in enumerate(results) if worker % 2 == 1 for result in outcome]
            assert whole and all(status == 200 for status, _ in whole), [r for r in whole if r[0] != 200][:3]
            broken = [events for status, events in streams if not (events and events[-1] == b"[DONE]")]
            assert all(status == 200 for status, _ in streams)
            assert broken, "some stream was on the killed engine"
            assert all("error" in events[-1] for events in broken), broken[:3]

            port = engines[1].port
            engines[1] = start(kvgate_cmd("engine", "--port", str(port), *SLOW_SIM), port, tmp_path / "restarted.log")
            async with aiohttp.ClientSession() as session:
                await wait_for_status(session, gateway.url, lambda status: status["backends"][1]["healthy"])
                served_by = set()
                for index in range(12):
                    _, headers, _ = await post(session, f"{gateway.url}/v1/chat/completions", chat(f"after {index}", 2))
                    served_by.add(headers["x-kvgate-backend"])
                assert "e1" in served_by
