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
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gateway.admission.tenant_counters import TenantCounters
from gateway.errors import OpenAIError, too_many_requests


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

    tenant: TenantCounters


@dataclass
class Tokens:
    """Tokens taken from a tenant's per-minute budget; each limiter adds where they came from."""

    tenant: TenantCounters
    count: int


class TenantLimiter(ABC):
    @asynccontextmanager
    async def admit(self, tenant: TenantCounters, tokens: int) -> AsyncIterator[TokenCharge]:
        """A slot and ``tokens`` of the budget, or raise 429/503."""
        async with self.hold_slot(tenant), self.charge(tenant, tokens) as charge:
            yield charge

    def hold_slot(self, tenant: TenantCounters) -> "SlotHold":
        """One of the tenant's concurrent slots and one request of its per-minute budget, or raise 429/503."""
        return SlotHold(self, tenant)

    def charge(self, tenant: TenantCounters, tokens: int) -> "Charge":
        """``tokens`` of the tenant's per-minute budget, or raise 429/503; settled on ``charge.used``."""
        return Charge(self, tenant, tokens)

    @abstractmethod
    async def take_slot(self, tenant: TenantCounters) -> Slot:
        """Take a slot (and a request), or nothing and raise an OpenAIError."""

    @abstractmethod
    async def free_slot(self, slot: Slot) -> None:
        """Free the slot; never raises."""

    @abstractmethod
    async def take_tokens(self, tenant: TenantCounters, tokens: int) -> Tokens:
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

    async def shared_status(self, tenants: Sequence[TenantCounters]) -> dict[str, object] | None:
        """What the shared store holds for ``tenants`` (for /admin/backends); None when nothing is shared."""
        return None

    def metrics(self) -> Iterator[Metric]:
        """Gauges and counters of the limiter itself, read at scrape time."""
        return iter(())


class SlotHold:
    """``TenantLimiter.hold_slot`` as a plain class: once per request, where a generator-based
    context manager costs several microseconds more."""

    __slots__ = ("_limiter", "_tenant", "_slot")

    def __init__(self, limiter: TenantLimiter, tenant: TenantCounters) -> None:
        self._limiter = limiter
        self._tenant = tenant
        self._slot: Slot | None = None

    async def __aenter__(self) -> None:
        self._slot = await self._limiter.take_slot(self._tenant)

    async def __aexit__(self, *exc_info: object) -> None:
        if self._slot is not None:
            slot, self._slot = self._slot, None
            await self._limiter.free_slot(slot)


class Charge:
    """``TenantLimiter.charge`` as a plain class (see ``SlotHold``)."""

    __slots__ = ("_limiter", "_tenant", "_tokens", "_taken", "_charge")

    def __init__(self, limiter: TenantLimiter, tenant: TenantCounters, tokens: int) -> None:
        self._limiter = limiter
        self._tenant = tenant
        self._tokens = tokens
        self._taken: Tokens | None = None
        self._charge = TokenCharge(tokens)

    async def __aenter__(self) -> TokenCharge:
        self._taken = await self._limiter.take_tokens(self._tenant, self._tokens)
        return self._charge

    async def __aexit__(self, *exc_info: object) -> None:
        if self._taken is None:
            return
        taken, self._taken = self._taken, None
        unused = self._tokens - self._charge.used
        if unused != 0:
            await self._limiter.give_back(taken, unused)


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
