"""The replicas behind the gateway: their health, in-flight load and the numbers they report."""

import asyncio
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import aiohttp

from gateway.config import BackendSpec, HealthConfig
from gateway.routing.types import ReplicaState

log = logging.getLogger("kvgate.backends")


@dataclass
class Backend:
    """One replica and what the gateway knows of it right now."""

    spec: BackendSpec
    model: str
    healthy: bool = False
    in_flight: int = 0
    in_flight_prefill_tokens: int = 0
    consecutive_failures: int = 0
    consecutive_successes: int = 0
    reported: dict = field(default_factory=dict)
    """The replica's own numbers from its /stats (bundled engine), refreshed by health checks."""
    last_checked: float = 0.0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def has_room(self) -> bool:
        limit = self.spec.max_concurrency
        return limit is None or self.in_flight < limit

    def state(self) -> ReplicaState:
        return ReplicaState(
            name=self.name,
            model=self.model,
            healthy=self.healthy,
            in_flight=self.in_flight,
            in_flight_prefill_tokens=self.in_flight_prefill_tokens,
            max_concurrency=self.spec.max_concurrency,
            num_running=self.reported.get("num_running"),
            num_waiting=self.reported.get("num_waiting"),
            kv_usage=self.reported.get("kv_usage"),
            prefill_tokens_per_s=self.reported.get("prefill_tokens_per_s"),
        )

    @contextmanager
    def occupy(self, prefill_tokens: int) -> Iterator[None]:
        """Count a request as in flight here for the duration of the block."""
        self.in_flight += 1
        self.in_flight_prefill_tokens += prefill_tokens
        try:
            yield
        finally:
            self.in_flight -= 1
            self.in_flight_prefill_tokens -= prefill_tokens

    def record_check(self, ok: bool, config: HealthConfig) -> None:
        """Apply one health-check result with the configured thresholds."""
        self.last_checked = time.monotonic()
        if ok:
            self.consecutive_failures = 0
            self.consecutive_successes += 1
            if not self.healthy and self.consecutive_successes >= config.healthy_after:
                log.info("backend %s is healthy", self.name)
                self.healthy = True
        else:
            self.consecutive_successes = 0
            self.consecutive_failures += 1
            if self.healthy and self.consecutive_failures >= config.unhealthy_after:
                log.warning("backend %s is unhealthy", self.name)
                self.healthy = False


class BackendPool:
    """All backends by name, with an active health checker."""

    def __init__(self, backends: list[Backend], health: HealthConfig) -> None:
        self.backends: dict[str, Backend] = {backend.name: backend for backend in backends}
        self.health = health
        self._checker: asyncio.Task | None = None

    def serving(self, model: str) -> list[Backend]:
        return [backend for backend in self.backends.values() if backend.model == model]

    def available(self, model: str) -> list[Backend]:
        """Healthy replicas of ``model`` below their concurrency cap."""
        return [backend for backend in self.serving(model) if backend.healthy and backend.has_room]

    async def start(self, session: aiohttp.ClientSession) -> None:
        await self.check_all(session)
        self._checker = asyncio.create_task(self._check_forever(session))

    async def stop(self) -> None:
        if self._checker is not None:
            self._checker.cancel()
            await asyncio.gather(self._checker, return_exceptions=True)

    async def check_all(self, session: aiohttp.ClientSession) -> None:
        await asyncio.gather(*(self._check(session, backend) for backend in list(self.backends.values())))

    async def _check_forever(self, session: aiohttp.ClientSession) -> None:
        while True:
            await asyncio.sleep(self.health.interval_s)
            await self.check_all(session)

    async def _check(self, session: aiohttp.ClientSession, backend: Backend) -> None:
        timeout = aiohttp.ClientTimeout(total=self.health.timeout_s)
        try:
            async with session.get(f"{backend.spec.url}/health", timeout=timeout) as response:
                ok = response.status == 200
            if ok:
                backend.reported = await self._fetch_stats(session, backend, timeout)
        except (aiohttp.ClientError, asyncio.TimeoutError):
            ok = False
        backend.record_check(ok, self.health)

    @staticmethod
    async def _fetch_stats(session: aiohttp.ClientSession, backend: Backend, timeout: aiohttp.ClientTimeout) -> dict:
        """The bundled engine's /stats; other engines (vLLM, SGLang) have none, which is fine."""
        try:
            async with session.get(f"{backend.spec.url}/stats", timeout=timeout) as response:
                if response.status == 200:
                    stats = await response.json()
                    return stats if isinstance(stats, dict) else {}
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            pass
        return {}
