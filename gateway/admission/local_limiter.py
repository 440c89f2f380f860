"""Tenant caps counted in this gateway's memory: the embedded default, and the fallback while Redis is away."""

from gateway.admission.limiter import (
    Slot,
    TenantLimiter,
    Tokens,
    concurrency_exceeded,
    requests_exceeded,
    tokens_exceeded,
)
from gateway.admission.tenant_counters import TenantCounters


class LocalLimiter(TenantLimiter):
    """Counts in each tenant's ``TenantUsage`` (kept across reloads); nothing to await, nothing to lose."""

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def take_slot(self, tenant: TenantCounters) -> Slot:
        return self.take_slot_now(tenant)

    async def free_slot(self, slot: Slot) -> None:
        self.free_slot_now(slot)

    async def take_tokens(self, tenant: TenantCounters, tokens: int) -> Tokens:
        return self.take_tokens_now(tenant, tokens)

    async def give_back(self, taken: Tokens, unused: int) -> None:
        self.give_back_now(taken, unused)

    def take_slot_now(self, tenant: TenantCounters) -> Slot:
        config, usage = tenant.config, tenant.usage
        limit = config.max_concurrency if config else None
        if limit is not None and usage.in_flight >= limit:
            raise concurrency_exceeded(tenant.name, usage.in_flight, limit)
        if usage.requests is not None:
            wait_s = usage.requests.try_take(1)
            if wait_s > 0:
                raise requests_exceeded(tenant.name, usage.requests.per_minute, wait_s)
        usage.in_flight += 1
        return Slot(tenant)

    def free_slot_now(self, slot: Slot) -> None:
        slot.tenant.usage.in_flight -= 1

    def take_tokens_now(self, tenant: TenantCounters, tokens: int) -> Tokens:
        bucket = tenant.usage.tokens
        if bucket is not None:
            wait_s = bucket.try_take(tokens)
            if wait_s > 0:
                raise tokens_exceeded(tenant.name, bucket.per_minute, tokens, wait_s)
        return Tokens(tenant, tokens)

    def give_back_now(self, taken: Tokens, unused: int) -> None:
        bucket = taken.tenant.usage.tokens
        if bucket is not None:
            bucket.give_back(unused)
