"""A burst on one new system prompt, over real engine processes and a real gateway on loopback:
it lands evenly over the replicas, whichever order their load reports reach the gateway in
during the burst (bench/notes/2026-12-05-hotspot-burst-balance.md: 28 / 12 / 11 / 13 of 64 when
a request sent since a report was counted by its uncached part, the report by whole prompts)."""

import asyncio
import random
from collections import Counter
from pathlib import Path

import aiohttp

from bench.cli import sim_cost_args
from tests.discovered_fleet import healthy_backends, wait_for
from tests.gateway_cluster import MODEL, write_config
from tests.procs import free_port, start_engines, start_gateway

REPLICAS = 4
BURST = 48
PREFIX_TOKENS = 2048
OWN_TOKENS = 128
SPACING_S = 0.003
"""The burst spans about three of the engines' 50 ms load reports, so some replicas report the
burst's prompts they hold while others have not yet."""


async def send_burst(url: str, prompts: list[list[int]]) -> Counter[str]:
    """The prompts ``SPACING_S`` apart, each before the last is answered; how many each replica
    served (``x-kvgate-backend``)."""
    async with aiohttp.ClientSession() as session:

        async def one(index: int, prompt: list[int]) -> str:
            await asyncio.sleep(index * SPACING_S)
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 1}
            async with session.post(f"{url}/v1/completions", json=body) as reply:
                assert reply.status == 200, await reply.text()
                return reply.headers["x-kvgate-backend"]

        return Counter(await asyncio.gather(*(one(index, prompt) for index, prompt in enumerate(prompts))))


def engine_flags(endpoints: dict[str, str]) -> tuple[str, ...]:
    """The bench's simulated replica (smollm2-cpu costs at 75 us a prefill token) with its sockets."""
    return (
        "--sim", *sim_cost_args(75e-6), "--num-blocks", "1024",
        "--kv-events", endpoints["kv_events"], "--kv-events-replay", endpoints["kv_events_replay"],
        "--load-events", endpoints["load_events"],
    )  # fmt: skip


def test_a_burst_on_a_new_system_prompt_lands_evenly(tmp_path: Path) -> None:
    endpoints = [
        {name: f"tcp://127.0.0.1:{free_port()}" for name in ("kv_events", "kv_events_replay", "load_events")}
        for _ in range(REPLICAS)
    ]
    engines = start_engines(tmp_path, {f"e{index}": engine_flags(ends) for index, ends in enumerate(endpoints)})
    port = free_port()
    backends = [
        {"name": name, "url": engine.url, "kv_capacity_blocks": 1024, **ends}
        for (name, engine), ends in zip(engines.items(), endpoints, strict=True)
    ]
    config = {"listen": {"port": port}, "model": MODEL, "backends": backends, "observability": {"request_log": False}}
    gateway = start_gateway(tmp_path, write_config(tmp_path / "gateway.yaml", config), port)
    try:
        wait_for(lambda: len(healthy_backends(gateway)) == REPLICAS, "every replica healthy")
        rng = random.Random(0)
        prefix = [rng.randrange(100, 40000) for _ in range(PREFIX_TOKENS)]
        prompts = [prefix + [rng.randrange(100, 40000) for _ in range(OWN_TOKENS)] for _ in range(BURST)]
        served = asyncio.run(send_burst(gateway.url, prompts))
        assert sum(served.values()) == BURST
        assert len(served) == REPLICAS and max(served.values()) <= BURST // REPLICAS + 2, served
    finally:
        gateway.stop()
        for engine in engines.values():
            engine.stop()
