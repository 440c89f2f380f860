"""What shared limits cost per request: a slot and a charge, taken and given back, in process vs through Redis.

Starts its own redis-server on a free loopback port. A capped tenant (concurrency, tokens and
requests per minute, budgets large enough never to refuse) is admitted and settled ``--requests``
times one after another (latency percentiles), then with ``--concurrency`` admissions in flight
at once (admissions per second). Run: ``python -m bench.micro.limiter_cost``.
"""

import argparse
import asyncio
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import numpy as np
import redis.asyncio as redis

from bench.harness.processes import free_port
from gateway.admission.config import SharedStateConfig, TenantConfig
from gateway.admission.limiter import TenantLimiter
from gateway.admission.local_limiter import LocalLimiter
from gateway.admission.redis_limiter import RedisLimiter
from gateway.admission.tenants import Tenant, TenantRegistry

TENANT = TenantConfig(
    name="bench", api_keys=["k"], max_concurrency=10**6, tokens_per_minute=10**12, requests_per_minute=10**9
)


async def one_request(tenant: Tenant) -> None:
    async with tenant.admit(2_000) as charge:
        charge.used = 1_500


async def sequential_ms(tenant: Tenant, requests: int) -> np.ndarray:
    took = np.empty(requests)
    for index in range(requests):
        started = time.perf_counter()
        await one_request(tenant)
        took[index] = (time.perf_counter() - started) * 1e3
    return took


async def per_second(tenant: Tenant, requests: int, concurrency: int) -> float:
    remaining = iter(range(requests))

    async def worker() -> None:
        for _ in remaining:
            await one_request(tenant)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return requests / (time.perf_counter() - started)


async def measure(name: str, make: Callable[[], TenantLimiter], requests: int, concurrency: int) -> None:
    limiter = make()
    await limiter.start()
    try:
        tenant = TenantRegistry([TENANT], limiter=limiter).by_name["bench"]
        await sequential_ms(tenant, min(requests, 200))
        took = await sequential_ms(tenant, requests)
        rate = await per_second(tenant, requests, concurrency)
    finally:
        await limiter.stop()
    p50, p99 = np.percentile(took, [50, 99])
    print(
        f"{name:<6} admit+settle p50 {p50:.3f} ms  p99 {p99:.3f} ms  {rate:,.0f} requests/s at {concurrency} in flight"
    )


async def wait_for_redis(url: str, timeout_s: float = 15.0) -> None:
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                await client.ping()
                return
            except (redis.ConnectionError, OSError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
    finally:
        await client.aclose()


async def run(requests: int, concurrency: int, server_url: str) -> None:
    await wait_for_redis(server_url)
    await measure("local", LocalLimiter, requests, concurrency)
    shared = SharedStateConfig(redis_url=server_url, key_prefix=f"bench-{time.time_ns()}")
    await measure("redis", lambda: RedisLimiter(shared), requests, concurrency)


def with_redis_server(body: Callable[[str], Coroutine[Any, Any, None]]) -> None:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    with tempfile.TemporaryDirectory() as folder, open(Path(folder) / "redis.log", "wb") as log:
        command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            asyncio.run(body(f"redis://127.0.0.1:{port}/0"))
        finally:
            server.terminate()
            server.wait(10)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5_000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args(argv)
    with_redis_server(lambda url: run(args.requests, args.concurrency, url))


if __name__ == "__main__":
    main()
