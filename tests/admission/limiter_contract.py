"""What every shared tenant limiter promises, checked through two sets of tenants that share it
(two workers behind the parent process, or two gateways on one Redis): the parent limiter's and
the Redis limiter's tests run the same checks."""

from collections.abc import Callable

import pytest

from gateway.admission.config import TenantConfig
from gateway.admission.tenants import Tenant
from gateway.errors import OpenAIError

TENANTS = [
    TenantConfig(name="capped", api_keys=["k1"], max_concurrency=2),
    TenantConfig(name="metered", api_keys=["k2"], tokens_per_minute=100),
    TenantConfig(name="paced", api_keys=["k3"], requests_per_minute=3, tokens_per_minute=1000),
    TenantConfig(name="open", api_keys=["k4"]),
]

Tenants = dict[str, Tenant]


async def refused(tenant: Tenant, tokens: int = 1) -> OpenAIError:
    with pytest.raises(OpenAIError) as error:
        async with tenant.admit(tokens):
            pass
    return error.value


async def check_concurrency_cap_is_shared(a: Tenants, b: Tenants, holds_two: Callable[[], bool]) -> None:
    """Two requests of ``capped`` (cap 2), one on each side, fill it for both sides (``holds_two``:
    the shared store sees both); the slots come back."""
    async with a["capped"].admit(1), b["capped"].admit(1):
        error = await refused(a["capped"])
        assert error.status == 429 and error.code == "concurrency_limit_exceeded" and "2 requests" in error.message
        assert (await refused(b["capped"])).code == "concurrency_limit_exceeded"
        assert a["capped"].usage.in_flight == 1 and holds_two()
    async with b["capped"].admit(1), a["capped"].admit(1):
        pass


async def check_budgets_are_shared_and_unused_tokens_go_back(a: Tenants, b: Tenants) -> None:
    """Tokens per minute and requests per minute count both sides; a charge's unused tokens return."""
    async with a["metered"].admit(80) as charge:
        charge.used = 30
    async with b["metered"].admit(60) as charge:
        charge.used = 60
    error = await refused(a["metered"], 60)
    assert error.code == "tokens_per_minute_exceeded" and int(error.headers["Retry-After"]) >= 1
    for tenants in (a, b, a):
        async with tenants["paced"].admit(100):
            pass
    error = await refused(b["paced"], 100)
    assert error.code == "requests_per_minute_exceeded" and 1 <= int(error.headers["Retry-After"]) <= 20
    async with a["open"].admit(10**9):
        pass
