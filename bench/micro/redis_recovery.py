"""How soon the Redis limiter sees a restarted Redis: shared limits back after an outage.

Starts its own redis-server on a free loopback port and one ``RedisLimiter`` (the gateway's). Each
round: ``--leases`` requests of a capped tenant hold a lease, Redis is killed (SIGKILL), the
requests end (their leases wait to be freed), an admission notices Redis is gone, and Redis stays
down for the outage length; then it is started again on the same port. Recovery is the time from
Redis answering a fresh client's PING to the limiter's limits being global again (``up``), with
the leases of the outage freed. Also printed: the limiter's failed Redis calls per second of
outage (its probes: how hard it knocks on a dead Redis). Run: ``python -m bench.micro.redis_recovery``.
"""

import argparse
import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.harness.processes import free_port
from bench.micro.limiter_cost import wait_for_redis
from gateway.admission.config import SharedStateConfig, TenantConfig
from gateway.admission.redis_limiter import RedisLimiter
from gateway.admission.tenants import Tenant, TenantRegistry
from gateway.process.event_loop import run as run_loop

TENANT = TenantConfig(name="bench", api_keys=["k"], max_concurrency=10**6)


class RedisProcess:
    """A redis-server without persistence that can be killed and started again on its port."""

    def __init__(self, binary: str, folder: Path) -> None:
        self.binary = binary
        self.port = free_port()
        self.log = folder / "redis.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        command = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


async def hold_leases(tenant: Tenant, count: int) -> tuple[asyncio.Event, list[asyncio.Task]]:
    """``count`` admitted requests that end when the returned event is set."""
    release = asyncio.Event()
    admitted = asyncio.Semaphore(0)

    async def request() -> None:
        async with tenant.admit(1):
            admitted.release()
            await release.wait()

    tasks = [asyncio.create_task(request()) for _ in range(count)]
    for _ in range(count):
        await admitted.acquire()
    return release, tasks


async def one_round(
    limiter: RedisLimiter, tenant: Tenant, server: RedisProcess, leases: int, outage_s: float
) -> tuple[float, float]:
    """Recovery seconds, and failed Redis calls per second of outage."""
    release, holders = await hold_leases(tenant, leases)
    server.kill()
    release.set()
    await asyncio.gather(*holders)
    while limiter.up:
        async with tenant.admit(1):
            pass
        await asyncio.sleep(0.01)
    errors_before = limiter.errors
    await asyncio.sleep(outage_s)
    knocks = (limiter.errors - errors_before) / outage_s
    server.start()
    await wait_for_redis(server.url)
    answered = time.perf_counter()
    await until_up(limiter)
    return time.perf_counter() - answered, knocks


async def until_up(limiter: RedisLimiter) -> None:
    """Wait until the limiter's own probe has found Redis again."""
    while not limiter.up:
        await asyncio.sleep(0.002)


async def run(server: RedisProcess, outages: list[float], rounds: int, leases: int) -> None:
    await wait_for_redis(server.url)
    limiter = RedisLimiter(SharedStateConfig(redis_url=server.url, key_prefix=f"bench-{time.time_ns()}"))
    await limiter.start()
    tenant = TenantRegistry([TENANT], limiter=limiter).by_name["bench"]
    print(f"load average before: {os.getloadavg()}")
    print(
        "| outage (s) | rounds | leases freed after | recovery p50 (s) | recovery max (s) | failed calls per s down |"
    )
    print("|---|---|---|---|---|---|")
    try:
        for outage_s in outages:
            results = [await one_round(limiter, tenant, server, leases, outage_s) for _ in range(rounds)]
            recovery = np.array([took for took, _ in results])
            knocks = np.median([rate for _, rate in results])
            print(
                f"| {outage_s:g} | {rounds} | {leases} | {np.median(recovery):.3f} | {recovery.max():.3f} | {knocks:.1f} |"
            )
    finally:
        await limiter.stop()
    print(f"load average after: {os.getloadavg()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.micro.redis_recovery", description=__doc__.splitlines()[0])
    parser.add_argument("--outages", type=float, nargs="+", default=[0.2, 1.0, 3.0], help="seconds Redis stays down")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--leases", type=int, default=1000, help="leases held when Redis dies, freed after")
    args = parser.parse_args(argv)
    binary = shutil.which("redis-server")
    if binary is None:
        print("redis-server is not installed (apt-get install redis-server)")
        return 2
    with tempfile.TemporaryDirectory() as folder:
        server = RedisProcess(binary, Path(folder))
        server.start()
        try:
            run_loop(run(server, args.outages, args.rounds, args.leases))
        finally:
            server.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
