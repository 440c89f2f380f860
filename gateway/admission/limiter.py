"""Where a tenant's caps are counted: one interface, in this process or in Redis shared by every gateway.

A request reserves one concurrency slot, one request of ``requests_per_minute`` and
``prompt + max_tokens`` tokens of ``tokens_per_minute`` up front, all or nothing (429 otherwise);
when it ends it settles: the slot is freed and the tokens it did not use (``charge.used``) go back.
The dispatcher sees only ``TenantLimiter.admit``; which implementation counts is the config's
choice (``shared_state``), made once in the gateway's composition root.
"""

import math
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gateway.errors import OpenAIError, too_many_requests

if TYPE_CHECKING:
    from gateway.admission.tenants import Tenant


@dataclass
class TokenCharge:
    """Tokens taken from a tenant's budget for one request; what it did not use goes back when it ends."""

    taken: int
    used: int = 0
    """Set once the request has been answered; a request that failed or never ran used nothing."""


@dataclass
class Reservation:
    """What one admitted request holds; each limiter keeps what it needs to settle it."""

    tenant: "Tenant"
    tokens: int


class TenantLimiter(ABC):
    @asynccontextmanager
    async def admit(self, tenant: "Tenant", tokens: int) -> AsyncIterator[TokenCharge]:
        """Hold one of the tenant's slots, one request and ``tokens`` of its budget, or raise 429/503."""
        reservation = await self.reserve(tenant, tokens)
        charge = TokenCharge(tokens)
        try:
            yield charge
        finally:
            await self.settle(reservation, max(tokens - charge.used, 0))

    @abstractmethod
    async def reserve(self, tenant: "Tenant", tokens: int) -> Reservation:
        """Take everything the request needs at once, or nothing and raise an OpenAIError."""

    @abstractmethod
    async def settle(self, reservation: Reservation, unused_tokens: int) -> None:
        """Free the request's slot and give ``unused_tokens`` back; never raises."""

    @abstractmethod
    async def start(self) -> None:
        """Begin background work (lease renewal)."""

    @abstractmethod
    async def stop(self) -> None:
        """End background work and close connections."""

    async def shared_status(self, tenants: list["Tenant"]) -> dict[str, object] | None:
        """What the shared store holds for ``tenants`` (for /admin/backends); None when nothing is shared."""
        return None

    def metrics(self) -> Iterator[Metric]:
        """Gauges and counters of the limiter itself, read at scrape time."""
        return iter(())


class LimiterCollector(Collector):
    """Exposes a limiter's own metrics in the gateway's registry."""

    def __init__(self, limiter: TenantLimiter) -> None:
        self.limiter = limiter

    def collect(self) -> Iterator[Metric]:
        return self.limiter.metrics()


def concurrency_exceeded(tenant: str, in_flight: int, limit: int) -> OpenAIError:
    return too_many_requests(
        f"Tenant '{tenant}' already has {in_flight} requests in flight (limit {limit}).",
        retry_after_s=1,
        code="concurrency_limit_exceeded",
    )


def tokens_exceeded(tenant: str, per_minute: int, tokens: int, wait_s: float) -> OpenAIError:
    return too_many_requests(
        f"Tenant '{tenant}' is over its budget of {per_minute} tokens per minute (this request needs {tokens}).",
        retry_after_s=max(math.ceil(wait_s), 1),
        code="tokens_per_minute_exceeded",
    )


def requests_exceeded(tenant: str, per_minute: int, wait_s: float) -> OpenAIError:
    return too_many_requests(
        f"Tenant '{tenant}' is over its budget of {per_minute} requests per minute.",
        retry_after_s=max(math.ceil(wait_s), 1),
        code="requests_per_minute_exceeded",
    )
