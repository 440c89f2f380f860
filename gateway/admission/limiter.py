"""Where a tenant's caps are counted: one interface, in this process or in Redis shared by every gateway.

A request holds two things, each taken all or nothing (429 otherwise) and given back when done:
- a **slot**: one of the tenant's ``max_concurrency`` concurrent requests, and one request of its
  ``requests_per_minute`` (``hold_slot``, which needs no tokenization, so it can come first);
- a **charge**: ``prompt + max_tokens`` tokens of its ``tokens_per_minute``, reserved up front and
  settled on what it used (``charge.used``, set by the dispatcher) when it ends (``charge``): the
  unused part goes back; a backend that generated past the grant (a non-streamed answer, which
  the gateway cannot cut) has the excess charged too, leaving the bucket in debt.
``admit`` takes both. Callers see only these context managers; which implementation counts is
the config's choice (``shared_state``), made once in the gateway's composition root.
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
    """Set once the request has been answered; a request that failed or never ran used nothing.
    May exceed ``taken`` when a backend generated past the granted max_tokens."""


@dataclass
class Slot:
    """A request's place among its tenant's concurrent requests; each limiter adds what it needs to free it."""

    tenant: "Tenant"


@dataclass
class Tokens:
    """Tokens taken from a tenant's per-minute budget; each limiter adds where they came from."""

    tenant: "Tenant"
    count: int


class TenantLimiter(ABC):
    @asynccontextmanager
    async def admit(self, tenant: "Tenant", tokens: int) -> AsyncIterator[TokenCharge]:
        """A slot and ``tokens`` of the budget, or raise 429/503."""
        async with self.hold_slot(tenant), self.charge(tenant, tokens) as charge:
            yield charge

    @asynccontextmanager
    async def hold_slot(self, tenant: "Tenant") -> AsyncIterator[None]:
        """One of the tenant's concurrent slots and one request of its per-minute budget, or raise 429/503."""
        slot = await self.take_slot(tenant)
        try:
            yield
        finally:
            await self.free_slot(slot)

    @asynccontextmanager
    async def charge(self, tenant: "Tenant", tokens: int) -> AsyncIterator[TokenCharge]:
        """``tokens`` of the tenant's per-minute budget, or raise 429/503; settled on ``charge.used``."""
        taken = await self.take_tokens(tenant, tokens)
        charge = TokenCharge(tokens)
        try:
            yield charge
        finally:
            unused = tokens - charge.used
            if unused != 0:
                await self.give_back(taken, unused)

    @abstractmethod
    async def take_slot(self, tenant: "Tenant") -> Slot:
        """Take a slot (and a request), or nothing and raise an OpenAIError."""

    @abstractmethod
    async def free_slot(self, slot: Slot) -> None:
        """Free the slot; never raises."""

    @abstractmethod
    async def take_tokens(self, tenant: "Tenant", tokens: int) -> Tokens:
        """Take ``tokens`` of the budget, or nothing and raise an OpenAIError."""

    @abstractmethod
    async def give_back(self, taken: Tokens, unused: int) -> None:
        """Return ``unused`` of the tokens taken (negative: take that many more, unchecked); never raises."""

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
