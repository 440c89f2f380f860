"""Tenant caps counted in this gateway's memory: the embedded default, and the fallback while Redis is away."""

from typing import TYPE_CHECKING

from gateway.admission.limiter import (
    Reservation,
    TenantLimiter,
    concurrency_exceeded,
    requests_exceeded,
    tokens_exceeded,
)

if TYPE_CHECKING:
    from gateway.admission.tenants import Tenant


class LocalLimiter(TenantLimiter):
    """Counts in each tenant's ``TenantUsage`` (kept across reloads); nothing to await, nothing to lose."""

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def reserve(self, tenant: "Tenant", tokens: int) -> Reservation:
        return self.reserve_now(tenant, tokens)

    async def settle(self, reservation: Reservation, unused_tokens: int) -> None:
        self.settle_now(reservation, unused_tokens)

    def reserve_now(self, tenant: "Tenant", tokens: int) -> Reservation:
        config, usage = tenant.config, tenant.usage
        limit = config.max_concurrency if config else None
        if limit is not None and usage.in_flight >= limit:
            raise concurrency_exceeded(tenant.name, usage.in_flight, limit)
        tokens_wait = usage.tokens.wait_s(tokens) if usage.tokens else 0.0
        if usage.tokens and tokens_wait > 0:
            raise tokens_exceeded(tenant.name, usage.tokens.per_minute, tokens, tokens_wait)
        requests_wait = usage.requests.wait_s(1) if usage.requests else 0.0
        if usage.requests and requests_wait > 0:
            raise requests_exceeded(tenant.name, usage.requests.per_minute, requests_wait)
        if usage.tokens:
            usage.tokens.take(tokens)
        if usage.requests:
            usage.requests.take(1)
        usage.in_flight += 1
        return Reservation(tenant, tokens)

    def settle_now(self, reservation: Reservation, unused_tokens: int) -> None:
        usage = reservation.tenant.usage
        usage.in_flight -= 1
        if usage.tokens is not None and unused_tokens > 0:
            usage.tokens.give_back(unused_tokens)
