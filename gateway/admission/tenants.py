"""Tenants: who is calling (by API key), their caps and budgets, and their cache salt."""

import hashlib
import hmac
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field

from aiohttp import web

from gateway.admission.bearer import bearer_token, key_matches, unauthorized
from gateway.admission.config import TenantConfig, TokenCaps
from gateway.admission.limiter import TenantLimiter, TokenCharge
from gateway.admission.local_limiter import LocalLimiter
from gateway.admission.tenant_counters import TenantUsage
from gateway.admission.token_bucket import TokenBucket
from gateway.errors import bad_request

PRIORITY_HEADER = "x-kvgate-priority"
"""The request header that picks an admission class, where the tenant's config allows it."""

NO_CAPS = TokenCaps()
"""The anonymous tenant's caps: one object, so per-request lookups keyed by it hit a cache."""
ANONYMOUS = "anonymous"
"""The one tenant of an open gateway (no `tenants:` configured)."""


@dataclass
class Tenant:
    name: str
    config: TenantConfig | None
    usage: TenantUsage = field(default_factory=TenantUsage)
    limiter: TenantLimiter = field(default_factory=LocalLimiter)

    @property
    def caps(self) -> TokenCaps:
        return self.config.limits if self.config else NO_CAPS

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

    def admit(self, tokens: int) -> AbstractAsyncContextManager[TokenCharge]:
        """Hold one of the tenant's concurrent slots, one request and ``tokens`` of its budget, or raise 429
        (400 for more tokens than the whole budget)."""
        self.check_within_budget(tokens)
        return self.limiter.admit(self, tokens)

    def hold_slot(self) -> AbstractAsyncContextManager[None]:
        """One of the tenant's concurrent slots and one request per minute, or 429 (before any costly work)."""
        return self.limiter.hold_slot(self)

    def charge(self, tokens: int) -> AbstractAsyncContextManager[TokenCharge]:
        """``tokens`` of the tenant's per-minute budget, or 429 (400 for more than the whole budget);
        what the request did not use goes back."""
        self.check_within_budget(tokens)
        return self.limiter.charge(self, tokens)

    def check_within_budget(self, tokens: int) -> None:
        """400 for a request that needs more tokens than the tenant's whole ``tokens_per_minute``.

        Such a request could only run by putting the bucket into debt (one request taking minutes
        of budget), and waiting never makes it fit, so it is a 400, not a 429: clients (the OpenAI
        SDKs among them) retry a 429, and every retry would be refused the same way."""
        per_minute = self.config.tokens_per_minute if self.config else None
        if per_minute is not None and tokens > per_minute:
            raise bad_request(
                f"This request needs up to {tokens} tokens (prompt + max_tokens x n); tenant '{self.name}' "
                f"has a budget of {per_minute} tokens per minute. Reduce max_tokens, n or the prompt.",
                param="max_tokens",
                code="tokens_exceed_budget",
            )

    @property
    def limited(self) -> bool:
        """Whether any of concurrency, tokens or requests per minute is capped."""
        config = self.config
        return config is not None and any(
            cap is not None for cap in (config.max_concurrency, config.tokens_per_minute, config.requests_per_minute)
        )

    def priority(self, headers: Mapping[str, str]) -> int:
        """The request's admission class: the tenant's, or the header's where the config allows it (else 400)."""
        given = headers.get(PRIORITY_HEADER)
        default = self.config.priority if self.config else 0
        if given is None:
            return default
        allowed = self.config.max_header_priority if self.config else None
        if allowed is None:
            raise bad_request(f"Tenant '{self.name}' may not set {PRIORITY_HEADER}.", code="priority_not_allowed")
        try:
            value = int(given)
        except ValueError:
            raise bad_request(f"{PRIORITY_HEADER} must be an integer, not {given!r}.", code="invalid_value") from None
        if value > allowed:
            raise bad_request(
                f"{PRIORITY_HEADER} {value} is above the {allowed} allowed for tenant '{self.name}'.",
                code="priority_not_allowed",
            )
        return value


class TenantRegistry:
    """The configured tenants by key; with none configured, everyone is the anonymous tenant."""

    def __init__(
        self,
        configs: list[TenantConfig],
        previous: "TenantRegistry | None" = None,
        limiter: TenantLimiter | None = None,
    ) -> None:
        """``limiter`` counts every tenant's caps; a reload keeps the previous registry's."""
        names = [config.name for config in configs]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"tenant names must be unique; repeated: {', '.join(repeated)}")
        self.limiter: TenantLimiter = limiter or (previous.limiter if previous else LocalLimiter())
        old = previous.by_name if previous else {}
        self.by_name: dict[str, Tenant] = {
            config.name: _tenant(config, old.get(config.name), self.limiter) for config in configs
        }
        self.anonymous: Tenant = previous.anonymous if previous else Tenant(ANONYMOUS, None, limiter=self.limiter)
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


def _tenant(config: TenantConfig, previous: Tenant | None, limiter: TenantLimiter) -> Tenant:
    usage = previous.usage if previous else TenantUsage()
    usage.tokens = _bucket(config.tokens_per_minute, usage.tokens)
    usage.requests = _bucket(config.requests_per_minute, usage.requests)
    return Tenant(config.name, config, usage, limiter)


def _bucket(per_minute: int | None, current: TokenBucket | None) -> TokenBucket | None:
    """The bucket for ``per_minute``: the current one while its rate stays, none without a rate."""
    if per_minute is None:
        return None
    if current is None or current.per_minute != per_minute:
        return TokenBucket(per_minute)
    return current
