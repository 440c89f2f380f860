"""Tenants: who is calling (by API key), their caps and budgets, and their cache salt."""

import hashlib
import hmac
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from aiohttp import web

from gateway.admission.bearer import bearer_token, key_matches, unauthorized
from gateway.admission.config import TenantConfig, TokenCaps
from gateway.admission.token_bucket import TokenBucket
from gateway.errors import too_many_requests

ANONYMOUS = "anonymous"
"""The one tenant of an open gateway (no `tenants:` configured)."""


@dataclass
class TenantUsage:
    """What a tenant uses right now; kept across config reloads."""

    in_flight: int = 0
    bucket: TokenBucket | None = None


@dataclass
class TokenCharge:
    """Tokens taken from a tenant's budget for one request; what it did not use goes back when it ends."""

    taken: int
    used: int = 0
    """Set once the request has been answered; a request that failed or never ran used nothing."""


@dataclass
class Tenant:
    name: str
    config: TenantConfig | None
    usage: TenantUsage = field(default_factory=TenantUsage)

    @property
    def caps(self) -> TokenCaps:
        return self.config.limits if self.config else TokenCaps()

    def cache_salt(self, requested: str | None) -> str | None:
        """The salt for block hashing and the backend: the tenant's own when isolated, else the client's.

        An isolated tenant's salt is derived from its first API key, so nobody without the key
        can name it in their own ``cache_salt``.
        """
        if self.config is None or not self.config.isolate_cache:
            return requested
        key = self.config.api_keys[0].get_secret_value().encode()
        own = hmac.new(key, b"kvgate-cache-salt:" + self.name.encode(), hashlib.sha256).hexdigest()[:32]
        return f"{own}:{requested}" if requested else own

    @contextmanager
    def admit(self, tokens: int) -> Iterator[TokenCharge]:
        """Hold one of the tenant's concurrent slots and ``tokens`` of its budget, or raise 429."""
        limit = self.config.max_concurrency if self.config else None
        if limit is not None and self.usage.in_flight >= limit:
            raise too_many_requests(
                f"Tenant '{self.name}' already has {self.usage.in_flight} requests in flight (limit {limit}).",
                retry_after_s=1,
                code="concurrency_limit_exceeded",
            )
        bucket = self.usage.bucket
        wait_s = bucket.try_take(tokens) if bucket else 0.0
        if wait_s > 0:
            raise too_many_requests(
                f"Tenant '{self.name}' is over its budget of {bucket.per_minute} tokens per minute "
                f"(this request needs {tokens}).",
                retry_after_s=math.ceil(wait_s),
                code="tokens_per_minute_exceeded",
            )
        self.usage.in_flight += 1
        charge = TokenCharge(tokens)
        try:
            yield charge
        finally:
            self.usage.in_flight -= 1
            if bucket is not None and charge.used < tokens:
                bucket.give_back(tokens - charge.used)


class TenantRegistry:
    """The configured tenants by key; with none configured, everyone is the anonymous tenant."""

    def __init__(self, configs: list[TenantConfig], previous: "TenantRegistry | None" = None) -> None:
        names = [config.name for config in configs]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"tenant names must be unique; repeated: {', '.join(repeated)}")
        old = previous.by_name if previous else {}
        self.by_name = {config.name: _tenant(config, old.get(config.name)) for config in configs}
        self.anonymous = previous.anonymous if previous else Tenant(ANONYMOUS, None)
        self._keys = [(key.get_secret_value(), self.by_name[c.name]) for c in configs for key in c.api_keys]
        if len({key for key, _ in self._keys}) < len(self._keys):
            raise ValueError("an API key is listed twice (in one tenant or two)")

    @property
    def open(self) -> bool:
        return not self.by_name

    def authenticate(self, request: web.Request) -> Tenant:
        """The tenant whose API key the request carries (401 otherwise); every key is compared."""
        if self.open:
            return self.anonymous
        given = bearer_token(request)
        if given is None:
            raise unauthorized("You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.")
        found = None
        for key, tenant in self._keys:
            if key_matches(given, key):
                found = tenant
        if found is None:
            raise unauthorized("Incorrect API key provided.")
        return found


def _tenant(config: TenantConfig, previous: Tenant | None) -> Tenant:
    usage = previous.usage if previous else TenantUsage()
    per_minute = config.tokens_per_minute
    if per_minute is None:
        usage.bucket = None
    elif usage.bucket is None or usage.bucket.per_minute != per_minute:
        usage.bucket = TokenBucket(per_minute)
    return Tenant(config.name, config, usage)
