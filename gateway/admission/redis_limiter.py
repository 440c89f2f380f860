"""Tenant caps counted in one Redis shared by every gateway: concurrency leases and per-minute buckets.

Each admitted request holds a lease (a member of the tenant's ``leases`` set) that expires
``lease_s`` after its gateway last renewed it; a background task renews this gateway's leases
about three times per ``lease_s`` while the requests are in flight, so the slots of a gateway
killed with SIGKILL come back within ``lease_s``. All checks and takes of one request happen in one
Lua script (``redis_scripts.py``), so gateways never race each other past a cap.

Redis unreachable (a call fails or exceeds ``timeout_s``): one log line, ``kvgate_shared_state_up``
drops to 0 and requests are admitted on this gateway's own counts (``on_unavailable: local``) or
refused with 503 (``reject``) without calling Redis again; the renewal task probes it every second
with a fresh client and switches back when it answers. A request never waits on Redis longer
than ``2 x timeout_s`` (see ``redis_store.py``).
"""

import asyncio
import itertools
import logging
import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.admission.config import SharedStateConfig
from gateway.admission.limiter import (
    Reservation,
    TenantLimiter,
    concurrency_exceeded,
    requests_exceeded,
    tokens_exceeded,
)
from gateway.admission.local_limiter import LocalLimiter
from gateway.admission.redis_store import UNAVAILABLE, RedisStore
from gateway.errors import OpenAIError

if TYPE_CHECKING:
    from gateway.admission.tenants import Tenant

log = logging.getLogger("kvgate.shared_state")

PROBE_INTERVAL_S = 1.0
RENEW_BATCH = 256
"""Leases renewed per script call (Lua's argument stack is bounded)."""
MAX_UNSETTLED = 10_000
"""Leases remembered for settling once Redis is back; beyond that the oldest are left to expire."""


@dataclass
class Lease(Reservation):
    """A request admitted through Redis: its lease id and the keys to settle it with."""

    lease_id: str
    keys: "TenantKeys"
    tokens_per_minute: int


@dataclass(frozen=True)
class TenantKeys:
    leases: str
    tokens: str
    requests: str

    @classmethod
    def of(cls, prefix: str, tenant: str) -> "TenantKeys":
        tag = f"{prefix}:{{{tenant}}}"
        return cls(f"{tag}:leases", f"{tag}:tokens", f"{tag}:requests")


class RedisLimiter(TenantLimiter):
    def __init__(self, config: SharedStateConfig) -> None:
        self.config = config
        self.store = RedisStore(config)
        self.local = LocalLimiter()
        self.instance = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        """Prefix of this gateway's lease ids (which gateway holds a slot is visible in Redis)."""
        self.up = True
        self.unavailable_admissions = {"local": 0, "reject": 0}
        self.errors = 0
        self.last_error = ""
        """The latest failed call, as ``Type: message`` (in /admin/backends)."""
        self._sequence = itertools.count()
        self._leases: dict[str, Lease] = {}
        self._unsettled: dict[str, tuple[Lease, int]] = {}
        """Leases to settle when Redis answers again, with their unused tokens: requests that ended
        while it was away, and admissions whose answer never came (the script may still have run)."""
        self._maintainer: asyncio.Task | None = None

    @property
    def leases(self) -> int:
        """Leases this gateway holds in Redis now."""
        return len(self._leases)

    def keys(self, tenant: str) -> TenantKeys:
        return TenantKeys.of(self.config.key_prefix, tenant)

    async def start(self) -> None:
        try:
            await self.store.ping()
            log.info("shared state at %s: tenant limits are global", redacted(self.config.redis_url))
        except UNAVAILABLE as exc:
            self._went_down(exc)
        self._maintainer = asyncio.get_running_loop().create_task(self._maintain())

    async def stop(self) -> None:
        if self._maintainer is not None:
            self._maintainer.cancel()
            await asyncio.gather(self._maintainer, return_exceptions=True)
        await self.store.close()

    async def reserve(self, tenant: "Tenant", tokens: int) -> Reservation:
        if not tenant.limited or tenant.config is None:
            return self.local.reserve_now(tenant, tokens)
        if not self.up:
            return self._without_redis(tenant, tokens)
        config = tenant.config
        lease = Lease(
            tenant,
            tokens,
            f"{self.instance}:{next(self._sequence)}",
            self.keys(tenant.name),
            config.tokens_per_minute or 0,
        )
        args: list[str | int] = [
            lease.lease_id,
            self._lease_ms,
            config.max_concurrency or 0,
            tokens,
            config.tokens_per_minute or 0,
            config.requests_per_minute or 0,
        ]
        try:
            verdict, detail = await self.store.call(self.store.admit(keys=_bucket_keys(lease.keys), args=args))
        except UNAVAILABLE as exc:
            self._went_down(exc)
            self._settle_later(lease, tokens)
            return self._without_redis(tenant, tokens)
        if verdict == 1:
            raise concurrency_exceeded(tenant.name, detail, config.max_concurrency or 0)
        if verdict == 2:
            raise tokens_exceeded(tenant.name, config.tokens_per_minute or 0, tokens, detail / 1000)
        if verdict == 3:
            raise requests_exceeded(tenant.name, config.requests_per_minute or 0, detail / 1000)
        tenant.usage.in_flight += 1
        self._leases[lease.lease_id] = lease
        return lease

    async def settle(self, reservation: Reservation, unused_tokens: int) -> None:
        if not isinstance(reservation, Lease):
            self.local.settle_now(reservation, unused_tokens)
            return
        reservation.tenant.usage.in_flight -= 1
        self._leases.pop(reservation.lease_id, None)
        if not self.up:
            self._settle_later(reservation, unused_tokens)
            return
        try:
            await self._settle_in_redis(reservation, unused_tokens)
        except UNAVAILABLE as exc:
            self._went_down(exc)
            self._settle_later(reservation, unused_tokens)

    async def _settle_in_redis(self, lease: Lease, unused_tokens: int) -> None:
        args: list[str | int] = [lease.lease_id, unused_tokens, lease.tokens_per_minute]
        await self.store.call(self.store.settle(keys=[lease.keys.leases, lease.keys.tokens], args=args))

    def _settle_later(self, lease: Lease, unused_tokens: int) -> None:
        self._unsettled[lease.lease_id] = (lease, unused_tokens)
        if len(self._unsettled) > MAX_UNSETTLED:
            del self._unsettled[next(iter(self._unsettled))]

    async def _settle_unsettled(self) -> None:
        """Settle what ended while Redis was away, so its slots come back at once rather than at expiry."""
        for lease_id, (lease, unused_tokens) in list(self._unsettled.items()):
            await self._settle_in_redis(lease, unused_tokens)
            del self._unsettled[lease_id]

    async def shared_status(self, tenants: list["Tenant"]) -> dict[str, object] | None:
        counts: dict[str, int | None] = {}
        for tenant in tenants:
            if tenant.limited:
                counts[tenant.name] = await self.in_flight(tenant.name) if self.up else None
        return {
            "redis": redacted(self.config.redis_url),
            "up": self.up,
            "on_unavailable": self.config.on_unavailable,
            "lease_s": self.config.lease_s,
            "leases_held": self.leases,
            "last_error": self.last_error,
            "tenants_in_flight": counts,
        }

    async def in_flight(self, tenant: str) -> int | None:
        """The tenant's live leases over every gateway; None while Redis does not answer."""
        try:
            return int(await self.store.call(self.store.in_flight(keys=[self.keys(tenant).leases])))
        except UNAVAILABLE as exc:
            self._went_down(exc)
            return None

    def metrics(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "kvgate_shared_state_up",
            "1 while the shared-state Redis answers, 0 while limits are local.",
            1 if self.up else 0,
        )
        yield GaugeMetricFamily(
            "kvgate_shared_state_leases", "Concurrency leases this gateway holds in Redis.", self.leases
        )
        unavailable = CounterMetricFamily(
            "kvgate_shared_state_unavailable_admissions",
            "Requests of capped tenants decided without Redis, by action (local or reject).",
            labels=["action"],
        )
        for action, count in self.unavailable_admissions.items():
            unavailable.add_metric([action], count)
        yield unavailable
        yield CounterMetricFamily("kvgate_shared_state_errors", "Redis calls that failed or timed out.", self.errors)

    @property
    def _lease_ms(self) -> int:
        return round(self.config.lease_s * 1000)

    def _without_redis(self, tenant: "Tenant", tokens: int) -> Reservation:
        action = self.config.on_unavailable
        self.unavailable_admissions[action] += 1
        if action == "reject":
            raise OpenAIError(
                503,
                "The gateway cannot reach its shared limits store right now; retry shortly.",
                type_="service_unavailable",
                code="shared_state_unavailable",
                headers={"Retry-After": "1"},
            )
        return self.local.reserve_now(tenant, tokens)

    def _went_down(self, exc: BaseException) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        if self.up:
            self.up = False
            action = "this gateway's own counts" if self.config.on_unavailable == "local" else "503 for capped tenants"
            log.warning(
                "shared state at %s unavailable (%s: %s): limits fall back to %s until it answers",
                redacted(self.config.redis_url),
                type(exc).__name__,
                exc,
                action,
            )

    async def _maintain(self) -> None:
        """Renew this gateway's leases while Redis answers; probe it every second while it does not."""
        interval = min(self.config.lease_s / 3, PROBE_INTERVAL_S)
        while True:
            await asyncio.sleep(interval)
            try:
                if self.up:
                    await self._renew_all()
                else:
                    await self.store.ping()
                    await self._settle_unsettled()
                    self.up = True
                    log.warning("shared state at %s answers again: limits are global", redacted(self.config.redis_url))
            except UNAVAILABLE as exc:
                self._went_down(exc)
                self.store.reopen()

    async def _renew_all(self) -> None:
        """Renew every lease this gateway holds; without any, a ping keeps ``up`` true to the facts."""
        leases = list(self._leases.values())
        if not leases:
            await self.store.ping()
        for start in range(0, len(leases), RENEW_BATCH):
            batch = leases[start : start + RENEW_BATCH]
            keys = [lease.keys.leases for lease in batch]
            await self.store.call(
                self.store.renew(keys=keys, args=[self._lease_ms, *(lease.lease_id for lease in batch)])
            )


def _bucket_keys(keys: TenantKeys) -> list[str]:
    return [keys.leases, keys.tokens, keys.requests]


def redacted(url: str) -> str:
    """The URL without its credentials, for logs."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"
