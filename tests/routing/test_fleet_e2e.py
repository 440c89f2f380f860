"""Several gateways act as one: three gateways in front of the same simulated replicas, all real
processes on loopback. They keep the one-gateway hit rate with requests spread over them, a
gateway started after the caches are warm learns them through replay (the engines' replay
buffers are tiny, so it gets their snapshots), and each gateway sees the load the others place."""

import asyncio
import functools
import itertools
import random
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.gateway_cluster import MODEL, get_json, write_config
from tests.procs import ManagedProcess, free_port, start_engine, start_gateway

REPLICAS = 3
GROUPS = 6
PREFIX_TOKENS = 320
SIM = (
    "--sim", "--sim-preset", "instant", "--sim-decode-base-s", "0.005", "--sim-prefill-per-token-s", "0.0005",
    "--num-blocks", "400", "--max-model-len", "2048", "--kv-events-buffer-steps", "4",
)  # fmt: skip


def engine_endpoints() -> dict[str, str]:
    return {name: f"tcp://127.0.0.1:{free_port()}" for name in ("kv_events", "kv_events_replay", "load_events")}


def engine_flags(endpoints: dict[str, str]) -> list[str]:
    return [
        "--kv-events", endpoints["kv_events"],
        "--kv-events-replay", endpoints["kv_events_replay"],
        "--load-events", endpoints["load_events"],
    ]  # fmt: skip


class Fleet:
    def __init__(self, tmp_path: Path, stack: ExitStack) -> None:
        self.tmp_path = tmp_path
        self.stack = stack
        self.endpoints = [engine_endpoints() for _ in range(REPLICAS)]
        with ThreadPoolExecutor(REPLICAS) as pool:
            self.engines = list(pool.map(self._start_engine, range(REPLICAS)))
        for engine in self.engines:
            stack.callback(engine.stop)
        self.gateways = self.start_gateways(3)

    def _start_engine(self, index: int) -> ManagedProcess:
        return start_engine(self.tmp_path, *SIM, *engine_flags(self.endpoints[index]), name=f"e{index}")

    def config(self, port: int) -> dict[str, Any]:
        backends = [
            {"name": f"e{index}", "url": engine.url, "kv_capacity_blocks": 400, **self.endpoints[index]}
            for index, engine in enumerate(self.engines)
        ]
        return {
            "listen": {"port": port},
            "model": MODEL,
            "backends": backends,
            # One running request must cost more than ``placement_slack_s`` (0.1 s), or a new prefix
            # may tie an idle replica with a loaded one and the load check says nothing.
            "routing": {
                "policy": "cache_aware",
                "decode_wait_s_per_request": 0.2,
                "placement_slack_s": 0.1,
                "ttft_target_s": 10.0,
            },
            "health": {"interval_s": 0.5},
            "observability": {"request_log": False},
        }

    def start_gateways(self, count: int) -> list[ManagedProcess]:
        ports = [free_port() for _ in range(count)]
        paths = [write_config(self.tmp_path / f"gateway-{port}.yaml", self.config(port)) for port in ports]
        with ThreadPoolExecutor(count) as pool:
            started = list(pool.map(lambda pair: start_gateway(self.tmp_path, *pair), zip(paths, ports, strict=True)))
        for gateway in started:
            self.stack.callback(gateway.stop)
        return started


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with ExitStack() as stack:
        yield Fleet(tmp_path_factory.mktemp("fleet"), stack)


def shared_prefix_prompts(seed: int, per_group: int) -> list[list[int]]:
    """``GROUPS`` long prefixes, ``per_group`` requests each with a short own suffix, shuffled."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(100, 40000) for _ in range(PREFIX_TOKENS)] for _ in range(GROUPS)]
    prompts = [prefix + [rng.randrange(100, 40000) for _ in range(24)] for prefix in prefixes for _ in range(per_group)]
    rng.shuffle(prompts)
    return prompts


async def run_load(gateways: list[ManagedProcess], prompts: list[list[int]], users: int = 3) -> float:
    """Send every prompt, round robin over the gateways, ``users`` at a time; the hit rate."""
    urls = itertools.cycle([gateway.url for gateway in gateways])
    queue = list(enumerate(prompts))
    cached = prompt_tokens = 0

    async def user(session: aiohttp.ClientSession) -> None:
        nonlocal cached, prompt_tokens
        while queue:
            _, prompt = queue.pop(0)
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 2}
            async with session.post(f"{next(urls)}/v1/completions", json=body) as reply:
                assert reply.status == 200, await reply.text()
                usage = (await reply.json())["usage"]
            cached += usage["prompt_tokens_details"]["cached_tokens"]
            prompt_tokens += usage["prompt_tokens"]

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(user(session) for _ in range(users)))
    return cached / prompt_tokens


async def index_blocks(gateway: ManagedProcess) -> dict[str, int]:
    async with aiohttp.ClientSession() as session:
        stats = await get_json(session, f"{gateway.url}/dashboard/stats.json")
    return {name: entry["blocks"] for name, entry in stats["prefix_index"]["index"]["per_replica"].items()}


def reset_caches(fleet: Fleet) -> None:
    """Empty every engine's cache, and wait until every gateway's index is empty too."""
    for engine in fleet.engines:
        request = f"{engine.url}/reset_prefix_cache"
        asyncio.run(_post(request))
    for gateway in fleet.gateways:
        wait_until(functools.partial(index_is_empty, gateway))


def index_is_empty(gateway: ManagedProcess) -> bool:
    return not any(asyncio.run(index_blocks(gateway)).values())


async def _post(url: str) -> None:
    async with aiohttp.ClientSession() as session, session.post(url) as reply:
        assert reply.status == 200


def wait_until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_three_gateways_keep_the_one_gateway_hit_rate(fleet: Fleet) -> None:
    """One request at a time, so the comparison is exact (bench/RESULTS.md measures concurrent load)."""
    prompts = shared_prefix_prompts(seed=1, per_group=8)
    reset_caches(fleet)
    one = asyncio.run(run_load(fleet.gateways[:1], prompts, users=1))
    reset_caches(fleet)
    three = asyncio.run(run_load(fleet.gateways, prompts, users=1))
    assert one > 0.75, f"the workload should mostly hit: {one:.3f}"
    assert three >= one - 0.01, f"three gateways {three:.3f} vs one {one:.3f}"


def test_a_gateway_started_late_learns_the_warm_caches(fleet: Fleet) -> None:
    prompts = shared_prefix_prompts(seed=2, per_group=4)
    reset_caches(fleet)
    asyncio.run(run_load(fleet.gateways, prompts))
    survivor = asyncio.run(index_blocks(fleet.gateways[0]))
    assert sum(survivor.values()) >= GROUPS * PREFIX_TOKENS // 16
    (late,) = fleet.start_gateways(1)
    wait_until(lambda: asyncio.run(index_blocks(late)) == asyncio.run(index_blocks(fleet.gateways[0])))
    again = shared_prefix_prompts(seed=2, per_group=1)
    late_rate = asyncio.run(run_load([late], again, users=1))
    prefix_share = PREFIX_TOKENS // 16 * 16 / len(again[0])
    assert late_rate >= prefix_share, f"the late gateway missed warm prefixes: {late_rate:.3f}"


def test_a_burst_over_two_gateways_stays_on_one_replica(fleet: Fleet) -> None:
    """While one gateway's request still prefills a new prefix, another gateway routes the same
    prefix to that replica: the engine announces the prompts it is about to cache."""
    asyncio.run(burst(fleet.gateways[0], fleet.gateways[1]))


async def burst(first: ManagedProcess, second: ManagedProcess) -> None:
    prefix = [random.Random(3).randrange(100, 40000) for _ in range(1800)]
    async with aiohttp.ClientSession() as session:
        body = {"model": MODEL, "prompt": [*prefix, 1, 2, 3], "max_tokens": 2}
        leading = asyncio.ensure_future(session.post(f"{first.url}/v1/completions", json=body))
        await until_watched(session, second, lambda replicas: any(r["queued_prefill_tokens"] > 1000 for r in replicas))
        async with session.post(f"{second.url}/v1/completions", json={**body, "prompt": [*prefix, 4, 5, 6]}) as reply:
            assert reply.status == 200
            follower = reply.headers["x-kvgate-backend"]
            cached = (await reply.json())["usage"]["prompt_tokens_details"]["cached_tokens"]
        async with await leading as reply:
            assert reply.headers["x-kvgate-backend"] == follower, "the burst was scattered over two replicas"
        assert cached >= 1792 - 16, f"the follower recomputed the prefix: {cached} cached"


def test_each_gateway_sees_the_load_another_placed(fleet: Fleet) -> None:
    """Requests one gateway placed count as load at another, which routes a new request around
    them. The check needs them still running when it routes, which a slow machine can outlast (a
    placed request runs for ``LONG_TOKENS`` sim decode steps): then it is made again."""
    placing, watching = fleet.gateways[0], fleet.gateways[1]
    for attempt in range(3):
        if asyncio.run(place_and_watch(placing, watching, attempt)):
            return
    pytest.fail("the placed requests finished before the watching gateway routed, three times running")


LONG_TOKENS = 2000
"""Decode steps of a placed request: at least 10 s at the fleet's 5 ms sim decode step."""


async def place_and_watch(placing: ManagedProcess, watching: ManagedProcess, attempt: int) -> bool:
    """Place two long streams through ``placing``; once ``watching`` sees them, a fresh prompt sent
    to ``watching`` must avoid their replicas. False when the streams were no longer all running
    after that request was routed (the check says nothing then)."""
    body = {"model": MODEL, "prompt": "Tell me a long story.", "max_tokens": LONG_TOKENS, "stream": True}
    async with aiohttp.ClientSession() as session:
        streams = [await session.post(f"{placing.url}/v1/completions", json=body) for _ in range(2)]
        try:
            for stream in streams:
                assert stream.status == 200, await stream.text()
                await stream.content.readline()
            placed = await in_flight(session, placing)
            assert sum(placed.values()) == 2, placed

            def sees_placed(replicas: list[dict]) -> bool:
                """The placed streams are seen, and the other replicas are idle (work left from an
                earlier test would load them too, and routing around it is right)."""
                return all(
                    replica["num_running"] >= placed[replica["name"]]
                    if replica["name"] in placed
                    else replica["num_running"] == replica["num_waiting"] == 0
                    for replica in replicas
                )

            seen = await until_watched(session, watching, sees_placed)
            assert all(replica["in_flight"] == 0 for replica in seen), "the watching gateway sent nothing itself"
            rng = random.Random(f"fresh-{attempt}")
            fresh = {"model": MODEL, "prompt": [rng.randrange(100, 40000) for _ in range(90)], "max_tokens": 1}
            async with session.post(f"{watching.url}/v1/completions", json=fresh) as reply:
                assert reply.status == 200
                chosen = reply.headers["x-kvgate-backend"]
            if await in_flight(session, placing) != placed:
                return False
            assert chosen not in placed, f"routed onto a loaded replica: {seen}"
            return True
        finally:
            for stream in streams:
                stream.close()


async def in_flight(session: aiohttp.ClientSession, gateway: ManagedProcess) -> dict[str, int]:
    """The gateway's requests in flight, per replica that has any."""
    replicas = (await get_json(session, f"{gateway.url}/dashboard/stats.json"))["replicas"]
    return {replica["name"]: replica["in_flight"] for replica in replicas if replica["in_flight"]}


async def until_watched(
    session: aiohttp.ClientSession, gateway: ManagedProcess, condition: Callable[[list[dict]], bool]
) -> list[dict]:
    deadline = time.monotonic() + 20
    while True:
        replicas = (await get_json(session, f"{gateway.url}/dashboard/stats.json"))["replicas"]
        if condition(replicas):
            return replicas
        assert time.monotonic() < deadline, f"never seen: {orjson.dumps(replicas).decode()}"
        await asyncio.sleep(0.05)
