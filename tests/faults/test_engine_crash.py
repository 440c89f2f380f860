"""kill -9 of one of three engines under steady load: nothing lost, streams end cleanly, it comes back."""

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from tests.gateway_cluster import (
    SLOW_SIM,
    chat,
    gateway_config,
    gateway_for,
    get_json,
    post,
    running,
    start_engines,
    stream,
)
from tests.procs import ManagedProcess, free_port, kvgate_cmd, start

HEALTH_INTERVAL_S = 0.5
LOAD_S = 4.0
KILL_AFTER_S = 1.5


async def steady_load(gateway: ManagedProcess, until: float, streaming: bool, worker: int) -> list[tuple[int, list]]:
    """One client sending requests back to back until ``until``; each result is (status, events or body).

    Streams are long (about 2 s) so that every replica has some in flight when one is killed.
    """
    url = f"{gateway.url}/v1/chat/completions"
    results = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        index = 0
        while time.monotonic() < until:
            body = chat(f"worker {worker} request {index}", 100 if streaming else 25, ignore_eos=True)
            if streaming:
                results.append(await stream(session, url, body))
            else:
                status, _, reply = await post(session, url, body)
                results.append((status, [reply]))
            index += 1
    return results


async def backend_health(session: aiohttp.ClientSession, gateway: ManagedProcess) -> dict[str, bool]:
    status = await get_json(session, f"{gateway.url}/admin/backends")
    return {backend["name"]: backend["healthy"] for backend in status["backends"]}


@pytest.mark.slow
async def test_kill_one_of_three_engines_under_load(tmp_path: Path) -> None:
    with running(start_engines(tmp_path, 3, *SLOW_SIM)) as engines:
        config = gateway_config(free_port(), engines, health={"interval_s": HEALTH_INTERVAL_S, "timeout_s": 0.5})
        with gateway_for(tmp_path, config) as gateway:
            until = time.monotonic() + LOAD_S
            load = [asyncio.create_task(steady_load(gateway, until, streaming=i % 2 == 1, worker=i)) for i in range(12)]
            await asyncio.sleep(KILL_AFTER_S)
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
            ready = time.monotonic()
            async with aiohttp.ClientSession() as session:
                while not (await backend_health(session, gateway))["e1"]:
                    await asyncio.sleep(0.05)
                back_after_s = time.monotonic() - ready
                assert back_after_s <= 2 * HEALTH_INTERVAL_S
                served_by = set()
                for index in range(12):
                    _, headers, _ = await post(session, f"{gateway.url}/v1/chat/completions", chat(f"after {index}", 2))
                    served_by.add(headers["x-kvgate-backend"])
                assert "e1" in served_by
