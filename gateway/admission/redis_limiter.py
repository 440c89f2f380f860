"""Tenant caps counted in one Redis shared by every gateway: concurrency leases and per-minute buckets.

Each request's slot is a lease (a member of the tenant's ``leases`` set) that expires
``lease_s`` after its gateway last renewed it; a background task renews this gateway's leases
about three times per ``lease_s`` while the requests are in flight, so the slots of a gateway
killed with SIGKILL come back within ``lease_s``. Each check-and-take is one Lua script
(``redis_scripts.py``), so gateways never race each other past a cap.

Redis unreachable (a call fails or exceeds ``timeout_s``): one log line, ``kvgate_shared_state_up``
drops to 0 and requests are admitted on this gateway's own counts (``on_unavailable: local``) or
refused with 503 (``reject``) without calling Redis again. The renewal task wakes at once and
probes it, with a fresh client after each failure, on a backoff of ``PROBE_FIRST_S`` doubling up
to ``PROBE_MAX_S``: a short blip is over in a fraction of a second, a dead Redis gets one ping a
second, and a Redis that returns is seen within about a second. Once it answers, the leases
settled meanwhile are freed in batches (a round trip per ``RENEW_BATCH``, not per lease) and
limits are global again. A request never waits on Redis longer than ``2 x timeout_s`` (see
``redis_store.py``).
"""

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway.admission.config import SharedStateConfig
from gateway.admission.limiter import (
    Slot,
    TenantLimiter,
    Tokens,
    concurrency_exceeded,
    requests_exceeded,
    tokens_exceeded,
)
from gateway.admission.local_limiter import LocalLimiter
from gateway.admission.redis_store import UNAVAILABLE, RedisStore
from gateway.admission.tenant_counters import TenantCounters
from gateway.errors import OpenAIError

log = logging.getLogger("kvgate.shared_state")

Held = TypeVar("Held", Slot, Tokens)

PROBE_FIRST_S = 0.05
"""The first probe after Redis is seen gone; each failed probe doubles the wait, up to PROBE_MAX_S."""
PROBE_MAX_S = 1.0
RENEW_MAX_S = 1.0
"""Leases are renewed about three times per lease_s, and at least this often (a liveness check)."""
RENEW_BATCH = 256
"""Leases renewed or freed per script call (Lua's argument stack is bounded)."""
MAX_UNSETTLED = 10_000
"""Leases remembered for settling once Redis is back; beyond that the oldest are left to expire."""


@dataclass
class Lease(Slot):
    """A slot held in Redis: its lease id and the tenant's keys."""

    lease_id: str
    keys: "TenantKeys"


@dataclass
class SharedTokens(Tokens):
    """Tokens taken from the tenant's bucket in Redis (not from this gateway's)."""

    key: str
    per_minute: int


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
        self._to_free: dict[str, Lease] = {}
        """Leases to free when Redis answers again: of requests that ended while it was away, and of
        takes whose answer never came (the script may still have run)."""
        self._maintainer: asyncio.Task | None = None
        self._gone = asyncio.Event()
        """Set while Redis is seen gone: wakes the maintainer to start probing at once."""

    @property
    def leases(self) -> int:
        """Leases this gateway holds in Redis now."""
        return len(self._leases)

    @property
    def unsettled(self) -> int:
        """Leases of this gateway waiting for Redis to answer again to be freed."""
        return len(self._to_free)

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

    async def take_slot(self, tenant: TenantCounters) -> Slot:
        config = tenant.config
        if config is None or (config.max_concurrency is None and config.requests_per_minute is None):
            return self.local.take_slot_now(tenant)
        if not self.up:
            return self._without_redis(lambda: self.local.take_slot_now(tenant))
        lease = Lease(tenant, f"{self.instance}:{next(self._sequence)}", self.keys(tenant.name))
        args: list[str | int] = [
            lease.lease_id,
            self._lease_ms,
            config.max_concurrency or 0,
            config.requests_per_minute or 0,
        ]
        try:
            verdict, detail = await self.store.call(
                self.store.take_slot(keys=[lease.keys.leases, lease.keys.requests], args=args)
            )
        except UNAVAILABLE as exc:
            self._went_down(exc)
            self._free_later(lease)
            return self._without_redis(lambda: self.local.take_slot_now(tenant))
        if verdict == 1:
            raise concurrency_exceeded(tenant.name, detail, config.max_concurrency or 0)
        if verdict == 3:
            raise requests_exceeded(tenant.name, config.requests_per_minute or 0, detail / 1000)
        tenant.usage.in_flight += 1
        self._leases[lease.lease_id] = lease
        return lease

    async def free_slot(self, slot: Slot) -> None:
        if not isinstance(slot, Lease):
            self.local.free_slot_now(slot)
            return
        slot.tenant.usage.in_flight -= 1
        self._leases.pop(slot.lease_id, None)
        if not self.up:
            self._free_later(slot)
            return
        try:
            await self._free_in_redis(slot)
        except UNAVAILABLE as exc:
            self._went_down(exc)
            self._free_later(slot)

    async def take_tokens(self, tenant: TenantCounters, tokens: int) -> Tokens:
        per_minute = tenant.config.tokens_per_minute if tenant.config else None
        if per_minute is None:
            return Tokens(tenant, tokens)
        if not self.up:
            return self._without_redis(lambda: self.local.take_tokens_now(tenant, tokens))
        taken = SharedTokens(tenant, tokens, self.keys(tenant.name).tokens, per_minute)
        try:
            verdict, wait_ms = await self.store.call(
                self.store.take_tokens(keys=[taken.key], args=[tokens, per_minute])
            )
        except UNAVAILABLE as exc:
            self._went_down(exc)
            return self._without_redis(lambda: self.local.take_tokens_now(tenant, tokens))
        if verdict == 2:
            raise tokens_exceeded(tenant.name, per_minute, tokens, wait_ms / 1000)
        return taken

    async def give_back(self, taken: Tokens, unused: int) -> None:
        """Unused tokens go back where they were taken (negative: the excess is charged there); while
        Redis is away, neither happens: Redis's tokens stay spent, an excess is not charged."""
        if not isinstance(taken, SharedTokens):
            self.local.give_back_now(taken, unused)
            return
        if not self.up:
            return
        try:
            await self.store.call(self.store.give_back(keys=[taken.key], args=[unused, taken.per_minute]))
        except UNAVAILABLE as exc:
            self._went_down(exc)

    async def _free_in_redis(self, lease: Lease) -> None:
        await self.store.call(self.store.free_slot(keys=[lease.keys.leases], args=[lease.lease_id]))

    def _free_later(self, lease: Lease) -> None:
        self._to_free[lease.lease_id] = lease
        if len(self._to_free) > MAX_UNSETTLED:
            del self._to_free[next(iter(self._to_free))]

    async def _free_pending(self) -> None:
        """Free what ended while Redis was away, so its slots come back at once rather than at expiry."""
        pending = list(self._to_free.values())
        for start in range(0, len(pending), RENEW_BATCH):
            batch = pending[start : start + RENEW_BATCH]
            keys = [lease.keys.leases for lease in batch]
            await self.store.call(self.store.free_slot(keys=keys, args=[lease.lease_id for lease in batch]))
            for lease in batch:
                del self._to_free[lease.lease_id]

    async def shared_status(self, tenants: Sequence[TenantCounters]) -> dict[str, object] | None:
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

    def _without_redis(self, local: Callable[[], Held]) -> Held:
        """What ``on_unavailable`` says: ``local()``, this gateway's own count, or 503."""
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
        return local()

    def _went_down(self, exc: BaseException) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        if self.up:
            self.up = False
            self._gone.set()
            action = "this gateway's own counts" if self.config.on_unavailable == "local" else "503 for capped tenants"
            log.warning(
                "shared state at %s unavailable (%s: %s): limits fall back to %s until it answers",
                redacted(self.config.redis_url),
                type(exc).__name__,
                exc,
                action,
            )

    async def _maintain(self) -> None:
        """Renew this gateway's leases while Redis answers; probe it while it does not."""
        renew_every = min(self.config.lease_s / 3, RENEW_MAX_S)
        while True:
            if self.up:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(renew_every):
                        await self._gone.wait()
                # A request may have marked Redis down during the wait.
                if self.up:
                    try:
                        await self._renew_all()
                    except UNAVAILABLE as exc:
                        self._went_down(exc)
                        self.store.reopen()
            else:
                await self._recover()

    async def _recover(self) -> None:
        """Probe Redis on a backoff (``probe_delays``) until it answers and the leases settled
        meanwhile are freed; then limits are global again."""
        for delay in probe_delays():
            await asyncio.sleep(delay)
            try:
                await self.store.ping()
                await self._free_pending()
            except UNAVAILABLE as exc:
                self._went_down(exc)
                self.store.reopen()
                continue
            self.up = True
            self._gone.clear()
            log.warning("shared state at %s answers again: limits are global", redacted(self.config.redis_url))
            return

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


def probe_delays() -> Iterator[float]:
    """Waits before each probe of a Redis seen gone: PROBE_FIRST_S, doubling, then PROBE_MAX_S for ever."""
    delay = PROBE_FIRST_S
    while True:
        yield delay
        delay = min(delay * 2, PROBE_MAX_S)


def redacted(url: str) -> str:
    """The URL without its credentials, for logs."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"
